"""Test models and comparisons shared by the engine tests (tests/test_engine_*.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from clover_runtime.kernels import set_threads
from clover_runtime.loader import load_model
from clover_runtime.synth import SynthSpec, write_model
from hf_oracle import QUANT_SHAPE, TinyShape, clover_tensors, random_weights, to_gguf_tensors, write_gguf
from synth_models import small_model_path


def token_ids(n: int, n_tokens: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_tokens, n)]


def assert_logits_close(got: np.ndarray, want: np.ndarray, rel: float = 1e-4) -> float:
    """Same shape, -inf exactly where `want` has it, max |diff| <= rel * max |want|; returns the ratio."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), "masked (-inf) entries differ"
    assert np.all(got[~finite] == -np.inf)
    ratio = float(np.max(np.abs(got[finite] - want[finite])) / np.max(np.abs(want[finite])))
    assert ratio <= rel, f"relative logit error {ratio:.3g} > {rel:g}"
    return ratio


def oracle_model(directory: Path, quant: str = "F32", *, fused: bool = False, tied: bool = False,
                 clover: bool = False, shape: TinyShape = QUANT_SHAPE, seed: int = 0) -> Path:
    """A GGUF converted from random transformers-named weights (cached by its parameters)."""
    path = directory / f"oracle-{quant}-{'fused' if fused else 'split'}-{int(tied)}{int(clover)}-{seed}.gguf"
    if not path.exists():
        tensors = to_gguf_tensors(random_weights(shape, seed, tied=tied), shape, fused_qkv=fused,
                                  fused_gate_up=fused, tied=tied)
        if clover:
            tensors.update(clover_tensors(shape, seed + 1))
        write_gguf(path, tensors, shape, quant=quant)
    return path


def synth_model(directory: Path, quant: str = "F32", *, preset: str = "small", **overrides: object) -> Path:
    """A model from the project's synthetic generator (cached by its parameters)."""
    key = "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
    path = directory / f"synth-{preset}-{quant}-{key}.gguf"
    if not path.exists():
        write_model(path, SynthSpec.preset(preset, quant=quant, **overrides))
    return path


def one_call_cases(test):
    """The cases a one-call layer test runs: the quant mixes whose layers take it, at one and two
    threads, with the eight-row pass on and off (arguments quant, threads, x8)."""
    test = pytest.mark.parametrize("threads, x8", [(1, "on"), (1, "off"), (2, "on")])(test)
    return pytest.mark.parametrize("quant", ["Q4_K", "Q4_K_M", "Q8_0"])(test)


@contextmanager
def one_call_model(monkeypatch, quant: str, threads: int, x8: str) -> Iterator:
    """A small qwen35moe model read into memory (so its layers have one-call plans), at `threads`
    threads with the eight-row pass on or off (`x8`), weights entered; the thread count is reset
    after. What the one-call layer tests compare with the step-by-step layer."""
    monkeypatch.setenv("CLOVER_X8", x8)
    with load_model(small_model_path(quant, arch="qwen35moe"), n_threads=threads, in_memory=True) as model:
        try:
            model.weights.enter()
            yield model
        finally:
            set_threads(None)


def own_copies(state) -> tuple:
    """Two copies of state with arrays of their own (`copy()` shares them until `prepare_write`):
    one for each path a comparison runs."""
    copies = state.copy(), state.copy()
    for c in copies:
        c.prepare_write()
    return copies
