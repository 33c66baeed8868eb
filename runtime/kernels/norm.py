"""RMSNorm of float32 rows as one compiled call.

numpy's form (square, mean, add, sqrt, divide, scale) is six passes and six calls; a decode step
makes two a layer plus the head's, ~10 µs each on one thread. The sum of squares is accumulated in
float64 in a fixed vector order for the row's length, so a row normalises to the same bits alone
or in any batch.
"""

from __future__ import annotations

import numpy as np

from .jit import njit, parallel_pays, prange


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum_squares(v):
    s = 0.0
    for i in range(v.shape[0]):
        s += np.float64(v[i]) * np.float64(v[i])
    return s


@njit(inline="always")
def _norm_row(x, r, weight, eps, out):
    d = x.shape[1]
    ms = np.float32(_sum_squares(x[r]) / d)
    denom = np.float32(np.sqrt(ms + eps))
    if weight.shape[0] == d:
        for i in range(d):
            out[r, i] = x[r, i] / denom * weight[i]
    else:
        for i in range(d):
            out[r, i] = x[r, i] / denom


@njit(cache=True, nogil=True)
def _norm_serial(x, weight, eps, out):
    for r in range(x.shape[0]):
        _norm_row(x, r, weight, eps, out)


@njit(cache=True, nogil=True, parallel=True)
def _norm_parallel(x, weight, eps, out):
    for r in prange(x.shape[0]):
        _norm_row(x, r, weight, eps, out)


_NO_WEIGHT = np.zeros(0, np.float32)


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) ⊙ weight over the last axis, as a new float32 array of x's shape."""
    x = np.ascontiguousarray(x, np.float32)
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    out = np.empty_like(rows)
    w = _NO_WEIGHT if weight is None else np.ascontiguousarray(weight, np.float32).reshape(-1)
    if rows.shape[0]:
        (_norm_parallel if parallel_pays(rows.size) else _norm_serial)(rows, w, np.float32(eps), out)
    return out.reshape(x.shape)
