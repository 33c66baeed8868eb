"""Fused dequantize-and-multiply: y = x · Wᵀ straight from the quantized bytes of W.

One compiled kernel serves dense and MoE weights. Work items are (expert, run of output rows);
for each output row it decodes one group of up to 256 weights into a small float32 buffer and
reuses it for every activation row routed to that expert, so weights are read once per call
whatever the batch, and a MoE layer is one call for all experts of all rows.
"""

from __future__ import annotations

import numpy as np

from ..quants.formats import F32, block_size, check_supported, row_bytes, type_size
from .blocks import F16_TABLE, decode_blocks
from .jit import njit, numba, prange

_GROUP = 256  # weights decoded per step (one super-block, or 8 legacy blocks)


_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # reassociation lets the dot products vectorise


@njit(inline="always", cache=True, fastmath=_FASTMATH)
def _dot(w, a):
    s = np.float32(0.0)
    for k in range(w.shape[0]):
        s += w[k] * a[k]
    return s


@njit(inline="always", cache=True, fastmath=_FASTMATH)
def _dot4(w, a, b, c, d):
    """Four activation rows against one decoded weight group: each weight is loaded once."""
    sa = sb = sc = sd = np.float32(0.0)
    for k in range(w.shape[0]):
        v = w[k]
        sa += v * a[k]
        sb += v * b[k]
        sc += v * c[k]
        sd += v * d[k]
    return sa, sb, sc, sd


@njit(parallel=True, cache=True, fastmath=_FASTMATH)
def _grouped_matmul(raw, t, blk, tsize, n_in, expert_bytes, x, xrow, order, starts,
                    item_expert, item_row0, item_row1, y, f16):
    n_blocks = n_in // blk
    group = max(1, _GROUP // blk)
    rb = n_blocks * tsize
    for it in prange(item_expert.shape[0]):
        e = item_expert[it]
        s0 = starts[e]
        cnt = starts[e + 1] - s0
        rows = np.empty(cnt, dtype=np.int64)
        for q in range(cnt):
            rows[q] = xrow[order[s0 + q]]
        buf = np.empty(group * blk, dtype=np.float32)
        bits = buf.view(np.uint32)
        acc = np.empty(cnt, dtype=np.float64)
        n4 = cnt - cnt % 4
        for o in range(item_row0[it], item_row1[it]):
            acc[:] = 0.0
            base = e * expert_bytes + o * rb
            for g0 in range(0, n_blocks, group):
                c = min(group, n_blocks - g0)
                decode_blocks(t, raw, base + g0 * tsize, c, buf, bits, f16)
                lo = g0 * blk
                hi = lo + c * blk
                w = buf[:c * blk]
                for q in range(0, n4, 4):
                    sa, sb, sc, sd = _dot4(w, x[rows[q], lo:hi], x[rows[q + 1], lo:hi],
                                           x[rows[q + 2], lo:hi], x[rows[q + 3], lo:hi])
                    acc[q] += sa
                    acc[q + 1] += sb
                    acc[q + 2] += sc
                    acc[q + 3] += sd
                for q in range(n4, cnt):
                    acc[q] += _dot(w, x[rows[q], lo:hi])
            for q in range(cnt):
                y[order[s0 + q], o] = acc[q]


def _readonly_bytes(raw: np.ndarray) -> np.ndarray:
    """A flat read-only uint8 view: one compiled specialization whether or not raw is an mmap."""
    v = np.asarray(raw)
    if v.dtype != np.uint8:
        v = np.ascontiguousarray(v).view(np.uint8)
    v = v.reshape(-1).view()
    v.flags.writeable = False
    return v


def _items(counts: np.ndarray, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split each used expert's output rows into runs, enough of them to keep every thread busy."""
    used = np.flatnonzero(counts)
    want = 8 * numba.get_num_threads()
    run = int(min(64, max(4, -(-len(used) * n_out // want))))
    starts = np.arange(0, n_out, run)
    item_expert = np.repeat(used, len(starts)).astype(np.int64)
    row0 = np.tile(starts, len(used)).astype(np.int64)
    return item_expert, row0, np.minimum(row0 + run, n_out)


def _run(raw, t, n_expert, n_out, n_in, x2d, xrow, expert_of_pair) -> np.ndarray:
    counts = np.bincount(expert_of_pair, minlength=n_expert)
    order = np.argsort(expert_of_pair, kind="stable").astype(np.int64)
    starts = np.zeros(n_expert + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    item_expert, row0, row1 = _items(counts, n_out)
    y = np.zeros((len(expert_of_pair), n_out), dtype=np.float32)
    _grouped_matmul(raw, t, block_size(t), type_size(t), n_in, n_out * row_bytes(t, n_in), x2d, xrow,
                    order, starts, item_expert, row0, row1, y, F16_TABLE)
    return y


def _check_raw(raw: np.ndarray, t: int, n_matrices: int | None, n_out: int,
               n_in: int) -> tuple[np.ndarray, int]:
    v = _readonly_bytes(raw)
    per = n_out * row_bytes(t, n_in)
    if per == 0 or v.size % per or (n_matrices is not None and v.size != n_matrices * per):
        raise ValueError(f"{v.size} bytes are not whole {n_out}x{n_in} matrices of this type")
    return v, v.size // per


def matmul(raw: np.ndarray, ggml_type: int, out_features: int, in_features: int, x: np.ndarray) -> np.ndarray:
    """x (n, in) float32 times the (out, in) weight stored in `raw`: returns (n, out) float32."""
    t = check_supported(ggml_type)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != in_features:
        raise ValueError(f"x must be (n, {in_features}), got {x.shape}")
    v, _ = _check_raw(raw, t, 1, out_features, in_features)
    if t == F32:  # already float: BLAS is the fused kernel
        return x @ v.view(np.float32).reshape(out_features, in_features).T
    n = x.shape[0]
    return _run(v, t, 1, out_features, in_features, x, np.arange(n, dtype=np.int64),
                np.zeros(n, dtype=np.int64))


def moe_matmul(raw: np.ndarray, ggml_type: int, out_features: int, in_features: int, x: np.ndarray,
               ids: np.ndarray) -> np.ndarray:
    """All routed experts of all rows in one compiled call.

    `raw` is the 3-D expert tensor (n_expert, out, in); `ids` (n, k) the experts chosen per row;
    `x` is (n, in), shared by a row's k experts (gate/up), or (n, k, in), one input per routed
    slot (down). Returns (n, k, out) float32: y[i, j] = W[ids[i, j]] · x[i] (or x[i, j]).
    """
    t = check_supported(ggml_type)
    v, n_expert = _check_raw(raw, t, None, out_features, in_features)
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"ids must be (n, k), got {ids.shape}")
    n, k = ids.shape
    flat = ids.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= n_expert):
        raise ValueError(f"expert ids must lie in 0..{n_expert - 1}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape == (n, in_features):
        xrow = np.repeat(np.arange(n, dtype=np.int64), k)
        x2d = x
    elif x.shape == (n, k, in_features):
        xrow = np.arange(n * k, dtype=np.int64)
        x2d = x.reshape(n * k, in_features)
    else:
        raise ValueError(f"x must be ({n}, {in_features}) or ({n}, {k}, {in_features}), got {x.shape}")
    return _run(v, t, n_expert, out_features, in_features, x2d, xrow, flat).reshape(n, k, out_features)
