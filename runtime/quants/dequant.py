"""Vectorised numpy dequantization of the supported ggml types, written from the block layouts.

This is the reference path (and the one used for small dense tensors); the compiled kernels in
`clover_runtime.kernels` must agree with it. Work proceeds in chunks of blocks so that temporaries stay in
cache and a large tensor never needs more than its float32 output plus a few megabytes.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np

from ..errors import ModelFileError
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
    row_bytes,
    type_name,
    type_size,
)

_CHUNK_ELEMENTS = 1 << 16  # weights decoded per step: output and temporaries stay within L2

_SHIFT_0_4 = np.array([0, 4], dtype=np.uint8)
_SHIFT_8 = np.arange(8, dtype=np.uint8)
_SHIFT_Q6 = np.array([0, 2, 4, 6], dtype=np.uint8)


def _f16(b: np.ndarray, start: int) -> np.ndarray:
    """The fp16 field at byte `start` of every block, as float32 of shape (n_blocks, 1)."""
    return b[:, start:start + 2].view(np.float16).astype(np.float32)


def _high_bits_32(qh: np.ndarray) -> np.ndarray:
    """Bit i (0..31) of a little-endian uint32 field, as uint8 of shape (n_blocks, 32)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """Legacy 32-blocks: element j is the low nibble of byte j, element j + 16 its high nibble."""
    n = qs.shape[0]
    return ((qs.reshape(n, 1, 16) >> _SHIFT_0_4.reshape(1, 2, 1)) & 15).reshape(n, 32)


