"""Encoders from float32 to the supported ggml types, in GGUF byte layout.

gguf-py cannot write K-quants, and its legacy encoders run row group by row group; these work on
chunks of blocks at once. The legacy types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) follow ggml's reference
rounding exactly. The K-quants follow llama.cpp's reference layout and algorithm shape
(`quantize_row_q4_K_ref` and friends: a weighted search over sub-block scales, then the scales
themselves quantized against one fp16 super-block scale) with a shorter candidate search.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .formats import (
    BF16,
    F16,
    F32,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    block_size,
    check_supported,
    type_name,
    type_size,
)

_CHUNK_ELEMENTS = 1 << 15  # weights encoded per step: temporaries stay in L2
_MAX_THREADS = 4

_ONES_32 = np.ones(32, dtype=np.float32)
_ONES_16 = np.ones(16, dtype=np.float32)
_SHIFT_Q6 = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
_SHIFT_8 = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)

# Candidate offsets r for the inverse scale (nmax + r) / range of the K-quant searches. llama.cpp
# tries 21 (Q4_K), 16 (Q5_K) and 19 (Q6_K) values; on Gaussian data these subsets give RMS errors
# within 1% of the full search (Q4_K 0.0724 vs 0.0717 of the RMS value; min-max alone: 0.0757)
# at a quarter of the cost.
_R_Q4_K = np.array([-1.0, -0.5, 0.0, 0.5, 1.0], dtype=np.float32)
_R_Q5_K = np.array([-0.5, 0.0, 0.5], dtype=np.float32)
_R_Q6_K = np.array([-0.6, -0.3, 0.0, 0.3, 0.6], dtype=np.float32)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C `roundf`: ties away from zero (np.rint rounds ties to even)."""
    a = np.abs(v)
    f = np.floor(a)
    return np.copysign(f + (a - f >= 0.5), v)


def _inverse(d: np.ndarray) -> np.ndarray:
    """1/d, with 0 where d is 0 (an all-zero block encodes as zeros)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _put_f16(out: np.ndarray, start: int, v: np.ndarray) -> None:
    out[:, start:start + 2] = v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_nibbles_32(q: np.ndarray) -> np.ndarray:
    """Legacy 32-blocks: byte j holds element j (low nibble) and element j + 16 (high nibble)."""
    return q[:, :16] | (q[:, 16:] << 4)


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """The value of largest magnitude per block (first one on ties), keeping its sign."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)


def _enc_q8_0(x: np.ndarray, out: np.ndarray) -> None:
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_half_away(x * _inverse(d))
    _put_f16(out, 0, d)
    out[:, 2:34] = q.astype(np.int8).view(np.uint8)


def _enc_q4_0(x: np.ndarray, out: np.ndarray) -> None:
    d = _signed_absmax(x) / np.float32(-8)
    q = np.minimum(np.trunc(x * _inverse(d) + np.float32(8.5)), 15).astype(np.uint8)
    _put_f16(out, 0, d)
    out[:, 2:18] = _pack_nibbles_32(q)


def _enc_q5_0(x: np.ndarray, out: np.ndarray) -> None:
    d = _signed_absmax(x) / np.float32(-16)
    q = np.minimum(np.trunc(x * _inverse(d) + np.float32(16.5)), 31).astype(np.uint8)
    _put_f16(out, 0, d)
    out[:, 2:6] = np.packbits(q >> 4, axis=1, bitorder="little")
    out[:, 6:22] = _pack_nibbles_32(q & 15)


