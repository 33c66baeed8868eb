"""Compiled block decoders: one ggml block at byte `p` of `raw` into float32 `buf[o:o + block]`.

Written from the block layouts (the same as `runtime.quants.dequant`, which they are tested
against). fp16 fields go through a 65,536-entry table (`F16_TABLE`); `bits` is `buf` viewed as
uint32, for F32/BF16, whose bit patterns are assembled rather than converted.
"""

from __future__ import annotations

import numpy as np

from ..quants.formats import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from .jit import njit

F16_TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


_JIT = {"cache": True, "fastmath": {"contract", "nsz"}}
_U4 = np.uint8(4)
_M4 = np.uint8(15)


@njit(**_JIT)
def _u16(raw, p):
    return np.int64(raw[p]) | (np.int64(raw[p + 1]) << 8)


# Each decoder reads its fields through slices and keeps nibble arithmetic in uint8: that is what
# lets LLVM vectorise the 16/32-lane loops (4x faster than indexing raw with int64 offsets).


@njit(**_JIT)
def _q8_0(raw, p, buf, o, f16):
    d = f16[_u16(raw, p)]
    q = raw[p + 2:p + 34]
    out = buf[o:o + 32]
    for j in range(32):
        out[j] = d * np.float32(np.int8(q[j]))


@njit(**_JIT)
def _q4_0(raw, p, buf, o, f16):
    d = f16[_u16(raw, p)]
    q = raw[p + 2:p + 18]
    lo, hi = buf[o:o + 16], buf[o + 16:o + 32]
    for j in range(16):
        lo[j] = d * (np.float32(q[j] & _M4) - np.float32(8))
        hi[j] = d * (np.float32(q[j] >> _U4) - np.float32(8))


@njit(**_JIT)
def _q4_1(raw, p, buf, o, f16):
    d = f16[_u16(raw, p)]
    m = f16[_u16(raw, p + 2)]
    q = raw[p + 4:p + 20]
    lo, hi = buf[o:o + 16], buf[o + 16:o + 32]
    for j in range(16):
        lo[j] = d * np.float32(q[j] & _M4) + m
        hi[j] = d * np.float32(q[j] >> _U4) + m


@njit(**_JIT)
def _q5_0(raw, p, buf, o, f16):
    d = f16[_u16(raw, p)]
    qh = np.uint32(_u16(raw, p + 2) | (_u16(raw, p + 4) << 16))
    q = raw[p + 6:p + 22]
    lo, hi = buf[o:o + 16], buf[o + 16:o + 32]
    for j in range(16):
        h0 = np.float32((qh >> np.uint32(j)) & np.uint32(1)) * np.float32(16)
        h1 = np.float32((qh >> np.uint32(j + 16)) & np.uint32(1)) * np.float32(16)
        lo[j] = d * (np.float32(q[j] & _M4) + h0 - np.float32(16))
        hi[j] = d * (np.float32(q[j] >> _U4) + h1 - np.float32(16))


@njit(**_JIT)
def _q5_1(raw, p, buf, o, f16):
    d = f16[_u16(raw, p)]
    m = f16[_u16(raw, p + 2)]
    qh = np.uint32(_u16(raw, p + 4) | (_u16(raw, p + 6) << 16))
    q = raw[p + 8:p + 24]
    lo, hi = buf[o:o + 16], buf[o + 16:o + 32]
    for j in range(16):
        h0 = np.float32((qh >> np.uint32(j)) & np.uint32(1)) * np.float32(16)
        h1 = np.float32((qh >> np.uint32(j + 16)) & np.uint32(1)) * np.float32(16)
        lo[j] = d * (np.float32(q[j] & _M4) + h0) + m
        hi[j] = d * (np.float32(q[j] >> _U4) + h1) + m


@njit(**_JIT)
def _k_scale_min(raw, s, j):
    """Sub-block j's 6-bit scale and min from the 12-byte field at `s` (Q4_K/Q5_K)."""
    if j < 4:
        return np.int64(raw[s + j]) & 63, np.int64(raw[s + j + 4]) & 63
    hi = np.int64(raw[s + j + 4])
    sc = (hi & 15) | ((np.int64(raw[s + j - 4]) >> 6) << 4)
    mn = (hi >> 4) | ((np.int64(raw[s + j]) >> 6) << 4)
    return sc, mn


@njit(**_JIT)
def _q4_k(raw, p, buf, o, f16):
    d = f16[_u16(raw, p)]
    dmin = f16[_u16(raw, p + 2)]
    for g in range(4):
        sc1, m1 = _k_scale_min(raw, p + 4, 2 * g)
        sc2, m2 = _k_scale_min(raw, p + 4, 2 * g + 1)
        d1, d2 = d * np.float32(sc1), d * np.float32(sc2)
        o1, o2 = dmin * np.float32(m1), dmin * np.float32(m2)
        q = raw[p + 16 + 32 * g:p + 48 + 32 * g]
        lo, hi = buf[o + 64 * g:o + 64 * g + 32], buf[o + 64 * g + 32:o + 64 * g + 64]
        for lane in range(32):
            lo[lane] = d1 * np.float32(q[lane] & _M4) - o1
            hi[lane] = d2 * np.float32(q[lane] >> _U4) - o2