def _dec_q8_0(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(b[:, 2:34].view(np.int8), _f16(b, 0), out=out)


def _dec_q4_0(b: np.ndarray, out: np.ndarray) -> None:
    q = _nibbles_32(b[:, 2:18]).view(np.int8) - np.int8(8)
    np.multiply(q, _f16(b, 0), out=out)


def _dec_q4_1(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_nibbles_32(b[:, 4:20]), _f16(b, 0), out=out)
    out += _f16(b, 2)


def _dec_q5_0(b: np.ndarray, out: np.ndarray) -> None:
    q = (_nibbles_32(b[:, 6:22]) | (_high_bits_32(b[:, 2:6]) << 4)).view(np.int8) - np.int8(16)
    np.multiply(q, _f16(b, 0), out=out)


def _dec_q5_1(b: np.ndarray, out: np.ndarray) -> None:
    q = _nibbles_32(b[:, 8:24]) | (_high_bits_32(b[:, 4:8]) << 4)
    np.multiply(q, _f16(b, 0), out=out)
    out += _f16(b, 2)


def k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte field of Q4_K/Q5_K into eight 6-bit scales and eight 6-bit mins.

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales/mins 4-7 keep their
    low nibble in bytes 8-11 (scale low, min high) and their top two bits in bits 6-7 of bytes 0-7.
    """
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc, mn


def _k_affine(b: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    """out = d * scale_j * q - dmin * min_j for the eight 32-weight sub-blocks j."""
    n = b.shape[0]
    sc, mn = k_scales_mins(b[:, 4:16])
    scale = (_f16(b, 0) * sc).reshape(n, 8, 1)
    minv = (_f16(b, 2) * mn).reshape(n, 8, 1)
    o = out.reshape(n, 8, 32)
    np.multiply(q.reshape(n, 8, 32), scale, out=o)
    o -= minv


def _dec_q4_k(b: np.ndarray, out: np.ndarray) -> None:
    # Each 32-byte group of qs holds two sub-blocks: low nibbles first, then high nibbles.
    n = b.shape[0]
    q = (b[:, 16:144].reshape(n, 4, 1, 32) >> _SHIFT_0_4.reshape(1, 1, 2, 1)) & 15
    _k_affine(b, q, out)


def _dec_q5_k(b: np.ndarray, out: np.ndarray) -> None:
    # As Q4_K, plus a fifth bit: bit j of qh[l] belongs to element l of sub-block j.
    n = b.shape[0]
    lo = (b[:, 48:176].reshape(n, 4, 1, 32) >> _SHIFT_0_4.reshape(1, 1, 2, 1)) & 15
    hi = (b[:, 16:48].reshape(n, 1, 32) >> _SHIFT_8.reshape(1, 8, 1)) & 1
    _k_affine(b, lo.reshape(n, 8, 32) | (hi << 4), out)


def _dec_q6_k(b: np.ndarray, out: np.ndarray) -> None:
    # Two halves of 128: ql (64 bytes) gives quarters 0,1 as low nibbles and 2,3 as high nibbles,
    # qh (32 bytes) gives the top two bits of quarter k at bits 2k. Scales: int8 per 16 weights.
    n = b.shape[0]
    lo = (b[:, 0:128].reshape(n, 2, 1, 64) >> _SHIFT_0_4.reshape(1, 1, 2, 1)) & 15
    hi = (b[:, 128:192].reshape(n, 2, 1, 32) >> _SHIFT_Q6.reshape(1, 1, 4, 1)) & 3
    q = (lo.reshape(n, 2, 4, 32) | (hi << 4)).view(np.int8) - np.int8(32)
    scale = (_f16(b, 208) * b[:, 192:208].view(np.int8)).reshape(n, 16, 1)
    np.multiply(q.reshape(n, 16, 16), scale, out=out.reshape(n, 16, 16))


def _dec_f16(b: np.ndarray, out: np.ndarray) -> None:
    out[:] = b.view(np.float16)


def _dec_bf16(b: np.ndarray, out: np.ndarray) -> None:
    out.view(np.uint32)[:] = b.view(np.uint16)
    out.view(np.uint32)[:] <<= 16


_DECODERS: dict[int, Callable[[np.ndarray, np.ndarray], None]] = {
    F16: _dec_f16, BF16: _dec_bf16, Q8_0: _dec_q8_0, Q4_0: _dec_q4_0, Q4_1: _dec_q4_1,
    Q5_0: _dec_q5_0, Q5_1: _dec_q5_1, Q4_K: _dec_q4_k, Q5_K: _dec_q5_k, Q6_K: _dec_q6_k,
}


def _as_bytes(raw: np.ndarray, n_bytes: int, what: str) -> np.ndarray:
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).view(np.uint8)
    raw = raw.reshape(-1)
    if raw.size != n_bytes:
        raise ModelFileError(f"{what}: expected {n_bytes} bytes of tensor data, got {raw.size}")
    return raw


def _decode(buf: np.ndarray, t: int, n: int) -> np.ndarray:
    if t == F32:
        return buf.view(np.float32)
    blk, size = block_size(t), type_size(t)
    n_blocks = n // blk
    blocks = buf.reshape(n_blocks, size)
    out = np.empty((n_blocks, blk), dtype=np.float32)
    decode = _DECODERS[t]
    step = max(1, _CHUNK_ELEMENTS // blk)
    for s in range(0, n_blocks, step):
        decode(blocks[s:s + step], out[s:s + step])
    return out.reshape(n)


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Decode a whole tensor (`raw`: its bytes as uint8, `shape`: numpy order, last dim = row).

    Returns float32 of `shape`. For F32 the result is a view of `raw` (read-only if `raw` is a
    read-only mmap) so that a large F32 tensor is never copied.
    """
    t = check_supported(ggml_type)
    shape = tuple(int(d) for d in shape)
    n = prod(shape)
    n_cols = shape[-1] if shape else 1
    n_bytes = n // n_cols * row_bytes(t, n_cols) if n_cols else 0
    buf = _as_bytes(raw, n_bytes, f"{type_name(t)} tensor of shape {shape}")
    return _decode(buf, t, n).reshape(shape)


def dequantize_rows(raw: np.ndarray, ggml_type: int, n_cols: int, rows: slice | np.ndarray) -> np.ndarray:
    """Decode only the selected rows of a tensor viewed as (n_rows, n_cols).

    For embedding lookups and per-expert slices (an expert is a slice of rows of the 3-D tensor):
    only the selected rows' bytes are read. Returns float32 of shape (n_selected, n_cols).
    """
    t = check_supported(ggml_type)
    rb = row_bytes(t, int(n_cols))
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).view(np.uint8)
    raw = raw.reshape(-1)
    if rb == 0 or raw.size % rb:
        raise ModelFileError(f"{type_name(t)} data of {raw.size} bytes is not whole rows of {n_cols} columns")
    picked = raw.reshape(raw.size // rb, rb)[rows]
    if picked.ndim != 2:
        raise ValueError("rows must select a 1-D set of rows (a slice or an integer array)")
    n_sel, n_cols = picked.shape[0], int(n_cols)
    if t == F32:
        return picked.view(np.float32)
    return _decode(np.ascontiguousarray(picked).reshape(-1), t, n_sel * n_cols).reshape(n_sel, n_cols)
