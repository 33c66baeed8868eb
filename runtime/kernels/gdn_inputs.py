"""A Gated DeltaNet layer's input side for many rows in one compiled call: the depthwise causal
conv over [ring; u] (plus a block preview's look-ahead taps), SiLU, and the split into q and k,
L2-normed per head (q also scaled by 1/sqrt(k_dim)), and v.

In numpy these were ~15 passes over (rows x conv_dim) arrays on the calling thread: a 32-row
block preview of the demo spent ~0.1 ms a layer there in call overhead. Here every row is one work
item (its conv, SiLU and norms), split across the kernel threads. Block previews use it; a causal
prefill keeps the numpy passes for now (with this form a 512-row prefill of the real shape ran
6-7 % faster, but its rounding moved a random-weight test model's last prompt row across a
routing tie: see `engine.gdn.conv_heads`), and few rows (a decode step, a commit) keep
`gdn.gdn_mixer`, which rounds as one-row steps must. Checked against a float64 reference of the
formulas (tests/test_kernels_gdn_inputs.py).
"""

from __future__ import annotations

import numpy as np

from .act import silu_inplace
from .jit import njit, parallel_pays, prange

_FM = {"contract", "nsz", "reassoc"}


@njit(inline="always")
def _row(t, u, ring, tk, right, nk, dk, q, k, v, x, e, bits):
    """Row t: conv (tap j reads row t + j of [ring; u]; look-ahead tap j reads u[t + j]), SiLU,
    then the per-head norms into q and k and the copy into v."""
    n, C = u.shape
    K = tk.shape[0]
    R = K - 1
    for j in range(K):
        src = ring[t + j] if t + j < R else u[t + j - R]
        tj = tk[j]
        if j == 0:
            for c in range(C):
                x[c] = src[c] * tj[c]
        else:
            for c in range(C):
                x[c] += src[c] * tj[c]
    for j in range(1, right.shape[0] + 1):
        if t + j < n:
            src = u[t + j]
            rj = right[j - 1]
            for c in range(C):
                x[c] += src[c] * rj[c]
    silu_inplace(x, e, bits)
    inv_sqrt = np.float32(1.0 / np.sqrt(dk))
    for h in range(2 * nk):
        o = h * dk
        ss = np.float32(0.0)
        for i in range(dk):  # a sum in a loop that stores nothing (see gdn._gdn_mixer)
            ss += x[o + i] * x[o + i]
        f = np.float32(1.0) / np.float32(np.sqrt(ss + np.float32(1e-6)))
        if h < nk:
            f *= inv_sqrt
            for i in range(dk):
                q[t, h, i] = x[o + i] * f
        else:
            for i in range(dk):
                k[t, h - nk, i] = x[o + i] * f
    dv = v.shape[2]
    o = 2 * nk * dk
    for h in range(v.shape[1]):
        for i in range(dv):
            v[t, h, i] = x[o + h * dv + i]


@njit(parallel=True, cache=True, fastmath=_FM)
def _inputs_parallel(u, ring, tk, right, nk, dk, q, k, v):
    C = u.shape[1]
    for t in prange(u.shape[0]):
        _row(t, u, ring, tk, right, nk, dk, q, k, v, np.empty(C, np.float32), np.empty(C, np.float32),
             np.empty(C, np.int32))


@njit(cache=True, nogil=True, fastmath=_FM)
def _inputs_serial(u, ring, tk, right, nk, dk, q, k, v):
    C = u.shape[1]
    x = np.empty(C, np.float32)
    e = np.empty(C, np.float32)
    bits = np.empty(C, np.int32)
    for t in range(u.shape[0]):
        _row(t, u, ring, tk, right, nk, dk, q, k, v, x, e, bits)


def conv_heads(u: np.ndarray, ring: np.ndarray, taps: np.ndarray, k_heads: int, k_dim: int, v_heads: int,
               right: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q, k (n, k_heads, k_dim), v (n, v_heads, v_dim) and the new ring from pre-conv rows u
    (n, conv_dim) after `ring` (kernel-1, conv_dim), with taps (conv_dim, kernel): tap kernel-1
    multiplies the current row. `right` (conv_dim, w): column j-1 multiplies row t + j of u
    (a block preview's look-ahead, rows past the block read nothing)."""
    u = np.ascontiguousarray(u, np.float32)
    ring = np.ascontiguousarray(ring, np.float32)
    n, C = u.shape
    K = taps.shape[1]
    rest = C - 2 * k_heads * k_dim
    v_dim = rest // max(1, v_heads)
    if ring.shape != (K - 1, C) or taps.shape[0] != C or rest <= 0 or v_heads * v_dim != rest:
        raise ValueError(f"inconsistent GDN input shapes u{u.shape} ring{ring.shape} taps{taps.shape}")
    tk = np.ascontiguousarray(taps.T, np.float32)  # tap by tap: contiguous over channels (vector code)
    rt = np.zeros((0, C), np.float32) if right is None else np.ascontiguousarray(right.T, np.float32)
    q = np.empty((n, k_heads, k_dim), np.float32)
    k = np.empty((n, k_heads, k_dim), np.float32)
    v = np.empty((n, v_heads, v_dim), np.float32)
    fn = _inputs_parallel if parallel_pays(n * C) and n > 1 else _inputs_serial
    fn(u, ring, tk, rt, k_heads, k_dim, q, k, v)
    return q, k, v, _new_ring(ring, u)


@njit(parallel=True, cache=True)
def _conv_rounded(u, ring, tk, out):
    """No fastmath: each tap's product is rounded, then added, tap by tap, as numpy's passes do."""
    R = tk.shape[0] - 1
    for t in prange(u.shape[0]):
        o = out[t]
        for j in range(tk.shape[0]):
            src = ring[t + j] if t + j < R else u[t + j - R]
            tj = tk[j]
            if j == 0:
                for c in range(o.shape[0]):
                    o[c] = src[c] * tj[c]
            else:
                for c in range(o.shape[0]):
                    o[c] += src[c] * tj[c]


def causal_conv(ring: np.ndarray, u: np.ndarray, taps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`engine.gdn.conv` (a causal prefill's depthwise conv over [ring; u], before SiLU, and the
    new ring) in one compiled call over the rows, in parallel, with numpy's rounding: the same
    bits as its passes (tests/test_kernels_gdn_inputs.py), which ran on one thread (~9 ms a
    real-shape GDN layer in a 512-row prefill)."""
    u = np.ascontiguousarray(u, np.float32)
    ring = np.ascontiguousarray(ring, np.float32)
    n, C = u.shape
    K = taps.shape[1]
    if ring.shape != (K - 1, C) or taps.shape[0] != C:
        raise ValueError(f"inconsistent GDN conv shapes u{u.shape} ring{ring.shape} taps{taps.shape}")
    out = np.empty((n, C), np.float32)
    _conv_rounded(u, ring, np.ascontiguousarray(taps.T, np.float32), out)
    return out, _new_ring(ring, u)


def _new_ring(ring: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The last kernel - 1 rows of [ring; u]: the next call's ring."""
    n, R = u.shape[0], ring.shape[0]
    return np.array(u[n - R:] if n >= R else np.concatenate([ring, u])[n:], np.float32)