@njit(**_JIT)
def _q5_k(raw, p, buf, o, f16):
    d = f16[_u16(raw, p)]
    dmin = f16[_u16(raw, p + 2)]
    qh = raw[p + 16:p + 48]
    for g in range(4):
        sc1, m1 = _k_scale_min(raw, p + 4, 2 * g)
        sc2, m2 = _k_scale_min(raw, p + 4, 2 * g + 1)
        d1, d2 = d * np.float32(sc1), d * np.float32(sc2)
        o1, o2 = dmin * np.float32(m1), dmin * np.float32(m2)
        q = raw[p + 48 + 32 * g:p + 80 + 32 * g]
        lo, hi = buf[o + 64 * g:o + 64 * g + 32], buf[o + 64 * g + 32:o + 64 * g + 64]
        b1, b2 = np.uint8(1 << (2 * g)), np.uint8(2 << (2 * g))
        for lane in range(32):
            h = qh[lane]
            lo[lane] = d1 * (np.float32(q[lane] & _M4) + np.float32(16) * np.float32((h & b1) != 0)) - o1
            hi[lane] = d2 * (np.float32(q[lane] >> _U4) + np.float32(16) * np.float32((h & b2) != 0)) - o2


@njit(**_JIT)
def _q6_k(raw, p, buf, o, f16):
    d = f16[_u16(raw, p + 208)]
    sc = raw[p + 192:p + 208]
    three = np.uint8(3)
    for half in range(2):
        ql = raw[p + 64 * half:p + 64 * half + 64]
        qh = raw[p + 128 + 32 * half:p + 160 + 32 * half]
        out = buf[o + 128 * half:o + 128 * half + 128]
        for sub in range(2):
            s = 8 * half + sub
            d0 = d * np.float32(np.int8(sc[s]))
            d1 = d * np.float32(np.int8(sc[s + 2]))
            d2 = d * np.float32(np.int8(sc[s + 4]))
            d3 = d * np.float32(np.int8(sc[s + 6]))
            for j in range(16):
                lane = 16 * sub + j
                a, c, h = ql[lane], ql[lane + 32], qh[lane]
                out[lane] = d0 * np.float32(np.int8((a & _M4) | ((h & three) << _U4)) - np.int8(32))
                out[lane + 32] = d1 * np.float32(
                    np.int8((c & _M4) | (((h >> np.uint8(2)) & three) << _U4)) - np.int8(32))
                out[lane + 64] = d2 * np.float32(
                    np.int8((a >> _U4) | (((h >> _U4) & three) << _U4)) - np.int8(32))
                out[lane + 96] = d3 * np.float32(
                    np.int8((c >> _U4) | (((h >> np.uint8(6)) & three) << _U4)) - np.int8(32))


@njit(**_JIT)
def decode_blocks(t, raw, p, count, buf, bits, f16):
    """Decode `count` consecutive blocks of type `t` starting at byte `p` into buf[0:count * block]."""
    if t == Q4_K:
        for b in range(count):
            _q4_k(raw, p + 144 * b, buf, 256 * b, f16)
    elif t == Q6_K:
        for b in range(count):
            _q6_k(raw, p + 210 * b, buf, 256 * b, f16)
    elif t == Q5_K:
        for b in range(count):
            _q5_k(raw, p + 176 * b, buf, 256 * b, f16)
    elif t == Q8_0:
        for b in range(count):
            _q8_0(raw, p + 34 * b, buf, 32 * b, f16)
    elif t == Q4_0:
        for b in range(count):
            _q4_0(raw, p + 18 * b, buf, 32 * b, f16)
    elif t == Q4_1:
        for b in range(count):
            _q4_1(raw, p + 20 * b, buf, 32 * b, f16)
    elif t == Q5_0:
        for b in range(count):
            _q5_0(raw, p + 22 * b, buf, 32 * b, f16)
    elif t == Q5_1:
        for b in range(count):
            _q5_1(raw, p + 24 * b, buf, 32 * b, f16)
    elif t == F16:
        for b in range(count):
            buf[b] = f16[_u16(raw, p + 2 * b)]
    elif t == BF16:
        for b in range(count):
            bits[b] = np.uint32(_u16(raw, p + 2 * b) << 16)
    elif t == F32:
        for b in range(count):
            bits[b] = np.uint32(_u16(raw, p + 4 * b) | (_u16(raw, p + 4 * b + 2) << 16))
