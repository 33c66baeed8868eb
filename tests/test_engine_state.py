"""Sequence state: feeding in pieces, snapshots and restores, branching, previews, context limits.

Expected logits always come from one uninterrupted forward over the whole sequence from an
empty state, so every check compares two different paths through the engine's state handling.
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.engine import SequenceState
from clover_runtime.errors import CloverError, ContextLengthError
from clover_runtime.loader import load_model
from engine_models import assert_logits_close, synth_model, token_ids


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = synth_model(tmp_path_factory.mktemp("engine-state"), "F32", preset="tiny")
    return load_model(path, backend="numpy")


@pytest.fixture(scope="module")
def ids(model) -> list[int]:  # noqa: ANN001
    return token_ids(60, model.config.n_tokens, seed=2)


def _fresh(model, ids: list[int]) -> np.ndarray:  # noqa: ANN001
    return model.forward(ids)


def _arrays(state: SequenceState) -> dict:
    out = {}
    for i in state._kv.arrays:
        out[("kv", i)] = [a.copy() for a in state.kv(i)]
    for i in state._gdn.arrays:
        out[("gdn", i)] = [a.copy() for a in state.gdn(i)]
    return out


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        all(np.array_equal(x, y) for x, y in zip(a[k], b[k], strict=True)) for k in a)


def test_pieces_equal_one_call(model, ids) -> None:  # noqa: ANN001
    state = model.new_state(64)
    pieces = [(0, 1), (1, 2), (2, 30), (30, 60)]
    got = np.concatenate([model.forward(ids[a:b], state=state) for a, b in pieces])
    assert state.n_past == 60
    assert_logits_close(got, _fresh(model, ids), rel=1e-5)


def test_snapshot_restore_and_retry(model, ids) -> None:  # noqa: ANN001
    state = model.new_state(64)
    model.forward(ids[:20], state=state)
    snap = state.copy()
    first = model.forward(ids[20:30], state=state)
    model.restore(state, snap)
    assert state.n_past == 20
    other = [5, 6, 7, 8]
    got = model.forward(other, state=state)
    assert_logits_close(got, _fresh(model, ids[:20] + other)[20:], rel=1e-5)
    model.restore(state, snap)  # the snapshot is reusable
    again = model.forward(ids[20:30], state=state)
    assert_logits_close(again, first, rel=1e-6)
    assert_logits_close(model.forward(ids[30:40], state=state), _fresh(model, ids[:40])[30:], rel=1e-5)


def test_branches_stay_independent(model, ids) -> None:  # noqa: ANN001
    base = model.new_state(64)
    model.forward(ids[:15], state=base)
    a, b = base.copy(), base.copy()
    model.forward(ids[15:25], state=a)
    model.forward(ids[30:40], state=b)  # writes the same rows as branch a
    got_a = model.forward(ids[25:30], state=a)
    got_b = model.forward(ids[40:45], state=b)
    got_base = model.forward(ids[50:55], state=base)
    assert_logits_close(got_a, _fresh(model, ids[:30])[25:], rel=1e-5)
    assert_logits_close(got_b, _fresh(model, ids[:15] + ids[30:45])[25:], rel=1e-5)
    assert_logits_close(got_base, _fresh(model, ids[:15] + ids[50:55])[15:], rel=1e-5)


def test_restore_older_snapshot_while_newer_one_lives(model, ids) -> None:  # noqa: ANN001
    state = model.new_state(64)
    model.forward(ids[:10], state=state)
    old = state.copy()
    model.forward(ids[10:20], state=state)
    new = state.copy()
    model.restore(state, old)
    model.forward(ids[40:50], state=state)  # rewrites rows 10..19, which `new` still reads
    model.restore(state, new)
    got = model.forward(ids[20:25], state=state)
    assert_logits_close(got, _fresh(model, ids[:25])[20:], rel=1e-5)


def test_assignment_restore_after_dropping_the_original(model, ids) -> None:  # noqa: ANN001
    state = model.new_state(64)
    model.forward(ids[:12], state=state)
    snap = state.copy()
    model.forward(ids[12:20], state=state)
    state = snap  # the usual "roll back" by assignment; the old object is gone
    got = model.forward(ids[30:34], state=state)
    assert_logits_close(got, _fresh(model, ids[:12] + ids[30:34])[12:], rel=1e-5)


def test_preview_leaves_state_untouched(model, ids) -> None:  # noqa: ANN001
    state = model.new_state(64)
    model.forward(ids[:25], state=state)
    before = _arrays(state)
    for mode in ("causal", "clover", "auto"):
        for coreset in (None, 2):
            model.preview(ids[25:33], state, gdn_preview=mode, expert_coreset=coreset, logit_rows=[0, 7])
    assert state.n_past == 25
    assert _same(before, _arrays(state))
    assert_logits_close(model.forward(ids[25:35], state=state), _fresh(model, ids[:35])[25:], rel=1e-5)


def test_commit_returns_last_row(model, ids) -> None:  # noqa: ANN001
    state = model.new_state(64)
    model.forward(ids[:10], state=state)
    last = model.commit(ids[10:18], state)
    assert last.shape == (model.n_vocab,)
    assert state.n_past == 18
    assert_logits_close(last[None], _fresh(model, ids[:18])[-1:], rel=1e-5)


def test_context_length_error(model, ids) -> None:  # noqa: ANN001
    state = model.new_state(8)
    model.forward(ids[:6], state=state)
    with pytest.raises(ContextLengthError) as err:
        model.forward(ids[6:9], state=state)
    assert str(err.value) == "context length exceeded: 9 tokens > n_ctx 8"
    assert isinstance(err.value, CloverError)
    assert (err.value.n_tokens, err.value.n_ctx) == (9, 8)
    assert state.n_past == 6  # nothing was written
    with pytest.raises(ContextLengthError):
        model.preview(ids[:3], state)
    limit = model.config.context_length
    with pytest.raises(ContextLengthError, match=f"{limit + 1} tokens > n_ctx {limit}"):
        model.new_state(limit + 1)
    model.forward(ids[6:8], state=state)  # exactly full is fine
    assert state.remaining == 0


def test_bad_token_ids_and_options(model) -> None:  # noqa: ANN001
    with pytest.raises(CloverError, match="outside the vocabulary"):
        model.forward([1, model.n_vocab])
    with pytest.raises(CloverError, match="gdn_preview"):
        model.preview([1, 2], model.new_state(8), gdn_preview="vendor")
    assert model.forward([]).shape == (0, model.n_vocab)
