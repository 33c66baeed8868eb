"""`Model.cut` keeps the first n rows of a causal pass (issue 34): a verified commit that AR cut
leaves the state holding the kept tokens, so the next commit runs only the new rows. The state it
leaves must be the one a pass of those n rows alone leaves: bit for bit with quantized weights,
whose kernels round a row alike in any batch (so diffusion writes AR's text exactly), and to
float32 round-off with F32 weights, whose BLAS products sum in a batch's own order."""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime import load_model
from synth_models import small_model_path, tiny_model_path

PREFIX = list(range(100, 160))  # 60 tokens: the block crosses an aligned position, as in decoding
BLOCK = list(range(200, 232))


@pytest.fixture(scope="module", params=["F32", "Q4_K"])
def model(request):  # noqa: ANN001, ANN201
    path = tiny_model_path("F32") if request.param == "F32" else small_model_path("Q4_K")
    return load_model(path, n_threads=1)


def _same(a: np.ndarray, b: np.ndarray, exact: bool) -> bool:
    return bool(np.array_equal(a, b)) if exact else bool(np.allclose(a, b, rtol=1e-5, atol=1e-5))


def _gdn(state, model):  # noqa: ANN001, ANN202
    return {i: tuple(np.array(a) for a in state.gdn(i)) for i in model.config.gdn_layers}


@pytest.mark.parametrize("n", [0, 1, 3, 9, 31, 32])
def test_a_cut_pass_leaves_the_state_a_pass_of_its_first_rows_leaves(model, n: int) -> None:  # noqa: ANN001
    start = model.new_state(256)
    model.forward(PREFIX, start, last_only=True)
    alone = start.copy()
    if n:
        model.forward(BLOCK[:n], alone)
    exact = "F32" not in str(model.file.path)
    state = start.copy()
    snapshot = state.copy()
    rows = model.forward_rows(BLOCK, state, cuttable=True)
    if n:
        assert _same(rows[n - 1], model.forward(BLOCK[:n], start.copy())[n - 1], exact)
    assert model.cut(state, snapshot, rows, n)
    assert state.n_past == alone.n_past == len(PREFIX) + n
    ours, theirs = _gdn(state, model), _gdn(alone, model)
    for i in model.config.gdn_layers:
        assert _same(ours[i][0], theirs[i][0], exact) and _same(ours[i][1], theirs[i][1], exact), i
    follow = [5, 77, 300]  # attention reads the kept K/V rows, GDN the replayed state
    assert _same(model.forward(follow, state), model.forward(follow, alone), exact)


def test_a_pass_that_did_not_record_its_mixers_is_not_cut(model) -> None:  # noqa: ANN001
    state = model.new_state(256)
    model.forward(PREFIX, state, last_only=True)
    snapshot = state.copy()
    rows = model.forward_rows(BLOCK, state)
    assert not model.cut(state, snapshot, rows, 4) and state.n_past == len(PREFIX) + len(BLOCK)


def test_the_reference_backend_has_no_recorded_mixers_and_is_not_cut() -> None:
    model = load_model(tiny_model_path("F32"), backend="numpy")
    state = model.new_state(256)
    model.forward(PREFIX, state, last_only=True)
    snapshot = state.copy()
    rows = model.forward_rows(BLOCK, state, cuttable=True)
    assert not model.cut(state, snapshot, rows, 4)