def _affine_32(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo = x.min(axis=1, keepdims=True)
    d = (x.max(axis=1, keepdims=True) - lo) / np.float32(nmax)
    q = np.minimum(np.trunc((x - lo) * _inverse(d) + np.float32(0.5)), nmax).astype(np.uint8)
    return d, lo, q


def _enc_q4_1(x: np.ndarray, out: np.ndarray) -> None:
    d, lo, q = _affine_32(x, 15)
    _put_f16(out, 0, d)
    _put_f16(out, 2, lo)
    out[:, 4:20] = _pack_nibbles_32(q)


def _enc_q5_1(x: np.ndarray, out: np.ndarray) -> None:
    d, lo, q = _affine_32(x, 31)
    _put_f16(out, 0, d)
    _put_f16(out, 2, lo)
    out[:, 4:8] = np.packbits(q >> 4, axis=1, bitorder="little")
    out[:, 8:24] = _pack_nibbles_32(q & 15)


def _fit_scale_min(x: np.ndarray, nmax: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per 32-weight sub-block (rows of `x`), a scale s ≥ 0 and offset m ≥ 0 with x ≈ s·L − m.

    As llama.cpp's make_qkx2_quants: weights |x| + rms(x) favour the large values; candidates are
    the min–max grid and, for each inverse scale (nmax + r) / range, the weighted least-squares
    (s, m) for the levels L it rounds to; the smallest weighted squared error wins. All candidates
    run at once on a (candidate, 32, sub-block) array, and each error comes from five sums.
    """
    xt = np.ascontiguousarray(x.T)  # (32, n): per-sub-block values broadcast along the last axis
    lo = np.minimum(xt.min(axis=0), 0)
    rng = xt.max(axis=0) - lo
    w = np.abs(xt) + np.sqrt(_ONES_32 @ (xt * xt) / np.float32(32))
    wx = w * xt
    sw, swx, swx2 = (_ONES_32 @ v for v in (w, wx, wx * xt))
    inv_rng = _inverse(rng)
    iscale = (np.float32(nmax) + offsets)[:, None] * inv_rng
    L = np.minimum(np.rint((xt - lo)[None] * iscale[:, None, :]), np.float32(nmax))
    wl = w * L
    sl, sl2, sxl = (_ONES_32 @ v for v in (wl, wl * L, wl * xt))
    sl, sl2, sxl = sl.astype(np.float64), sl2.astype(np.float64), sxl.astype(np.float64)
    sw, swx, swx2 = sw.astype(np.float64), swx.astype(np.float64), swx2.astype(np.float64)

    det = sw * sl2 - sl * sl
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (sw * sxl - swx * sl) / det
        m = (sl2 * swx - sl * sxl) / det
        clipped = m > 0  # the offset may only lower the grid: refit the scale through zero
        s = np.maximum(np.where(clipped, sxl / sl2, s), 0.0)
        m = np.where(clipped, 0.0, m)
    # The plain min-max grid (the r = 0 levels, no refit) is always a valid fallback.
    i0 = int(np.flatnonzero(offsets == 0)[0])
    s = np.concatenate([(rng / np.float32(nmax)).astype(np.float64)[None], s])
    m = np.concatenate([lo.astype(np.float64)[None], m])
    sl, sl2, sxl = (np.concatenate([v[i0:i0 + 1], v]) for v in (sl, sl2, sxl))
    err = s * s * sl2 + m * m * sw + swx2 + 2 * s * m * sl - 2 * s * sxl - 2 * m * swx
    err[1:][~(det > 0)] = np.inf
    best = err.argmin(axis=0)[None]
    best_s = np.take_along_axis(s, best, axis=0)[0].astype(np.float32)
    best_m = -np.take_along_axis(m, best, axis=0)[0].astype(np.float32)
    return best_s, best_m


def _quantize_6bit(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative per-sub-block values (n, 8) as fp16 super-scale × 6-bit integers."""
    vmax = v.max(axis=1, keepdims=True)
    q = np.minimum(np.rint(v * (np.float32(63) * _inverse(vmax))), 63).astype(np.uint8)
    return (vmax / np.float32(63)).astype(np.float16), q


def _pack_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Inverse of `dequant.k_scales_mins`: eight 6-bit scales and mins into 12 bytes."""
    return np.concatenate([
        ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6),
        lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6),
        (ls[:, 4:8] & 15) | ((lm[:, 4:8] & 15) << 4),
    ], axis=1)


def _k_affine_levels(x: np.ndarray, out: np.ndarray, nmax: int, offsets: np.ndarray) -> np.ndarray:
    """Shared Q4_K/Q5_K part: fill d, dmin and the scales, return levels L (n, 256) in 0..nmax."""
    n = x.shape[0]
    sub = x.reshape(n * 8, 32)
    s, m = _fit_scale_min(sub, nmax, offsets)
    d, ls = _quantize_6bit(s.reshape(n, 8))
    dmin, lm = _quantize_6bit(m.reshape(n, 8))
    out[:, 0:2] = d.view(np.uint8)
    out[:, 2:4] = dmin.view(np.uint8)
    out[:, 4:16] = _pack_k_scales(ls, lm)
    # Levels against the scales as the decoder will see them (fp16 super-scales × 6-bit ints).
    scale = (d.astype(np.float32) * ls).reshape(n * 8, 1)
    offset = (dmin.astype(np.float32) * lm).reshape(n * 8, 1)
    L = np.rint((sub + offset) * _inverse(scale))
    return np.clip(L, 0, nmax).astype(np.uint8).reshape(n, 256)


def _enc_q4_k(x: np.ndarray, out: np.ndarray) -> None:
    n = x.shape[0]
    L = _k_affine_levels(x, out, 15, _R_Q4_K).reshape(n, 4, 2, 32)
    out[:, 16:144] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(n, 128)


def _enc_q5_k(x: np.ndarray, out: np.ndarray) -> None:
    n = x.shape[0]
    L = _k_affine_levels(x, out, 31, _R_Q5_K)
    out[:, 16:48] = np.packbits((L >> 4).reshape(n, 8, 32), axis=1, bitorder="little").reshape(n, 32)
    lo = (L & 15).reshape(n, 4, 2, 32)
    out[:, 48:176] = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(n, 128)


def _fit_symmetric_16(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per 16-weight sub-block a signed scale s with x ≈ s·l, l in −32..31 (make_qx_quants shape).

    The value of largest magnitude maps to −32 (the side with the extra level); candidates stretch
    that mapping and keep the least-squares scale with the best x²-weighted fit.
    """
    xt = np.ascontiguousarray(x.T)  # (16, n)
    inv = _inverse(_signed_absmax(x)[:, 0])
    w = xt * xt
    wx = w * xt
    iscale = -(np.float32(32) + offsets)[:, None] * inv
    L = np.clip(np.rint(xt[None] * iscale[:, None, :]), -32, 31)
    sxl = (_ONES_16 @ (wx * L)).astype(np.float64)
    sl2 = (_ONES_16 @ (w * L * L)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(sl2 > 0, sxl / sl2, 0.0)
    best = (s * sxl).argmax(axis=0)[None]  # maximal sumlx² / suml2 = minimal weighted error
    return np.take_along_axis(s, best, axis=0)[0].astype(np.float32)


def _enc_q6_k(x: np.ndarray, out: np.ndarray) -> None:
    n = x.shape[0]
    sub = x.reshape(n * 16, 16)
    s = _fit_symmetric_16(sub, _R_Q6_K).reshape(n, 16)
    # The sub-block scale of largest magnitude maps to −128, as llama.cpp does.
    smax = _signed_absmax(s)
    d = (smax / np.float32(-128)).astype(np.float16)
    ls = np.clip(np.rint(s * _inverse(d.astype(np.float32))), -128, 127).astype(np.int8)
    out[:, 192:208] = ls.view(np.uint8)
    out[:, 208:210] = d.view(np.uint8)
    scale = (d.astype(np.float32) * ls).reshape(n * 16, 1)
    L = (np.clip(np.rint(sub * _inverse(scale)), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)
    lo = L & 15
    out[:, 0:128] = (lo[:, :, 0:2] | (lo[:, :, 2:4] << 4)).reshape(n, 128)
    out[:, 128:192] = ((L >> 4) << _SHIFT_Q6).sum(axis=2, dtype=np.uint8).reshape(n, 64)


def _enc_f16(x: np.ndarray, out: np.ndarray) -> None:
    out[:] = x.astype(np.float16).view(np.uint8)


def _enc_bf16(x: np.ndarray, out: np.ndarray) -> None:
    # Round to nearest even on the upper 16 bits; NaNs stay NaN (quiet) instead of rounding to inf.
    u = x.view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = ((u.astype(np.uint64) + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    r = np.where(nan, ((u >> 16) | np.uint32(0x40)).astype(np.uint16), r)
    out[:] = r.view(np.uint8)


_ENCODERS: dict[int, Callable[[np.ndarray, np.ndarray], None]] = {
    F16: _enc_f16, BF16: _enc_bf16, Q8_0: _enc_q8_0, Q4_0: _enc_q4_0, Q4_1: _enc_q4_1,
    Q5_0: _enc_q5_0, Q5_1: _enc_q5_1, Q4_K: _enc_q4_k, Q5_K: _enc_q5_k, Q6_K: _enc_q6_k,
}


def quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """Encode `x` (last dim = row) as GGUF bytes: uint8 of shape (*x.shape[:-1], row bytes).

    The result is exactly what a GGUF writer stores for the tensor (gguf's
    `quant_shape_to_byte_shape`), ready for `GGUFWriter.add_tensor(..., raw_dtype=ggml_type)`.
    """
    t = check_supported(ggml_type)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise ValueError("cannot quantize a 0-d array: the last dimension is the row")
    blk, size = block_size(t), type_size(t)
    n_cols = x.shape[-1]
    if n_cols % blk:
        raise ValueError(f"row length {n_cols} is not a multiple of the {type_name(t)} block size {blk}")
    out_shape = (*x.shape[:-1], n_cols // blk * size)
    if t == F32:
        return x.view(np.uint8).reshape(out_shape).copy()
    if t not in (F16, BF16) and not np.isfinite(x).all():
        raise ValueError(f"cannot quantize non-finite values to {type_name(t)}")
    out = np.empty(out_shape, dtype=np.uint8)
    blocks = x.reshape(-1, blk)
    dest = out.reshape(-1, size)
    encode = _ENCODERS[t]
    step = max(1, _CHUNK_ELEMENTS // blk)
    starts = range(0, blocks.shape[0], step)
    workers = min(_MAX_THREADS, os.cpu_count() or 1, len(starts) // 4)
    if workers > 1:
        # numpy releases the GIL inside ufuncs: chunks on threads gain 1.2-1.6x on 2 cores.
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda s: encode(blocks[s:s + step], dest[s:s + step]), starts))
    else:
        for s in starts:
            encode(blocks[s:s + step], dest[s:s + step])
    return out
