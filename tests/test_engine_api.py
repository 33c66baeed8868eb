"""The engine's public surface: loading, autoregressive generation, the lazy import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from clover_runtime.decoding import SamplingParams, generate_ar
from clover_runtime.errors import CloverError, ModelFileError
from clover_runtime.loader import load_model
from engine_models import synth_model, token_ids


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = synth_model(tmp_path_factory.mktemp("engine-api"), "Q8_0", preset="tiny")
    return load_model(path, backend="numpy")


def test_import_runtime_is_cheap() -> None:
    code = "import sys, clover_runtime; assert 'numpy' not in sys.modules; assert callable(clover_runtime.load_model)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_errors(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ModelFileError, match="not found"):
        load_model(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        load_model(bad)
    with pytest.raises(CloverError, match="unknown backend"):
        load_model(synth_model(tmp_path, "F32", preset="tiny"), backend="cuda")


def test_greedy_generation_is_argmax_of_forward(model) -> None:  # noqa: ANN001
    prompt = token_ids(7, model.config.n_tokens, seed=4)
    out = list(generate_ar(model, prompt, max_tokens=6))
    assert len(out) == 6
    seq = list(prompt)
    for tok in out:  # each generated token is the argmax after the sequence so far (one full forward)
        assert tok == int(np.argmax(model.forward(seq)[-1]))
        seq.append(tok)


def test_stop_ids_and_context_limit(model) -> None:  # noqa: ANN001
    prompt = token_ids(5, model.config.n_tokens, seed=6)
    full = list(generate_ar(model, prompt, max_tokens=8))
    stop = full[3]
    first = full.index(stop)
    assert list(generate_ar(model, prompt, max_tokens=8, stop_ids=[stop])) == full[:first]
    state = model.new_state(len(prompt) + 3)
    assert list(generate_ar(model, prompt, max_tokens=8, state=state)) == full[:4]  # 3 fed back + 1
    with pytest.raises(CloverError, match="empty prompt"):
        next(generate_ar(model, [], max_tokens=3))


def test_seeded_sampling_is_reproducible(model) -> None:  # noqa: ANN001
    prompt = token_ids(5, model.config.n_tokens, seed=8)

    def sampled(seed: int) -> list[int]:
        sp = SamplingParams(temperature=1.5, top_k=50, top_p=0.95, min_p=0.01, seed=seed)
        return list(generate_ar(model, prompt, max_tokens=10, sampling=sp))

    assert sampled(123) == sampled(123)
    assert len({tuple(sampled(s)) for s in range(4)}) > 1
