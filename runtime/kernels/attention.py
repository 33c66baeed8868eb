"""Softmax attention of a few query rows over a long KV cache, in one compiled parallel call.

Decode and short commits read the whole cache once per token; with numpy that was one BLAS call
per KV head on one thread. Here the cache is cut into chunks of positions, each (KV head, chunk)
is a work item on the kernel threads computing its scores (key by key, each key row read once for
all the query rows and heads that share it), their maximum, the exponentials and the weighted sum
of values, TILE positions at a time so the values are read from memory once for all of them;
the items are then merged with their maxima (the
log-sum-exp combination of split softmax), so the result equals the one-pass softmax to float32
round-off.
"""

from __future__ import annotations

import numpy as np

from .act import exp_nonpositive_inplace
from .jit import current_threads, njit, prange

_FM = {"contract", "nsz", "reassoc"}
MIN_CHUNK = 256  # positions per work item at least
# Positions whose values stay in L2 while every query row of the KV head uses them: 64 x 256
# floats, 64 KB. A whole chunk at a time (8192 positions of a 16K cache at one thread, 8 MB) was
# read from memory once per query row: 36 ms a layer at depth 16K.
TILE = 64


@njit(inline="always")
def _zero(a):
    """a[...] = 0 as a plain loop: outside a prange the array expression became a parallel
    loop of its own, one launch (~0.7 us at one thread) per call of it."""
    flat = a.reshape(-1)
    for i in range(flat.shape[0]):
        flat[i] = 0.0


@njit(inline="always")
def _score(qi, kr, scale):
    """(Σ_t qi[t]·kr[t]) · scale: one position's score from its key row as stored, so it depends
    on no other position, row or call. Summed across vector lanes: the keys transposed a tile at a
    time (a sum per position on its own lane) spent more on the scalar transpose than on the
    products, 7 of 20 ms a layer at depth 16K on one thread."""
    a = np.float32(0.0)
    for t in range(qi.shape[0]):
        a += qi[t] * kr[t]
    return a * scale


