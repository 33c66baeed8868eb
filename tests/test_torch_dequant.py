"""The torch backend's on-device decoders against gguf-py's dequantization (the oracle), for every
type clover computes with: realistic blocks from clover's encoder, and blocks whose quant and
scale bytes are random (every bit pattern of the packed fields), on the CPU device."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from clover_runtime.quants import SUPPORTED_TYPES, block_size, quantize, type_name, type_size  # noqa: E402
from clover_runtime.quants.formats import BF16, F16, F32, Q4_1, Q4_K, Q5_1, Q5_K, Q6_K  # noqa: E402
from clover_runtime.torch_backend.dequant import dequantize_blocks  # noqa: E402
from gguf import quants as gq  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

# byte offsets of each type's fp16 fields (d, and dmin or m where there is one)
F16_FIELDS = {Q4_1: (0, 2), Q5_1: (0, 2), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,)}
FLOAT_TYPES = (F32, F16, BF16)


def _oracle(raw: np.ndarray, t: int) -> np.ndarray:
    return np.asarray(gq.dequantize(raw, GGMLQuantizationType(t)), dtype=np.float32)


def _blocks(t: int, rows: int, cols: int, seed: int, scramble: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), t).reshape(-1, type_size(t))
    if scramble and t not in FLOAT_TYPES:
        keep = np.zeros(type_size(t), dtype=bool)
        for start in F16_FIELDS.get(t, (0,)):
            keep[start:start + 2] = True
        noise = rng.integers(0, 256, raw.shape, dtype=np.uint8)
        raw = np.where(keep, raw, noise).astype(np.uint8)
    return raw


@pytest.mark.parametrize("scramble", [False, True], ids=["encoded", "random-bits"])
@pytest.mark.parametrize("t", sorted(SUPPORTED_TYPES), ids=type_name)
def test_device_decoder_equals_gguf(t: int, scramble: bool) -> None:
    raw = _blocks(t, 6, 512, seed=t, scramble=scramble)
    got = dequantize_blocks(torch.from_numpy(raw), t).numpy()
    assert got.shape == (raw.shape[0], block_size(t))
    want = _oracle(raw.reshape(6, -1), t).reshape(got.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))


def test_half_precision_output_is_the_rounded_float32() -> None:
    raw = _blocks(Q4_K, 4, 256, seed=1, scramble=True)
    full = dequantize_blocks(torch.from_numpy(raw), Q4_K)
    half = dequantize_blocks(torch.from_numpy(raw), Q4_K, torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, full.half())
