"""The engine against the slow reference (tests/engine_reference.py), quant type by quant type.

Every quant type runs twice: a model from the synthetic generator with split tensors, and a
model from the transformers-style converter with fused `attn_qkv` / `ffn_gate_up_exps`; the tied
LM head alternates. The numpy backend runs each sequence in one call, the numba backend (its exact
float kernels; the integer ones have test_kernels_int / test_engine_int) in several calls, both
with a small prefill chunk so that calls cross chunk boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.loader import load_model
from engine_models import assert_logits_close, oracle_model, synth_model, token_ids
from engine_reference import Reference
from hf_oracle import ALL_QUANTS

N_TOKENS = 36
PIECES = [(0, 13), (13, 14), (14, 36)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    root = tmp_path_factory.mktemp("engine-ref")

    def get(source: str, quant: str, tied: bool):  # noqa: ANN202
        if source == "synth":
            return synth_model(root, quant, tied_output=tied)
        return oracle_model(root, quant, fused=True, tied=tied)

    return get


def _check(path, chunk: int = 16) -> None:  # noqa: ANN001
    numpy_model = load_model(path, backend="numpy")
    ids = token_ids(N_TOKENS, numpy_model.config.n_tokens, seed=3)
    want = Reference(path).forward(ids)
    numpy_model.prefill_chunk = chunk
    assert_logits_close(numpy_model.forward(ids), want)
    numba_model = load_model(path, backend="numba", exact_kernels=True)
    numba_model.prefill_chunk = chunk
    state = numba_model.new_state(64)
    got = np.concatenate([numba_model.forward(ids[a:b], state=state) for a, b in PIECES])
    assert state.n_past == N_TOKENS
    assert_logits_close(got, want)


@pytest.mark.parametrize("quant", ALL_QUANTS)
def test_split_tensors_match_reference(models, quant: str) -> None:  # noqa: ANN001
    _check(models("synth", quant, tied=ALL_QUANTS.index(quant) % 2 == 0))


@pytest.mark.parametrize("quant", ALL_QUANTS)
def test_fused_tensors_match_reference(models, quant: str) -> None:  # noqa: ANN001
    _check(models("oracle", quant, tied=ALL_QUANTS.index(quant) % 2 == 1))


def test_long_sequence_crosses_default_chunk(models) -> None:  # noqa: ANN001
    """300 tokens with the default 256-token prefill chunk; numpy in three calls, numba in one."""
    path = models("synth", "Q4_K_M", tied=False)
    ids = token_ids(300, load_model(path, backend="numpy").config.n_tokens, seed=5)
    want = Reference(path).forward(ids)
    numba_model = load_model(path, backend="numba", exact_kernels=True)
    assert numba_model.prefill_chunk == 256
    assert_logits_close(numba_model.forward(ids), want)
    numpy_model = load_model(path, backend="numpy")
    state = numpy_model.new_state()
    got = [numpy_model.forward(ids[a:b], state=state) for a, b in [(0, 100), (100, 101), (101, 300)]]
    assert_logits_close(np.concatenate(got), want)
    assert_logits_close(numba_model.forward(ids, last_only=True), want[-1:])


@pytest.mark.parametrize("source", ["synth", "oracle"])
def test_preview_matches_reference(tmp_path, source: str) -> None:  # noqa: ANN001
    """Preview over a block after a committed prefix: causal and clover GDN operators, coreset."""
    if source == "synth":
        path = synth_model(tmp_path, "Q8_0", preset="tiny")
    else:
        path = oracle_model(tmp_path, "F32", clover=True)
    model = load_model(path, backend="numpy")
    ref = Reference(path)
    ids = token_ids(30, model.config.n_tokens, seed=9)
    prefix, block = ids[:22], ids[22:]
    state = model.new_state(64)
    model.forward(prefix, state=state)
    assert model.has_clover_tensors
    for mode, coreset in [("causal", None), ("clover", None), ("causal", 3), ("clover", 2)]:
        want = ref.preview(prefix, block, gdn=mode, coreset=coreset)
        result = model.preview(block, state, gdn_preview=mode, expert_coreset=coreset)
        assert result.gdn_preview == mode
        assert_logits_close(result.logits, want)
        assert len(result.experts_per_layer) == model.config.n_layer
        if coreset is not None:
            assert max(result.experts_per_layer) <= coreset
        rows = [1, 5, 7]
        part = model.preview(block, state, gdn_preview=mode, expert_coreset=coreset, logit_rows=rows)
        assert_logits_close(part.logits, want[rows])
    assert model.preview(block, state).gdn_preview == "clover"  # auto picks the vendor operator