@njit(parallel=True, cache=True, fastmath=_FM)
def _attend(q, K, V, M, limits, scale, chunk, out):
    n, heads, d = q.shape
    kvh = K.shape[0]
    dv = V.shape[2]
    g = heads // kvh
    R = n * g
    nc = (M + chunk - 1) // chunk
    pm = np.empty((kvh, nc, R), np.float32)
    pl = np.empty((kvh, nc, R), np.float32)
    pacc = np.empty((kvh, nc, R, dv), np.float32)  # zeroed by each item (`_zero`)
    for it in prange(kvh * nc):
        h = it // nc
        c = it % nc
        p0 = c * chunk
        L = min(M, p0 + chunk) - p0
        s = np.empty((R, L), np.float32)
        e = np.empty(L, np.float32)
        bits = np.empty(L, np.int32)
        _zero(pacc[h, c])
        for j in range(L):  # a key row, hot for every query row and head that sees it
            kr = K[h, p0 + j]
            for r in range(n):
                if p0 + j < limits[r]:
                    for gi in range(g):
                        s[r * g + gi, j] = _score(q[r, h * g + gi], kr, scale)
        for r in range(n):
            Lr = min(L, max(0, limits[r] - p0))
            for gi in range(g):
                sr = s[r * g + gi]
                for j in range(Lr, L):
                    sr[j] = -np.inf
        for row in range(R):
            # only the positions this row sees: its loops then run exactly as in a call of its own
            # (a vectorised sum groups its terms by the trip count), whatever rows share the call
            Lr = min(L, max(0, limits[row // g] - p0))
            sr = s[row]
            mx = -np.inf
            for j in range(Lr):
                mx = max(mx, sr[j])
            pm[h, c, row] = mx
            if mx == -np.inf:
                pl[h, c, row] = 0.0
                sr[:] = 0.0
                continue
            for j in range(Lr):
                sr[j] = sr[j] - mx
            exp_nonpositive_inplace(sr[:Lr], e[:Lr], bits[:Lr])
            sr[Lr:] = 0.0
            tot = np.float32(0.0)
            for j in range(Lr):
                tot += sr[j]
            pl[h, c, row] = tot
        for p in range(0, L, TILE):  # a tile of values, hot for every row
            for row in range(R):  # the values each row sees, in position order, added into its sum
                Lt = min(p + TILE, L, max(0, limits[row // g] - p0))  # (indexed in place: a view made
                for j in range(p, Lt):  # per position and row cost more, in reference counts, than its sum)
                    pj = s[row, j]
                    for t in range(dv):
                        pacc[h, c, row, t] += pj * V[h, p0 + j, t]
    for r in range(n):
        for hh in range(heads):
            h = hh // g
            row = r * g + (hh % g)
            mx = -np.inf
            for c in range(nc):
                if pm[h, c, row] > mx:
                    mx = pm[h, c, row]
            tot = np.float32(0.0)
            o = out[r, hh]
            _zero(o)
            for c in range(nc):
                if pl[h, c, row] > 0:
                    w = np.float32(np.exp(pm[h, c, row] - mx))
                    tot += w * pl[h, c, row]
                    a = pacc[h, c, row]
                    for t in range(dv):
                        o[t] += w * a[t]
            if tot > 0:
                for t in range(dv):
                    o[t] /= tot


@njit(cache=True)
def chunk_of(capacity, kv_heads, threads):
    """`_attend`'s positions per work item: cut by the cache's capacity, not by the rows' lengths,
    so a row's chunks (and so its bits) do not depend on the other rows of the call; a few items
    per thread even out the load at full length. One function for every caller: a drift in it
    would change a row's bits between paths."""
    items = max(1, 4 * threads // kv_heads)
    return max(MIN_CHUNK, (capacity + items - 1) // items)


def attend_cache(q: np.ndarray, K: np.ndarray, V: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """Attention of q (n, heads, d) over a KV cache K (kv_heads, capacity, d), V (kv_heads,
    capacity, dv), both C-contiguous: row r sees the first limits[r] positions; query head h uses
    KV head h // (heads / kv_heads). Returns (n, heads, dv) float32 (zeros for a row seeing none).
    Whole cache arrays are passed, not slices, so the compiled rows are contiguous (vector code)."""
    q = np.ascontiguousarray(q, np.float32)
    n, heads, d = q.shape
    kvh = K.shape[0]
    limits = np.asarray(limits, np.int64)
    if (K.shape[2] != d or V.shape[:2] != K.shape[:2] or heads % kvh or limits.shape != (n,)
            or not (K.flags.c_contiguous and V.flags.c_contiguous)):
        raise ValueError(f"inconsistent attention inputs q{q.shape} K{K.shape} V{V.shape} limits{limits.shape}")
    m = int(limits.max(initial=0))
    if m > K.shape[1] or (n and limits.min() < 0):
        raise ValueError(f"limits must lie in 0..{K.shape[1]}")
    out = np.empty((n, heads, V.shape[2]), np.float32)
    _attend(q, K, V, m, limits, np.float32(1.0 / np.sqrt(d)), chunk_of(K.shape[1], kvh, current_threads()), out)
    return out


@njit(cache=True, nogil=True)
def _rope(x, positions, inv_freq, out):
    half = inv_freq.shape[0]
    for r in range(x.shape[0]):
        for j in range(half):
            ang = np.float64(positions[r]) * inv_freq[j]
            c = np.float32(np.cos(ang))
            s = np.float32(np.sin(ang))
            for h in range(x.shape[1]):
                x1 = x[r, h, j]
                x2 = x[r, h, half + j]
                out[r, h, j] = x1 * c - x2 * s
                out[r, h, half + j] = x2 * c + x1 * s


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """NEOX rotation of pairs (d_j, d_{j+half}) of x (n, heads, dim) by the angles
    positions[r] · inv_freq[j] (float64, rounded to float32 as cos and sin), half = len(inv_freq);
    dims past 2·half are copied. One compiled call for what was a table and six numpy passes."""
    out = np.array(x, np.float32)  # a copy: the dims past the rotated ones keep their values
    if inv_freq.shape[0]:
        _rope(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(positions, np.int64),
              np.ascontiguousarray(inv_freq, np.float64), out)
    return out
