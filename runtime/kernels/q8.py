"""Activations quantized to 8 bits per block, the other operand of the integer kernels.

As llama.cpp's Q8_0 / Q8_K: each row is cut into blocks of `block` values (32 for Q4_0/Q8_0
weights, 256 for the K-quants); a block keeps one float32 scale d = max|x| / 127 and the int8
values rint(x / d). The sums of every 16 quantized values ride along (int16), so the integer
kernels can apply weight offsets and minimums without touching the values twice.
"""

from __future__ import annotations

import numpy as np

from .jit import njit, parallel_pays, prange

SUM_GROUP = 16  # values per entry of the block sums


@njit(inline="always", fastmath={"nnan", "ninf", "nsz"})
def _quantize_block(xs, qs):
    """One block of one row, as 1-D views (the loops over them become vector code): its scale."""
    amax = np.float32(0.0)
    for i in range(xs.shape[0]):
        amax = max(amax, abs(xs[i]))
    scale = amax / np.float32(127.0)
    if scale > 0:
        for i in range(xs.shape[0]):
            qs[i] = np.int8(np.rint(xs[i] / scale))
    else:
        qs[:] = 0
    return scale


@njit(inline="always")
def _quantize_row(x, r, block, q, d, sums):
    n_in = x.shape[1]
    xr = x[r]
    qr = q[r]
    for b in range(n_in // block):
        d[r, b] = _quantize_block(xr[b * block:(b + 1) * block], qr[b * block:(b + 1) * block])
    for g in range(n_in // SUM_GROUP):
        s = 0
        for i in range(g * SUM_GROUP, (g + 1) * SUM_GROUP):
            s += qr[i]
        sums[r, g] = s


@njit(cache=True, nogil=True, parallel=True)
def _quantize_parallel(x, block, q, d, sums):
    for r in prange(x.shape[0]):
        _quantize_row(x, r, block, q, d, sums)


@njit(cache=True, nogil=True)
def _quantize_serial(x, block, q, d, sums):
    for r in range(x.shape[0]):
        _quantize_row(x, r, block, q, d, sums)


class Q8Rows:
    """Rows of activations in 8-bit blocks: values (n, n_in) int8, scales (n, n_in // block)
    float32, sums of 16 (n, n_in // 16) int16."""

    __slots__ = ("block", "q", "d", "sums")

    def __init__(self, x: np.ndarray, block: int) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, n_in = x.shape
        if n_in % block:
            raise ValueError(f"row length {n_in} is not a multiple of the block size {block}")
        self.block = block
        self.q = np.empty((n, n_in), np.int8)
        self.d = np.empty((n, n_in // block), np.float32)
        self.sums = np.empty((n, n_in // SUM_GROUP), np.int16)
        if n:
            fn = _quantize_parallel if parallel_pays(n * n_in) else _quantize_serial
            fn(x, block, self.q, self.d, self.sums)

    def take(self, rows: np.ndarray) -> Q8Rows:
        """The given rows, in that order (rows of a grouped MoE call)."""
        out = Q8Rows.__new__(Q8Rows)
        out.block, out.q, out.d, out.sums = self.block, self.q[rows], self.d[rows], self.sums[rows]
        return out


def quantize_rows(x: np.ndarray, block: int) -> Q8Rows:
    """Quantize each row of x (n, n_in) float32 to 8-bit blocks of `block` values."""
    return Q8Rows(x, block)
