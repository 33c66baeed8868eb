"""The integer kernels (8-bit activations, integer dot products): the default for Q4_0, Q8_0, Q4_K,
Q5_K and Q6_K weights.

Two checks per type and batch size. (1) Against an independent formulation of the same
arithmetic: activations quantized in numpy (blocks of 32 or 256, d = max|x| / 127, rint(x / d)),
then a float64 product with the dequantized weights: equal to float32 round-off. (2) Against the
exact product, within the documented tolerance: each activation moves by at most half its block's
step d, so |y - y_exact| <= sum over blocks of d/2 * sum |w| in the block (plus round-off).
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.kernels import matmul, moe_matmul
from clover_runtime.kernels.intmatmul import ROW_TILE, activation_block
from clover_runtime.kernels.q8 import quantize_rows
from clover_runtime.quants import dequantize, quantize
from gguf.constants import GGMLQuantizationType as T

INT_TYPES = [T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
ROUNDOFF = 1e-5  # relative to sum |x| |w|, as in test_kernels_matmul


def _n_in(t: int) -> int:
    return 768 if t in (T.Q4_K, T.Q5_K, T.Q6_K) else 352


def _weights(t: int, n_matrices: int, n_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_matrices, n_out, _n_in(t))) * rng.uniform(0.01, 1, (n_matrices, n_out, 1))
    raw = quantize(w.astype(np.float32), t).reshape(-1)
    raw.flags.writeable = False
    return raw, dequantize(raw, t, w.shape).astype(np.float64)


def _activations(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape) * rng.uniform(0.1, 3, shape[:-1] + (1,))
    x[..., 5] *= 40  # an outlier, as real activations have: it sets its block's step
    return x.astype(np.float32)


def _q8_numpy(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(the quantized activations as float64, each element's block step d), written in numpy."""
    xb = x.reshape(x.shape[0], -1, block)
    d = (np.abs(xb).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.rint(xb / d), 0)
    return (q * d).reshape(x.shape).astype(np.float64), np.broadcast_to(d, xb.shape).reshape(x.shape)


def _check(y: np.ndarray, x: np.ndarray, w: np.ndarray, block: int) -> None:
    xq, step = _q8_numpy(x, block)
    scale = np.abs(x) @ np.abs(w).T
    same_arithmetic = xq @ w.T
    assert np.all(np.abs(y - same_arithmetic) <= ROUNDOFF * scale), np.max(np.abs(y - same_arithmetic) / scale)
    bound = (step / 2) @ np.abs(w).T + ROUNDOFF * scale
    err = np.abs(y - x.astype(np.float64) @ w.T)
    assert np.all(err <= bound), np.max(err / bound)


@pytest.mark.parametrize("t", INT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, 7, 20, ROW_TILE + 7])  # 4/2/1-row kernels; more than one row tile
def test_dense_integer_product(t, n):
    raw, w = _weights(t, 1, 40, seed=n)
    x = _activations(np.random.default_rng(100 + n), (n, _n_in(t)))
    y = matmul(raw, t, 40, _n_in(t), x)
    assert y.dtype == np.float32 and y.shape == (n, 40)
    _check(y, x, w[0], activation_block(t))


@pytest.mark.parametrize("t", INT_TYPES, ids=lambda t: t.name)
def test_grouped_moe_integer_product(t):
    n_expert, n_out, n, k = 6, 24, ROW_TILE + 9, 3
    raw, w = _weights(t, n_expert, n_out, seed=5)
    n_in = _n_in(t)
    rng = np.random.default_rng(6)
    # expert 4 meets every row (two row tiles), experts 0-3 about half each, expert 5 none
    ids = np.stack([np.r_[4, rng.choice(4, k - 1, replace=False)] for _ in range(n)])
    x = _activations(rng, (n, n_in))
    xs = _activations(rng, (n, k, n_in))
    y_shared = moe_matmul(raw, t, n_out, n_in, x, ids)
    y_slots = moe_matmul(raw, t, n_out, n_in, xs, ids)
    block = activation_block(t)
    for i in range(n):
        for j in range(k):
            e = ids[i, j]
            _check(y_shared[i, j][None], x[i][None], w[e], block)
            _check(y_slots[i, j][None], xs[i, j][None], w[e], block)


@pytest.mark.parametrize("t", INT_TYPES, ids=lambda t: t.name)
def test_integer_error_is_small_against_exact(t):
    """The typical size of the difference, so a regression to a coarser scheme shows."""
    raw, w = _weights(t, 1, 64, seed=11)
    x = _activations(np.random.default_rng(12), (8, _n_in(t)))
    y = matmul(raw, t, 64, _n_in(t), x)
    exact = matmul(raw, t, 64, _n_in(t), x, exact=True)
    rel = np.abs(y - exact) / (np.abs(x) @ np.abs(w[0]).T)
    # measured: median ~8e-4 (32-blocks) / ~1.1e-3 (256-blocks), max ~6e-3 / ~1.4e-2
    assert np.median(rel) < 2e-3 and np.max(rel) < 3e-2


def test_zero_rows_and_blocks_quantize_to_zero():
    x = np.zeros((2, 512), np.float32)
    x[1, 300] = -2.5
    q = quantize_rows(x, 256)
    assert not q.q[0].any() and not q.d[0].any() and q.q[1, 300] == -127
    assert q.d[1, 1] == np.float32(2.5) / np.float32(127) and q.sums[1, 300 // 16] == -127
    raw, w = _weights(T.Q4_K, 1, 8, seed=1)
    y = matmul(raw, T.Q4_K, 8, 768, np.zeros((1, 768), np.float32))
    assert not y.any()


def test_unsupported_types_and_row_lengths_use_the_float_kernels():
    raw, w = _weights(T.Q4_1, 1, 16, seed=2)  # no integer kernel for Q4_1
    x = _activations(np.random.default_rng(3), (2, 352))
    np.testing.assert_array_equal(matmul(raw, T.Q4_1, 16, 352, x), matmul(raw, T.Q4_1, 16, 352, x, exact=True))
