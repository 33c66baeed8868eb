"""Integer dot products of quantized weight rows with 8-bit activations (`q8`), as numba intrinsics.

The llama.cpp way: the weight's small integers meet the activations' int8 values in an integer
multiply-accumulate (u8 x i8 pairs summed to i16, then i16 x i16 pairs summed to i32), and floats
appear once per block: the i32 sums are converted and scaled by (weight scale x activation scale).
A K-quant's 6- or 8-bit sub-block scales multiply in the integer domain; its minimums (Q4_K,
Q5_K) and offset (Q6_K's -32) come from the activations' block sums.

On x86 with AVX2 the two multiply-accumulate steps are the `vpmaddubsw` / `vpmaddwd`
instructions (LLVM does not form `vpmaddubsw` from plain IR, so it is called by name); elsewhere
the same arithmetic is written as portable vector IR (sign-extend, multiply, add pairs), which
the backend lowers to what the target has (NEON `smull`/`sadalp`, ...). No sum saturates: the
weight values are at most 63 and the activations at most 127 in magnitude.

Types: Q4_0, Q8_0 (activation blocks of 32), Q4_K, Q5_K, Q6_K (activation blocks of 256).
"""

from __future__ import annotations

import functools
import os

import numba
from llvmlite import binding as llb
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..quants.formats import Q4_0, Q4_K, Q5_K, Q6_K, Q8_0
from .simd import _Block, _block_loop, _i64, _k_scale_bytes, _literal, _reduce, _vec, _vfma

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()

# weight type -> (bytes per block, weights per block, activation block)
INT_GEOMETRY = {Q4_0: (18, 32, 32), Q8_0: (34, 32, 32), Q4_K: (144, 256, 256), Q5_K: (176, 256, 256),
                Q6_K: (210, 256, 256)}
INT_ROWS = (8, 4, 2, 1)  # activation rows per weight-row pass (the weights' vectors stay in registers)
# How far ahead of the block being multiplied its weight stream is prefetched. A decode step reads
# every weight once, from DRAM, and the hardware prefetcher alone kept a 2-thread step's 590 KB
# experts at ~31 GMAC/s against ~44 with a 2 KB hint (and the 248K-row head ~12 % faster). One
# thread has fewer misses in flight, so it needs the lines asked for earlier: 4 KB ahead on the
# Sapphire Rapids VM (the 8-layer decode at 1 thread 25.3-26.8 ms a token at 2 KB, 23.5-26.0 at
# 4 KB). On a Zen 4, 32 KB ahead into L2 (`prefetcht1`) read a 209 MB Q6_K matrix at 27-28 GB/s at
# one thread against 25-26 at 4 KB into L1, and the 8-layer Q4_K_M decode took 34-35 ms a token
# against 36 (2 threads: 20-21 against 21-26); pp512 moved by under 2 %. The prefetches past a
# matrix's end read up to 32 KB nobody uses (4 % of a Q6_K expert's down rows); the one-row pass
# does not know where its matrix ends, and the eight-row pass, which does, stops there.
PREFETCH_BYTES = 32768


@functools.cache
def x86_avx2() -> bool:
    """Whether the kernels are compiled for an x86 CPU with AVX2 (numba compiles for the host)."""
    if numba.config.CPU_NAME not in (None, "host"):
        return False
    return bool(llb.get_host_cpu_features().get("avx2"))


@functools.cache
def x86_avx512() -> bool:
    """Whether the integer kernels take two 32-value (sub-)blocks per 512-bit multiply-add (an
    AVX-512BW host, unless CLOVER_SIMD=avx2 keeps them at 256 bits). Integer sums are exact in any
    grouping and the float steps stay block by block, so both widths give the same bits; on a CPU
    with full-width 512-bit units (Zen 5, Sapphire Rapids) half as many multiply-adds run."""
    if not x86_avx2() or os.environ.get("CLOVER_SIMD", "").strip().lower() == "avx2":
        return False
    return bool(llb.get_host_cpu_features().get("avx512bw"))


