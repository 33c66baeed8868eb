"""The compiled GDN input side (`kernels.gdn_inputs.conv_heads`: causal conv over [ring; u], a
preview's look-ahead taps, SiLU, q/k L2 norms, v) against a float64 reference written from the
model document's formulas, serially and split across two threads, and the new conv ring."""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.kernels import jit
from clover_runtime.kernels.gdn_inputs import causal_conv, conv_heads


def _reference(u: np.ndarray, ring: np.ndarray, taps: np.ndarray, nk: int, dk: int, nv: int,
               right: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """x_t = Σ_j taps[:, j] · [ring; u]_{t+j} (+ Σ_j right[:, j-1] · u_{t+j}), SiLU, then per head
    q = x / ‖x‖ / sqrt(dk), k = x / ‖x‖ (eps 1e-6 under the root), v the rest; float64."""
    u64, r64, t64 = (a.astype(np.float64) for a in (u, ring, taps))
    n, C = u.shape
    K = taps.shape[1]
    xx = np.concatenate([r64, u64])
    x = np.zeros((n, C))
    for t in range(n):
        for j in range(K):
            x[t] += xx[t + j] * t64[:, j]
        for j in range(1, 0 if right is None else right.shape[1] + 1):
            if t + j < n:
                x[t] += u64[t + j] * right[:, j - 1].astype(np.float64)
    x = x / (1 + np.exp(-x))
    q = x[:, :nk * dk].reshape(n, nk, dk)
    k = x[:, nk * dk:2 * nk * dk].reshape(n, nk, dk)
    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
    v = x[:, 2 * nk * dk:].reshape(n, nv, -1)
    return q, k, v, xx[-(K - 1):]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 32, 300])
@pytest.mark.parametrize("look_ahead", [False, True])
def test_conv_heads_matches_the_formulas(n: int, threads: int, look_ahead: bool) -> None:
    rng = np.random.default_rng(n + 7 * threads + look_ahead)
    nk, dk, nv, dv, K = 2, 32, 4, 24, 4
    C = 2 * nk * dk + nv * dv
    u = rng.standard_normal((n, C)).astype(np.float32) * 2
    ring = rng.standard_normal((K - 1, C)).astype(np.float32)
    taps = rng.standard_normal((C, K)).astype(np.float32) * 0.5
    right = rng.standard_normal((C, 3)).astype(np.float32) * 0.5 if look_ahead else None
    before = jit.current_threads()
    jit.set_threads(threads)
    try:  # 300 rows at two threads take the parallel form (67,200 values), the rest the serial one
        q, k, v, new_ring = conv_heads(u, ring, taps, nk, dk, nv, right)
    finally:
        jit.set_threads(before)
    want = _reference(u, ring, taps, nk, dk, nv, right)
    for got, ref in zip((q, k, v), want[:3], strict=True):
        assert got.dtype == np.float32 and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(new_ring, want[3].astype(np.float32))


def test_conv_heads_refuses_inconsistent_shapes() -> None:
    u = np.zeros((4, 10), np.float32)
    with pytest.raises(ValueError):
        conv_heads(u, np.zeros((3, 10), np.float32), np.zeros((10, 4), np.float32), 2, 4, 1)


def _numpy_passes(ring: np.ndarray, u: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """The conv as float32 numpy passes: tap 0's products, then each later tap's products added."""
    n = u.shape[0]
    xx = np.concatenate([ring, u])
    out = xx[:n] * taps[:, 0]
    for j in range(1, taps.shape[1]):
        out = out + xx[j:j + n] * taps[:, j]
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 37, 512])
def test_causal_conv_rounds_as_numpys_passes(n: int, threads: int) -> None:
    """The prefill conv (`causal_conv`, parallel over rows) gives the float32 numpy passes' bits
    (a fused multiply-add would round differently: a prompt's last row must come out as the
    few-row path's neighbours expect, see `engine.gdn.conv_heads`), the float64 formula within
    round-off, and the new ring exactly."""
    rng = np.random.default_rng(n + 11 * threads)
    C, K = 1000, 4
    u = rng.standard_normal((n, C)).astype(np.float32) * 2
    ring = rng.standard_normal((K - 1, C)).astype(np.float32)
    taps = rng.standard_normal((C, K)).astype(np.float32) * 0.5
    before = jit.current_threads()
    jit.set_threads(threads)
    try:
        x, new_ring = causal_conv(ring, u, taps)
    finally:
        jit.set_threads(before)
    np.testing.assert_array_equal(x, _numpy_passes(ring, u, taps))
    xx = np.concatenate([ring, u]).astype(np.float64)
    want = sum(xx[j:j + n] * taps[:, j].astype(np.float64) for j in range(K))
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(new_ring, np.concatenate([ring, u])[-(K - 1):])
    with pytest.raises(ValueError):
        causal_conv(ring[:2], u, taps)
