"""The engine's public surface: loading, autoregressive generation, sampling, the lazy import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from clover_runtime.engine import generate_ar, load_model, sample_token
from clover_runtime.errors import CloverError, ModelFileError
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
    kw = dict(max_tokens=10, temperature=1.5, top_k=50, top_p=0.95, min_p=0.01)
    a = list(generate_ar(model, prompt, seed=123, **kw))
    assert a == list(generate_ar(model, prompt, seed=123, **kw))
    others = {tuple(generate_ar(model, prompt, seed=s, **kw)) for s in range(4)}
    assert len(others) > 1


def test_sampling_distribution() -> None:
    """Frequencies match the filtered, tempered softmax computed here step by step."""
    logits = np.array([2.0, 1.2, 1.0, 0.3, -0.5, -3.0, -np.inf], dtype=np.float32)
    temperature, top_k, top_p, min_p = 0.8, 5, 0.93, 0.1
    order = np.argsort(-logits)[:top_k]
    p = np.exp(logits[order] - logits[order][0])
    p /= p.sum()
    keep = order[:np.flatnonzero(np.cumsum(p) >= top_p)[0] + 1]
    p = p[:len(keep)]
    keep = keep[p >= min_p * p[0]]
    want = np.zeros(len(logits))
    want[keep] = np.exp((logits[keep] - logits[keep].max()) / temperature)
    want /= want.sum()
    rng = np.random.default_rng(0)
    n = 20000
    counts = np.bincount([sample_token(logits, rng, temperature=temperature, top_k=top_k, top_p=top_p,
                                       min_p=min_p) for _ in range(n)], minlength=len(logits))
    assert np.all(counts[want == 0] == 0)
    assert np.max(np.abs(counts / n - want)) < 0.015
    assert sample_token(logits, rng) == 0  # temperature 0: greedy