@functools.cache
def vnni() -> bool:
    """Whether the integer kernels sum products by fours in one `vpdpbusd` (the Q8_0/Q4_0 pair
    kernel; the K-quant parts of the one-row and eight-row passes): an AVX-512 VNNI host, unless
    CLOVER_SIMD is avx2 or novnni. The same integers either way."""
    if os.environ.get("CLOVER_SIMD", "").strip().lower() == "novnni":
        return False
    return x86_avx512() and bool(llb.get_host_cpu_features().get("avx512vnni"))


def _x86(b: ir.IRBuilder, name: str, ret: ir.Type, *args: ir.Value) -> ir.Value:
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return b.call(cgutils.get_or_insert_function(b.module, fnty, name), list(args))


def _pairs(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    n = v.type.count
    even = b.shuffle_vector(v, v, ir.Constant(_vec(_I32, n // 2), list(range(0, n, 2))))
    odd = b.shuffle_vector(v, v, ir.Constant(_vec(_I32, n // 2), list(range(1, n, 2))))
    return b.add(even, odd)


def maddubs(b: ir.IRBuilder, u: ir.Value, s: ir.Value) -> ir.Value:
    """<32 x u8> times <32 x i8>, adjacent products summed: <16 x i16>."""
    if x86_avx2():
        return _x86(b, "llvm.x86.avx2.pmadd.ub.sw", _vec(_I16, 16), u, s)
    return _pairs(b, b.mul(b.zext(u, _vec(_I16, 32)), b.sext(s, _vec(_I16, 32))))


def madd(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """<16 x i16> times <16 x i16>, adjacent products summed: <8 x i32>."""
    if x86_avx2():
        return _x86(b, "llvm.x86.avx2.pmadd.wd", _vec(_I32, 8), x, y)
    return _pairs(b, b.mul(b.sext(x, _vec(_I32, 16)), b.sext(y, _vec(_I32, 16))))


def signed_pairs(b: ir.IRBuilder, w: ir.Value, x: ir.Value) -> ir.Value:
    """<32 x i8> times <32 x i8>, adjacent products summed: <16 x i16> (|w| with x's sign flipped
    where w < 0, so the unsigned-by-signed instruction applies)."""
    if x86_avx2():
        absw = _x86(b, "llvm.abs.v32i8", _vec(_I8, 32), w, ir.Constant(ir.IntType(1), 0))
        return maddubs(b, absw, _x86(b, "llvm.x86.avx2.psign.b", _vec(_I8, 32), x, w))
    return _pairs(b, b.mul(b.sext(w, _vec(_I16, 32)), b.sext(x, _vec(_I16, 32))))


def _splat16(k: _Block, v: ir.Value, lanes: list[int]) -> ir.Value:
    """<16 x i16> from byte lanes of v (zero-extended when unsigned, sign-extended otherwise)."""
    return k.shuffle(v, lanes)


def _k_scale_ints(k: _Block) -> tuple[ir.Value, ir.Value]:
    """The eight 6-bit scales and minimums of a Q4_K/Q5_K block, as <8 x i16> each."""
    sc, mn = _k_scale_bytes(k)
    return k.b.zext(sc, _vec(_I16, 8)), k.b.zext(mn, _vec(_I16, 8))


class _Row:
    """One activation row's pointers: int8 values, float32 block scales, int16 sums of 16."""

    def __init__(self, b: ir.IRBuilder, q: ir.Value, d: ir.Value, s: ir.Value):
        self.b, self.q, self.d, self.s = b, q, d, s

    def values(self, col: ir.Value) -> ir.Value:
        p = self.b.bitcast(self.b.gep(self.q, [col]), _vec(_I8, 32).as_pointer())
        return self.b.load(p, align=1)

    def values64(self, col: ir.Value) -> ir.Value:
        p = self.b.bitcast(self.b.gep(self.q, [col]), _vec(_I8, 64).as_pointer())
        return self.b.load(p, align=1)

    def scale(self, blk: ir.Value) -> ir.Value:
        return self.b.load(self.b.gep(self.d, [blk]))

    def sums(self, group: ir.Value) -> ir.Value:
        p = self.b.bitcast(self.b.gep(self.s, [group]), _vec(_I16, 16).as_pointer())
        return self.b.load(p, align=2)


def _f32x8(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return b.sitofp(v, _vec(_F32, 8))


def _scaled(k: _Block, acc: ir.Value, isum: ir.Value, scale: ir.Value) -> ir.Value:
    return _vfma(k.b, _f32x8(k.b, isum), k.splat(scale, 8), acc)


def _dpbusd(b: ir.IRBuilder, acc: ir.Value, u: ir.Value, s: ir.Value) -> ir.Value:
    """acc + (<64 x u8> u times <64 x i8> s, fours summed): <16 x i32>, exact here (no sum nears 2^31)."""
    i32x16 = _vec(_I32, 16)
    return _x86(b, "llvm.x86.avx512.vpdpbusd.512", i32x16, acc, b.bitcast(u, i32x16), b.bitcast(s, i32x16))


def _fours_scaled(b: ir.IRBuilder, u0: ir.Value, x0: ir.Value, u1: ir.Value, x1: ir.Value, lanes: list[int],
                  w: ir.Value) -> ir.Value:
    """The VNNI step of the K-quant passes: the sums of four of u0 · x0 and of u1 · x1 (`vpdpbusd`,
    <64 x u8> by <64 x i8>; each sum fits an i16, at most 4 x 63 x 127), their low i16 picked into
    dword pairs by `lanes` (indices into the two results as <32 x i16> each, the second from
    32), times the i16 scale pairs w in one `vpmaddwd`: <16 x i32>."""
    zero = ir.Constant(_vec(_I32, 16), [0] * 16)
    p0, p1 = (b.bitcast(_dpbusd(b, zero, u, x), _vec(_I16, 32)) for u, x in ((u0, x0), (u1, x1)))
    joined = b.shuffle_vector(p0, p1, ir.Constant(_vec(_I32, 32), lanes))
    return _x86(b, "llvm.x86.avx512.pmaddw.d.512", _vec(_I32, 16), joined, w)


# One weight block against R rows: each returns the R updated <8 x float> accumulators.
# `col` is the block's first weight index, `blk` its index in the row.

def _halves(b: ir.IRBuilder, wide: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The low and high <8 x i32> halves of a 512-bit <16 x i32> sum."""
    return tuple(b.shuffle_vector(wide, wide, ir.Constant(_vec(_I32, 8), list(range(h, h + 8)))) for h in (0, 8))


def _w32(tv: int, k: _Block) -> ir.Value:
    """A Q8_0/Q4_0 block's 32 weights as <32 x i8>."""
    if tv == Q8_0:
        return k.bytes(2, 32)
    q = k.bytes(2, 16)  # Q4_0: low nibbles are weights 0-15, high nibbles 16-31, both offset by 8
    w = k.b.shuffle_vector(k.and8(q, 15), k.shr8(q, 4), ir.Constant(_vec(_I32, 32), list(range(32))))
    return k.b.sub(w, k.const(_I8, [8] * 32))


def _blk32_pair(tv: int, k0: _Block, k1: _Block, rows: list[_Row], accs: list[ir.Value], col: ir.Value,
                blk: ir.Value) -> list[ir.Value]:
    """Two consecutive 32-value blocks as `_blk32` twice, their integer sums in one 512-bit
    multiply-add (AVX-512BW, which has no `vpsignb`: x's sign is flipped by a select where w < 0)
    and the float steps as before, block by block: the same bits."""
    b = k0.b
    w = b.shuffle_vector(_w32(tv, k0), _w32(tv, k1), ir.Constant(_vec(_I32, 64), list(range(64))))
    absw = _x86(b, "llvm.abs.v64i8", _vec(_I8, 64), w, ir.Constant(ir.IntType(1), 0))
    negative = b.icmp_signed("<", w, ir.Constant(_vec(_I8, 64), [0] * 64))
    d0, d1 = k0.f16(0), k1.f16(0)
    ones = ir.Constant(_vec(_I16, 32), [1] * 32)
    blk1 = b.add(blk, ir.Constant(_I64, 1))
    out = []
    for row, acc in zip(rows, accs, strict=True):
        x = row.values64(col)
        x = b.select(negative, b.sub(ir.Constant(_vec(_I8, 64), [0] * 64), x), x)
        wide = _x86(b, "llvm.x86.avx512.pmaddw.d.512", _vec(_I32, 16),
                    _x86(b, "llvm.x86.avx512.pmaddubs.w.512", _vec(_I16, 32), absw, x), ones)
        lo, hi = _halves(b, wide)
        acc = _scaled(k0, acc, lo, b.fmul(d0, row.scale(blk)))
        out.append(_scaled(k0, acc, hi, b.fmul(d1, row.scale(blk1))))
    return out


def _blk32(tv: int, k: _Block, rows: list[_Row], accs: list[ir.Value], col: ir.Value,
           blk: ir.Value) -> list[ir.Value]:
    b = k.b
    d = k.f16(0)
    w = _w32(tv, k)
    ones = k.const(_I16, [1] * 16)
    out = []
    for row, acc in zip(rows, accs, strict=True):
        isum = madd(b, signed_pairs(b, w, row.values(col)), ones)
        out.append(_scaled(k, acc, isum, b.fmul(d, row.scale(blk))))
    return out


def _q45k_values(tv: int, k: _Block) -> list[ir.Value]:
    """The eight 32-weight sub-blocks of a Q4_K/Q5_K block as <32 x u8> (0..15 or 0..31)."""
    vals = []
    qh = k.bytes(16, 32) if tv == Q5_K else None
    first = 16 if tv == Q4_K else 48
    for g in range(4):
        q = k.bytes(first + 32 * g, 32)
        lo, hi = k.and8(q, 15), k.shr8(q, 4)
        if qh is not None:
            lo = k.b.or_(lo, k.shl8(k.and8(k.shr8(qh, 2 * g), 1), 4))
            hi = k.b.or_(hi, k.shl8(k.and8(k.shr8(qh, 2 * g + 1), 1), 4))
        vals += [lo, hi]
    return vals


def _blk_q45k(tv: int, k: _Block, rows: list[_Row], accs: list[ir.Value], col: ir.Value,
              blk: ir.Value) -> list[ir.Value]:
    b = k.b
    d, dmin = k.f16(0), k.f16(2)
    sc, mn = _k_scale_ints(k)
    vals = _paired(b, _q45k_values(tv, k))
    scales = _part_scales(b, sc, lambda j, lane: j)
    mins = _splat16(k, mn, [j // 2 for j in range(16)])
    neg_dmin = b.fneg(dmin)
    out = []
    for row, acc in zip(rows, accs, strict=True):
        isum = _superblock_dot(b, row, col, vals, scales)
        dx = row.scale(blk)
        acc = _scaled(k, acc, isum, b.fmul(d, dx))
        msum = madd(b, row.sums(b.mul(blk, ir.Constant(_I64, 16))), mins)
        out.append(_scaled(k, acc, msum, b.fmul(neg_dmin, dx)))
    return out


def _superblock_dot(b: ir.IRBuilder, row: _Row, col: ir.Value, vals: list[ir.Value],
                    scales: list[ir.Value]) -> ir.Value:
    """Σ over a 256-value K-quant block of scale_j · (weights_j · x_j), eight 32-value parts, in
    <8 x i32> lanes (`_paired` values and `_part_scales` scales). The 512-bit forms take two parts
    a register and add the two halves at the end; with VNNI each pair of parts' sums of four
    come from one `vpdpbusd` and two such registers are joined, a lane's two sums as two i16, for
    one `vpmaddwd` by the scales: the same integers in every form."""
    if len(scales) == 2:
        xs = [row.values64(b.add(col, ir.Constant(_I64, 64 * g))) for g in range(4)]
        # i16 m: dword d = m // 2 takes lane d % 8 + 8 (m % 2) of register 2h + d // 8
        lanes = [32 * ((m // 2) // 8) + 2 * ((m // 2) % 8 + 8 * (m % 2)) for m in range(32)]
        halves = [_fours_scaled(b, vals[2 * h], xs[2 * h], vals[2 * h + 1], xs[2 * h + 1], lanes, scales[h])
                  for h in range(2)]
        return b.add(*_halves(b, b.add(*halves)))
    if len(vals) == 4:
        wide = None
        for g in range(4):
            x = row.values64(b.add(col, ir.Constant(_I64, 64 * g)))
            part = _x86(b, "llvm.x86.avx512.pmaddw.d.512", _vec(_I32, 16),
                        _x86(b, "llvm.x86.avx512.pmaddubs.w.512", _vec(_I16, 32), vals[g], x), scales[g])
            wide = part if wide is None else b.add(wide, part)
        return b.add(*_halves(b, wide))
    isum = None
    for j in range(8):
        x = row.values(b.add(col, ir.Constant(_I64, 32 * j)))
        part = madd(b, maddubs(b, vals[j], x), scales[j])
        isum = part if isum is None else b.add(isum, part)
    return isum


def _paired(b: ir.IRBuilder, vals: list[ir.Value]) -> list[ir.Value]:
    """The eight parts' values joined two by two for `_superblock_dot`'s 512-bit forms (parts 2g
    and 2g+1 meet 64 consecutive activations), on hosts where they run."""
    if not x86_avx512():
        return vals
    n = vals[0].type.count
    return [b.shuffle_vector(vals[2 * g], vals[2 * g + 1], ir.Constant(_vec(_I32, 2 * n), list(range(2 * n))))
            for g in range(4)]


def _part_scales(b: ir.IRBuilder, sc: ir.Value, index) -> list[ir.Value]:
    """The scales of a block's eight 32-value parts as `_superblock_dot` takes them on this host,
    from the <n x i16> sc: index(j, l) is the scale of part j's sum lane l (four values).
    Eight <16 x i16> (256-bit), four <32 x i16> of two parts (512-bit), or with VNNI two <32 x
    i16> whose dword l (< 8) holds the scales of parts 4h and 4h+1 at lane l, dword 8 + l those
    of parts 4h+2 and 4h+3."""
    def pick(idx: list[int]) -> ir.Value:
        return b.shuffle_vector(sc, sc, ir.Constant(_vec(_I32, len(idx)), idx))

    if not x86_avx512():
        return [pick([index(j, i // 2) for i in range(16)]) for j in range(8)]
    if not vnni():
        return [pick([index(2 * g + i // 16, (i % 16) // 2) for i in range(32)]) for g in range(4)]
    return [pick([index(4 * h + 2 * ((m // 2) // 8) + m % 2, (m // 2) % 8) for m in range(32)]) for h in range(2)]


def _blk_q6k(k: _Block, rows: list[_Row], accs: list[ir.Value], col: ir.Value,
             blk: ir.Value) -> list[ir.Value]:
    b = k.b
    d = k.f16(208)
    sc = b.sext(k.bytes(192, 16), _vec(_I16, 16))
    vals = []
    for h in range(2):
        ql0, ql1, qh = k.bytes(64 * h, 32), k.bytes(64 * h + 32, 32), k.bytes(128 + 32 * h, 32)
        vals += [
            b.or_(k.and8(ql0, 15), k.shl8(k.and8(qh, 3), 4)),
            b.or_(k.and8(ql1, 15), k.shl8(k.and8(k.shr8(qh, 2), 3), 4)),
            b.or_(k.shr8(ql0, 4), k.shl8(k.and8(k.shr8(qh, 4), 3), 4)),
            b.or_(k.shr8(ql1, 4), k.shl8(k.shr8(qh, 6), 4)),
        ]
    vals = _paired(b, vals)
    scales = _part_scales(b, sc, lambda j, lane: 2 * j + (lane >= 4))  # a scale per 16 values
    five = ir.Constant(_vec(_I32, 8), [5] * 8)
    out = []
    for row, acc in zip(rows, accs, strict=True):
        isum = _superblock_dot(b, row, col, vals, scales)
        offset = madd(b, row.sums(b.mul(blk, ir.Constant(_I64, 16))), sc)  # Σ scale · sum16
        isum = b.sub(isum, b.shl(offset, five))  # the values are stored +32
        out.append(_scaled(k, acc, isum, b.fmul(d, row.scale(blk))))
    return out


def _block(tv: int, k: _Block, rows, accs, col, blk):
    if tv in (Q4_0, Q8_0):
        return _blk32(tv, k, rows, accs, col, blk)
    if tv == Q6_K:
        return _blk_q6k(k, rows, accs, col, blk)
    return _blk_q45k(tv, k, rows, accs, col, blk)


def _prefetch(b: ir.IRBuilder, p: ir.Value, locality: int = 3) -> None:
    """Ask for the cache line at p (read; locality 3 keeps it in every level, `prefetcht0`; 2 and 1
    stop at L2 on x86): see PREFETCH_BYTES."""
    fnty = ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32])
    fn = cgutils.get_or_insert_function(b.module, fnty, "llvm.prefetch.p0i8")
    b.call(fn, [b.bitcast(p, _I8.as_pointer()), ir.Constant(_I32, 0), ir.Constant(_I32, locality),
                ir.Constant(_I32, 1)])


def row_sums(context, b: ir.IRBuilder, tv: int, raw_data: ir.Value, p0: ir.Value, nb_v: ir.Value,
             rows: list[_Row]) -> list[ir.Value]:
    """The code of one weight row (`nb_v` blocks of type tv from byte p0) dotted with each of
    `rows`: one float32 per activation row."""
    tsize, blk_w, _ = INT_GEOMETRY[tv]
    unroll = max(1, 256 // blk_w)
    vty = _vec(_F32, 8)
    slots = [cgutils.alloca_once(b, vty) for _ in rows]
    for s in slots:
        b.store(ir.Constant(vty, [0.0] * 8), s)

    def body(first, count):
        accs = [b.load(s) for s in slots]
        ptrs, cols, blks = [], [], []
        for u in range(count):
            blk_i = b.add(first, ir.Constant(_I64, u))
            ptr = b.gep(raw_data, [b.add(p0, b.mul(blk_i, ir.Constant(_I64, tsize)))])
            for line in range(0, tsize, 64):
                _prefetch(b, b.gep(ptr, [ir.Constant(_I64, PREFETCH_BYTES + line)]), 2)
            ptrs.append(ptr)
            cols.append(b.mul(blk_i, ir.Constant(_I64, blk_w)))
            blks.append(blk_i)
        u = 0
        while u < count:
            if tv in (Q4_0, Q8_0) and x86_avx512() and u + 1 < count:
                accs = _blk32_pair(tv, _Block(b, ptrs[u]), _Block(b, ptrs[u + 1]), rows, accs, cols[u], blks[u])
                u += 2
                continue
            accs = _block(tv, _Block(b, ptrs[u]), rows, accs, cols[u], blks[u])
            u += 1
        for s, a in zip(slots, accs, strict=True):
            b.store(a, s)

    _block_loop(b, nb_v, unroll, body)
    return [_reduce(b, b.load(s)) for s in slots]


def activation_rows(context, b: ir.IRBuilder, signature, args, first: int, row0: ir.Value, n: int) -> list[_Row]:
    """Pointers to activation rows row0 .. row0 + n - 1 of the (values, scales, sums) arrays at
    argument positions first .. first + 2."""
    qa, da, sa = (context.make_array(signature.args[i])(context, b, args[i]) for i in range(first, first + 3))
    nq, nd, ns = (b.extract_value(a.shape, 1) for a in (qa, da, sa))
    rows = []
    for i in range(n):
        ri = b.add(row0, ir.Constant(_I64, i))
        rows.append(_Row(b, b.gep(qa.data, [b.mul(ri, nq)]), b.gep(da.data, [b.mul(ri, nd)]),
                         b.gep(sa.data, [b.mul(ri, ns)])))
    return rows


@intrinsic
def idot_rows(typingctx, t, r, raw, p0, n_blocks, xq, xd, xs, x_row0):
    """One weight row (`n_blocks` blocks of type `t` from byte p0 of raw) dotted with the 8-bit
    activation rows x_row0 .. x_row0 + r - 1 (values xq, scales xd, sums xs): r float32."""
    tv, nr = _literal(t), _literal(r)
    if tv not in INT_GEOMETRY or nr not in INT_ROWS:
        return None
    sig = types.UniTuple(types.float32, nr)(t, r, raw, p0, n_blocks, xq, xd, xs, x_row0)

    def codegen(context, b, signature, args):
        raw_a = context.make_array(signature.args[2])(context, b, args[2])
        p0_v, nb_v, r0_v = (_i64(context, b, args[i], signature.args[i]) for i in (3, 4, 8))
        rows = activation_rows(context, b, signature, args, 5, r0_v, nr)
        return context.make_tuple(b, signature.return_type, row_sums(context, b, tv, raw_a.data, p0_v, nb_v, rows))

    return sig, codegen
