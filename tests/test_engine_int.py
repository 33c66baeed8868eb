"""The engine on the integer kernels (the default for quantized weights) against the exact kernels.

Answer-known models (tests/decoding_models.py: token t continues with t + 1), stored in each
quantized type the integer kernels cover: the integer path must give the same top-1 token as the
exact path on every row, and the known answer.
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.decoding import generate_ar
from clover_runtime.loader import load_model
from clover_runtime.synth import SynthSpec
from clover_runtime.text.vocab import small_vocab
from decoding_models import successor_overrides
from synth_models import model_path

pytest.importorskip("numba")


def _successor(quant: str):  # noqa: ANN202
    spec = SynthSpec.small(quant=quant)
    mask = small_vocab().special["mask"]
    return model_path(spec, tensors_override=successor_overrides(spec, mask_id=mask))


@pytest.mark.parametrize("quant", ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q4_K_M"])
def test_integer_kernels_keep_the_top_token(quant: str) -> None:
    path = _successor(quant)
    fast = load_model(path, backend="numba")
    exact = load_model(path, backend="numba", exact_kernels=True)
    assert fast.weights.integer_tensors and not exact.weights.integer_tensors
    assert "output.weight" in fast.weights.integer_tensors
    ids = [int(t) for t in np.random.default_rng(1).integers(10, fast.config.n_tokens - 40, 24)]
    got, want = fast.forward(ids), exact.forward(ids)
    np.testing.assert_array_equal(got.argmax(axis=1), want.argmax(axis=1))
    np.testing.assert_array_equal(want.argmax(axis=1), np.array(ids) + 1)
    prompt = ids[:5]
    assert list(generate_ar(fast, prompt, max_tokens=6)) == [prompt[-1] + i for i in range(1, 7)]


def test_float_weights_keep_the_float_kernels() -> None:
    model = load_model(_successor("F16"), backend="numba")
    assert model.weights.prepared and not model.weights.integer_tensors
