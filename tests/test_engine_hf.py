"""The engine against transformers' Qwen3_5MoeForCausalLM: an oracle that shares none of our code.

A tiny random model is written to GGUF by the test's own converter (tests/hf_oracle.py: names,
norm + 1, ssm_a = -exp(A_log), tiled value heads), so a mistake shared by the engine and the
slow reference (both written from docs/architecture.md) still shows up here. transformers'
answers for that model are committed in tests/oracle/hf_logits.npz (made by
tests/oracle/regen_hf_logits.py), so these tests need no torch; where torch and transformers are
installed, the last test checks that the committed answers are still transformers' answers.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
from clover_runtime.decoding import generate_ar
from clover_runtime.loader import load_model
from engine_models import oracle_model
from hf_oracle import random_weights

sys.path.insert(0, str(Path(__file__).resolve().parent / "oracle"))
import regen_hf_logits as oracle  # noqa: E402  (the fixture's script: its constants and digest)


@pytest.fixture(scope="module")
def fixture() -> dict[str, np.ndarray]:
    with np.load(oracle.FIXTURE) as f:
        return {k: f[k] for k in f.files}


def test_the_fixture_belongs_to_the_model_the_seed_makes(fixture) -> None:  # noqa: ANN001
    """The committed answers are for these weights and ids: numpy's random stream or `random_weights`
    changing would make them stale (regenerate with tests/oracle/regen_hf_logits.py)."""
    weights = random_weights(oracle.SHAPE, seed=oracle.WEIGHT_SEED)
    assert oracle.weights_digest(weights) == str(fixture["weights_sha256"])
    assert fixture["ids"].tolist() == oracle.fixture_ids()
    assert fixture["logits"].shape == (oracle.N_TOKENS, oracle.SHAPE.vocab)
    assert fixture["greedy"].shape == (oracle.GREEDY_TOKENS,)


def test_the_oracle_gguf_is_byte_for_byte_reproducible(tmp_path) -> None:  # noqa: ANN001
    """The engine reads a GGUF rebuilt on every run: the same seed must write the same bytes."""
    files = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        files.append(oracle_model(tmp_path / name, "F32", shape=oracle.SHAPE, seed=oracle.WEIGHT_SEED))
    assert hashlib.sha256(files[0].read_bytes()).digest() == hashlib.sha256(files[1].read_bytes()).digest()
    other = oracle.weights_digest(random_weights(oracle.SHAPE, seed=oracle.WEIGHT_SEED + 1))
    assert other != oracle.weights_digest(random_weights(oracle.SHAPE, seed=oracle.WEIGHT_SEED))


@pytest.mark.parametrize("fused", [False, True])
def test_logits_match_transformers(tmp_path, fixture, fused: bool) -> None:  # noqa: ANN001
    want = fixture["logits"]
    model = load_model(oracle_model(tmp_path, "F32", fused=fused, shape=oracle.SHAPE), backend="numpy")
    got = model.forward(fixture["ids"].tolist())
    diff = float(np.max(np.abs(got - want)))
    print(f"max |logit diff| vs transformers over {oracle.N_TOKENS} tokens: {diff:.3g}")
    assert diff <= 1e-3
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))


def test_greedy_generation_matches_transformers(tmp_path, fixture) -> None:  # noqa: ANN001
    prompt = fixture["ids"][:oracle.PROMPT_TOKENS].tolist()
    model = load_model(oracle_model(tmp_path, "F32", shape=oracle.SHAPE), backend="numba")
    got = list(generate_ar(model, prompt, max_tokens=oracle.GREEDY_TOKENS))
    assert got == fixture["greedy"].tolist()


def test_the_fixture_is_what_transformers_computes_today(fixture) -> None:  # noqa: ANN001
    """Only where torch and transformers are installed (`pip install -e ".[test,oracle]"`)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    answers = oracle.compute()
    assert np.max(np.abs(answers.logits - fixture["logits"])) <= 1e-5
    assert answers.greedy.tolist() == fixture["greedy"].tolist()
