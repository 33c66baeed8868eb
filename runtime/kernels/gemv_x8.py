"""The decode-step kernel: eight weight rows against one 8-bit activation row per pass.

A decode step multiplies one activation row by every weight row once. Done a row at a time
(`intdot.idot_rows` with one activation row), a Q4_K block of 256 weights costs ~75 instructions on
AVX-512, two thirds of them not multiply-adds: the eight 6-bit scales and minimums unpacked, the
nibbles joined into 512-bit vectors, the float steps. Here the rows are taken two to a 512-bit
register (row 2t's 32 weights of a sub-block in the low half, row 2t+1's in the high half), so
one multiply-add serves two rows, one broadcast of the activations serves eight, and the float
steps run on sixteen lanes (two rows) at a time.

On AVX-512 VNNI hosts a sub-block's products are summed by fours in one `vpdpbusd` (each sum
fits an i16), two sub-blocks' sums of a lane are joined as a dword of two i16 and multiplied by
their two scales in one `vpmaddwd`: three multiply-add instructions for two sub-blocks and two
rows, not four (`CLOVER_SIMD=novnni` keeps the two-step form). On a Zen 4 that read a Q4_K matrix
~9 % faster at one thread (24.4 → 26.7 GB/s from L2).

The bits are `idot_rows`'s: lane l of a row's integer sum gathers the same products (bytes 4l to
4l+3 of every sub-block, scaled), integers add exactly in any grouping, and the float steps (one
conversion, fma by d x dx, then by -dmin x dx, per block and lane, then the same 8-lane reduction
per row) are the same operations on the same values. `tests/test_kernels_gemv_x8.py` checks it
bit for bit against the one-row pass.

Q4_K and Q5_K (the Q4_K_M mix's GDN qkv) on AVX-512BW hosts have this form; every other type and
host gets eight one-row passes (`intdot.row_sums`), so callers need not ask. Q6_K gained nothing
(its one-row pass already reads a 418 MB matrix at 33 GB/s on one thread; two rows a register read
it at 29), so it has none.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..quants.formats import Q4_K, Q5_K
from .intdot import (
    INT_GEOMETRY,
    _fours_scaled,
    _prefetch,
    _x86,
    activation_rows,
    row_sums,
    vnni,
    x86_avx512,
)
from .simd import _Block, _i64, _literal, _reduce, _vec, _vfma, k_scales_of

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
ROWS = 8  # weight rows per pass
# How far ahead of the eight rows being read their successors are asked for (whole groups of eight
# rows, at least this many bytes). One group ahead was 9 KB for the experts' gate/up rows but 2.3 KB
# for their 512-wide down rows, which then ran at 12 GB/s on one thread; 8 KB ahead, 19 GB/s. On
# a Zen 4, a 286 MB matrix of 2048-wide rows read at 20 GB/s 8 KB ahead and 24 GB/s 32 KB ahead
# (64 and 128 KB: the same), at two threads 41 and 47 GB/s.
LEAD_BYTES = 32768


def fused_form(t: int) -> bool:
    """Whether type t has the eight-row form on this host (else eight one-row passes)."""
    return t in X8_TYPES and x86_avx512()


def _join(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    n = lo.type.count
    return b.shuffle_vector(lo, hi, ir.Constant(_vec(_I32, 2 * n), list(range(2 * n))))


def _lanes(b: ir.IRBuilder, v: ir.Value, idx: list[int]) -> ir.Value:
    return b.shuffle_vector(v, v, ir.Constant(_vec(_I32, len(idx)), idx))


def _madd512(b: ir.IRBuilder, u: ir.Value, s: ir.Value, w: ir.Value) -> ir.Value:
    """(<64 x u8> u times <64 x i8> s, pairs summed) times <32 x i16> w, pairs summed: <16 x i32>."""
    return _x86(b, "llvm.x86.avx512.pmaddw.d.512", _vec(_I32, 16),
                _x86(b, "llvm.x86.avx512.pmaddubs.w.512", _vec(_I16, 32), u, s), w)


def _scale_bytes2(b: ir.IRBuilder, k0: _Block, k1: _Block) -> tuple[ir.Value, ir.Value]:
    """`simd.k_scales_of` two blocks: the 6-bit scales and minimums of rows 2t and 2t+1 as
    <16 x i8> each (row 2t's eight first), from one 256-bit vector of both blocks' first bytes."""
    both = k_scales_of(b, _join(b, k0.bytes(0, 16), k1.bytes(0, 16)))
    return _lanes(b, both, list(range(16))), _lanes(b, both, list(range(16, 32)))


def _widen(b: ir.IRBuilder, v: ir.Value, idx: list[int]) -> ir.Value:
    """<32 x i16> whose lane i is byte idx[i] of the <16 x i8> v, zero-extended: one in-lane byte
    shuffle (`vpshufb`, a control byte of 0x80 writes zero) of v repeated in each 128-bit lane. A
    generic shuffle became a two-source permute plus a register copy per vector."""
    wide = b.shuffle_vector(v, v, ir.Constant(_vec(_I32, 64), list(range(16)) * 4))
    control = ir.Constant(_vec(_I8, 64), [c for i in idx for c in (i, -128)])
    return b.bitcast(_x86(b, "llvm.x86.avx512.pshuf.b.512", _vec(_I8, 64), wide, control), _vec(_I16, 32))


def _group_dp(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, x_lo: ir.Value, x_hi: ir.Value, sc: ir.Value,
              g: int) -> ir.Value:
    """Sub-blocks 2g (lo) and 2g + 1 (hi) of rows 2t and 2t+1 times their scales, <16 x i32>
    (`intdot._fours_scaled`): dword l holds lane l's two sums of four, one per sub-block, and meets
    the pair (scale 2g, scale 2g + 1) of its row. Lane l gets the same integer as two
    `vpmaddubsw`/`vpmaddwd` steps."""
    pairs = [c for i in range(16) for c in (2 * i, 32 + 2 * i)]
    scales = _widen(b, sc, [8 * (i // 16) + 2 * g + i % 2 for i in range(32)])
    return _fours_scaled(b, lo, x_lo, hi, x_hi, pairs, scales)


def _pair_k(tv: int, b: ir.IRBuilder, k0: _Block, k1: _Block, xs: list[ir.Value], sums: ir.Value,
            dx4: ir.Value, acc: ir.Value) -> ir.Value:
    """One Q4_K or Q5_K block of rows 2t and 2t+1 into their accumulator (`intdot._blk_q45k`'s
    steps; Q5_K's fifth bits from its 32 bytes of high bits, as `intdot._q45k_values`)."""
    f16 = _vec(_F32, 16)
    sc, mn = _scale_bytes2(b, k0, k1)
    qh = _join(b, k0.bytes(16, 32), k1.bytes(16, 32)) if tv == Q5_K else None
    first = 16 if tv == Q4_K else 48
    parts = []  # <16 x i32> products of sub-blocks and scales, summed in chains below
    for g in range(4):
        q = _join(b, k0.bytes(first + 32 * g, 32), k1.bytes(first + 32 * g, 32))
        lo, hi = k0.and8(q, 15), k0.shr8(q, 4)
        if qh is not None:
            lo = b.or_(lo, k0.shl8(k0.and8(k0.shr8(qh, 2 * g), 1), 4))
            hi = b.or_(hi, k0.shl8(k0.and8(k0.shr8(qh, 2 * g + 1), 1), 4))
        if vnni():
            parts.append(_group_dp(b, lo, hi, xs[2 * g], xs[2 * g + 1], sc, g))
        else:
            parts += [_madd512(b, v, xs[j], _widen(b, sc, [j] * 16 + [8 + j] * 16))
                      for j, v in ((2 * g, lo), (2 * g + 1, hi))]
    chains = [parts[i] for i in range(len(parts) // 2)]  # half as many chains as parts: each adds two
    for i, part in enumerate(parts[len(chains):]):
        chains[i] = b.add(chains[i], part)
    while len(chains) > 1:
        chains = [b.add(chains[i], chains[i + 1]) for i in range(0, len(chains), 2)]
    isum = chains[0]
    mins = _widen(b, mn, [i // 2 for i in range(16)] + [8 + i // 2 for i in range(16)])
    msum = _x86(b, "llvm.x86.avx512.pmaddw.d.512", _vec(_I32, 16), sums, mins)
    halfs = _join(b, *(b.bitcast(k.bytes(0, 4), _vec(ir.HalfType(), 2)) for k in (k0, k1)))
    dm = b.fmul(b.fpext(halfs, _vec(_F32, 4)), dx4)  # d0·dx, dmin0·dx, d1·dx, dmin1·dx
    acc = _vfma(b, b.sitofp(isum, f16), _lanes(b, dm, [0] * 8 + [2] * 8), acc)
    return _vfma(b, b.sitofp(msum, f16), b.fneg(_lanes(b, dm, [1] * 8 + [3] * 8)), acc)


X8_TYPES = (Q4_K, Q5_K)


def row_block(b: ir.IRBuilder, row, blk: ir.Value) -> tuple[list[ir.Value], ir.Value, ir.Value]:
    """What `_pair_k` takes of an activation row's block blk: its eight 32-value parts each
    repeated in both halves of a register, its sums of 16 likewise, its scale four times."""
    col = b.mul(blk, ir.Constant(_I64, 256))
    xs = []
    for j in range(8):
        x = row.values(b.add(col, ir.Constant(_I64, 32 * j)))
        xs.append(_join(b, x, x))
    sums = row.sums(b.mul(blk, ir.Constant(_I64, 16)))
    dx = row.scale(blk)
    dx4 = _lanes(b, b.insert_element(ir.Constant(_vec(_F32, 1), None), dx, ir.Constant(_I32, 0)), [0] * 4)
    return xs, _join(b, sums, sums), dx4


def _pairs(context, b: ir.IRBuilder, tv: int, raw_data: ir.Value, starts: list[ir.Value], rb_v: ir.Value,
           nb_v: ir.Value, end_v: ir.Value, then_v: ir.Value, size_v: ir.Value, row) -> list[ir.Value]:
    """Eight rows of type tv (byte offsets `starts`, `rb_v` bytes apart) dotted with one activation
    row, two rows a register. While it reads block b of its eight rows it asks for block b of the
    eight rows LEAD_BYTES or more ahead as consecutive lines, so the memory sees one sequential
    stream ahead: a 4 KB lead per row (`intdot.PREFETCH_BYTES`) landed in the rows this pass was
    already reading and left the next pass cold (Q4_K at 1 thread: 1.11x the one-row pass, 1.17x
    this way). The lines stop at L2 (`prefetcht1`): on a Zen 4 the same requests into L1
    (`prefetcht0`, 18 a block) halved the pass's speed from DRAM (10 against 20 GB/s at 1
    thread), while the one-row pass, with 3 a block, is unchanged by either. Near the matrix's
    end the lines asked for are those of the rows read next (`then`, the next expert's), so an
    expert's first 32 KB are not read cold."""
    tsize = INT_GEOMETRY[tv][0]
    f16 = _vec(_F32, 16)
    slots = [cgutils.alloca_once(b, f16) for _ in range(ROWS // 2)]
    for s in slots:
        b.store(ir.Constant(f16, [0.0] * 16), s)
    group = b.mul(rb_v, ir.Constant(_I64, ROWS))
    ahead = b.sdiv(b.add(ir.Constant(_I64, LEAD_BYTES), b.sub(group, ir.Constant(_I64, 1))), group)
    lead = b.mul(group, ahead)
    with cgutils.for_range(b, nb_v) as loop:
        blk = loop.index
        blocks = [_Block(b, b.gep(raw_data, [b.add(p0, b.mul(blk, ir.Constant(_I64, tsize)))])) for p0 in starts]
        nxt = b.add(b.add(starts[0], lead), b.mul(blk, ir.Constant(_I64, ROWS * tsize)))
        span = ir.Constant(_I64, ROWS * tsize)
        inside = b.icmp_signed("<=", b.add(nxt, span), end_v)
        beyond = b.add(then_v, b.sub(nxt, end_v))  # the same distance into the rows read next
        onward = b.and_(b.icmp_signed(">=", then_v, ir.Constant(_I64, 0)),
                        b.icmp_signed("<=", b.add(beyond, span), size_v))
        at = b.select(inside, nxt, beyond)
        with b.if_then(b.or_(inside, onward)):
            for line in range(0, ROWS * tsize, 64):
                _prefetch(b, b.gep(raw_data, [b.add(at, ir.Constant(_I64, line))]), 2)
        xs, sums, dx4 = row_block(b, row, blk)
        for t in range(ROWS // 2):
            acc = _pair_k(tv, b, blocks[2 * t], blocks[2 * t + 1], xs, sums, dx4, b.load(slots[t]))
            b.store(acc, slots[t])
    out = []
    for s in slots:
        acc = b.load(s)
        out += [_reduce(b, _lanes(b, acc, list(range(8 * h, 8 * h + 8)))) for h in (0, 1)]
    return out


@intrinsic
def idot_x8(typingctx, t, raw, p0, row_bytes, n_blocks, end, then, xq, xd, xs, x_row):
    """Eight consecutive weight rows of type `t` (the first at byte p0 of raw, each `row_bytes`
    long, `n_blocks` blocks) dotted with the 8-bit activation row x_row: eight float32, each with
    the bits `idot_rows` gives that row. `end`: the byte where the rows' matrix ends (no line
    past it is prefetched: an expert's successor in the file is seldom the next one used);
    `then`: the byte where the rows read after it begin (the next expert's), whose lines are
    asked for instead, or -1."""
    tv = _literal(t)
    if tv not in INT_GEOMETRY:
        return None
    sig = types.UniTuple(types.float32, ROWS)(t, raw, p0, row_bytes, n_blocks, end, then, xq, xd, xs, x_row)

    def codegen(context, b, signature, args):
        raw_a = context.make_array(signature.args[1])(context, b, args[1])
        p0_v, rb_v, nb_v, end_v, then_v, r_v = (_i64(context, b, args[i], signature.args[i])
                                                for i in (2, 3, 4, 5, 6, 10))
        row = activation_rows(context, b, signature, args, 7, r_v, 1)[0]
        starts = [b.add(p0_v, b.mul(rb_v, ir.Constant(_I64, j))) for j in range(ROWS)]
        if fused_form(tv):
            sums = _pairs(context, b, tv, raw_a.data, starts, rb_v, nb_v, end_v, then_v, raw_a.nitems, row)
        else:
            sums = [row_sums(context, b, tv, raw_a.data, p, nb_v, [row])[0] for p in starts]
        return context.make_tuple(b, signature.return_type, sums)

    return sig, codegen
