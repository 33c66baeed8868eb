"""The many-row kernel: two weight rows a 512-bit register against R activation rows.

A block's preview or commit multiplies 32 activation rows by every weight row. Done a weight row
at a time (`intdot.row_sums`), a Q8_0 or Q4_0 pair of blocks costs ~14 instructions per
activation row for 64 multiply-adds: the activations' signs flipped, two multiply-add steps,
the halves split, two conversions, two scale products and two fmas. Here weight rows 2t and
2t+1 share a register (row 2t's block in the low half, row 2t+1's in the high half) against one
activation block broadcast to both halves, so every step serves two rows, and what depends only
on the weights (their signs, scales, nibbles) is done once for all R activation rows. With
AVX-512 VNNI the integer sum is one `vpdpbusd` of unsigned weight bytes (Q8_0's plus 128,
Q4_0's nibbles) against the signed activations, the offset taken back by starting the sum at
minus (offset x the activations' sums of four), which depends only on the activations.

The bits are `intdot.idot_rows`'s: lane l of a row's integer sum gathers the same four products
(bytes 4l to 4l+3 of the block), integers add exactly in any grouping, and the float steps (one
conversion, one fma by d x dx per block and lane, in block order, then the same 8-lane sum
per row, eight rows at a time) are the same operations on the same values. `tests/test_kernels_pair_rows.py` checks it
bit for bit against the one-row pass on both integer forms.

Q4_K and Q5_K take the eight-row decode pass's step (`gemv_x8._pair_k`: two rows' sub-blocks a
register, their scales widened once, the float steps on sixteen lanes) once per activation row on
the same two blocks, so a block's nibbles, scales and minimums are unpacked once for all R rows
and every float step serves two weight rows; its bits are the decode pass's, which are
`idot_rows`'s. Two weight rows, not four: their unpacked block fills 13 registers. On the Zen 4
VM the LLVM code has a third fewer instructions per weight row than `idot_rows` with eight rows,
and pp512 on the 8-layer real-shape files takes 0.92-0.94x the time (benchmarks/RESULTS.md).

Q8_0, Q4_0, Q4_K and Q5_K on AVX-512BW hosts have this form; other types and hosts get a
`row_sums` pass per weight row, so callers need not ask.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..quants.formats import Q4_0, Q8_0
from .gemv_x8 import X8_TYPES, _join, _lanes, _pair_k, row_block
from .intdot import (
    INT_GEOMETRY,
    PREFETCH_BYTES,
    _dpbusd,
    _prefetch,
    _w32,
    _x86,
    activation_rows,
    row_sums,
    vnni,
    x86_avx512,
)
from .simd import _Block, _i64, _literal, _vec, _vfma

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
PAIR_TYPES = (Q8_0, Q4_0, *X8_TYPES)
# Weight rows per pass, two a register (the rest take the one-row pass): four of Q8_0/Q4_0, two of
# Q4_K/Q5_K, whose unpacked block (two rows' values, scales and minimums) fills 13 of the 32
# registers where eight activation rows' accumulators need eight more.
PAIR_WEIGHT_ROWS = (4, 2)
PAIR_ROWS = (8, 4, 2)  # activation rows per pass (a single row keeps the one-row or eight-row pass)


def pair_form(t: int) -> bool:
    """Whether type t has the two-rows-a-register form on this host (else two one-row passes)."""
    return t in PAIR_TYPES and x86_avx512()


def _unsigned(tv: int, k: _Block) -> ir.Value:
    """A block's 32 weights as <32 x u8> with the format's offset added: Q8_0's w + 128 (w xor
    0x80), Q4_0's nibbles as stored (w + 8)."""
    if tv == Q8_0:
        return k.b.xor(k.bytes(2, 32), k.const(_I8, [-128] * 32))
    q = k.bytes(2, 16)
    return k.b.shuffle_vector(k.and8(q, 15), k.shr8(q, 4), ir.Constant(_vec(_I32, 32), list(range(32))))


class _Weights:
    """Blocks b of weight rows 2t and 2t+1, prepared once for every activation row."""

    def __init__(self, tv: int, b: ir.IRBuilder, k0: _Block, k1: _Block):
        self.b = b
        halfs = _join(b, *(b.bitcast(k.bytes(0, 2), _vec(ir.HalfType(), 1)) for k in (k0, k1)))
        self.d = _lanes(b, b.fpext(halfs, _vec(_F32, 2)), [0] * 8 + [1] * 8)  # d(2t) x 8, d(2t+1) x 8
        if vnni():
            self.u = _join(b, _unsigned(tv, k0), _unsigned(tv, k1))
        else:
            w = _join(b, _w32(tv, k0), _w32(tv, k1))
            self.u = _x86(b, "llvm.abs.v64i8", _vec(_I8, 64), w, ir.Constant(ir.IntType(1), 0))
            self.negative = b.icmp_signed("<", w, ir.Constant(_vec(_I8, 64), [0] * 64))

    def isum(self, x: ir.Value, start: ir.Value | None) -> ir.Value:
        """The two rows' <8 x i32> sums against the broadcast activation block x (64 bytes);
        `start`: minus the offset times x's sums of four (VNNI)."""
        b = self.b
        if start is not None:
            return _dpbusd(b, start, self.u, x)
        sx = b.select(self.negative, b.sub(ir.Constant(_vec(_I8, 64), [0] * 64), x), x)
        return _x86(b, "llvm.x86.avx512.pmaddw.d.512", _vec(_I32, 16),
                    _x86(b, "llvm.x86.avx512.pmaddubs.w.512", _vec(_I16, 32), self.u, sx),
                    ir.Constant(_vec(_I16, 32), [1] * 32))


def _offset_start(b: ir.IRBuilder, tv: int, x: ir.Value) -> ir.Value:
    """Minus the unsigned weights' offset times x's sums of four: where `vpdpbusd` starts."""
    zero = ir.Constant(_vec(_I32, 16), [0] * 16)
    offset = ir.Constant(_vec(_I8, 64), [128 if tv == Q8_0 else 8] * 64)
    return b.sub(zero, _dpbusd(b, zero, offset, x))


def _pair_pass(b: ir.IRBuilder, tv: int, raw_data: ir.Value, p0: ir.Value, rb_v: ir.Value, nb_v: ir.Value,
               n_w: int, rows: list) -> list[ir.Value]:
    """Weight rows at bytes p0, p0 + rb_v, ... (n_w of them, two a register) against each of
    `rows`: the sums, weight row by weight row, each for every activation row."""
    tsize = INT_GEOMETRY[tv][0]
    f16 = _vec(_F32, 16)
    n_pairs = n_w // 2
    slots = [[cgutils.alloca_once(b, f16) for _ in rows] for _ in range(n_pairs)]
    for s in (s for pair in slots for s in pair):
        b.store(ir.Constant(f16, [0.0] * 16), s)
    starts = [b.add(p0, b.mul(rb_v, ir.Constant(_I64, j))) for j in range(n_w)]
    with cgutils.for_range(b, nb_v) as loop:
        blk = loop.index
        off = b.mul(blk, ir.Constant(_I64, tsize))
        ptrs = [b.gep(raw_data, [b.add(p, off)]) for p in starts]
        for ptr in ptrs:
            _prefetch(b, b.gep(ptr, [ir.Constant(_I64, 1024)]))
        ws = [_Weights(tv, b, _Block(b, ptrs[2 * j]), _Block(b, ptrs[2 * j + 1])) for j in range(n_pairs)]
        col = b.mul(blk, ir.Constant(_I64, 32))
        for i, row in enumerate(rows):
            x = row.values(col)
            x = _join(b, x, x)
            start = _offset_start(b, tv, x) if vnni() else None
            dx = b.insert_element(ir.Constant(_vec(_F32, 1), None), row.scale(blk), ir.Constant(_I32, 0))
            dx = _lanes(b, dx, [0] * 16)
            for w, pair in zip(ws, slots, strict=True):
                isum = w.isum(x, start)
                acc = _vfma(b, b.sitofp(isum, f16), b.fmul(w.d, dx), b.load(pair[i]))
                b.store(acc, pair[i])
    out = []
    for pair in slots:
        lo, hi = _reduce_halves(b, [b.load(s) for s in pair])
        out += lo + hi
    return out


def _k_pair_pass(b: ir.IRBuilder, tv: int, raw_data: ir.Value, p0: ir.Value, rb_v: ir.Value, nb_v: ir.Value,
                 rows: list) -> list[ir.Value]:
    """Q4_K/Q5_K weight rows at bytes p0 and p0 + rb_v against each of `rows`: the eight-row
    decode pass's step (`gemv_x8._pair_k`) once per activation row on the same two blocks, whose
    unpacking LLVM computes once (the same pure operations on the same loads)."""
    tsize = INT_GEOMETRY[tv][0]
    f16 = _vec(_F32, 16)
    slots = [cgutils.alloca_once(b, f16) for _ in rows]
    for s in slots:
        b.store(ir.Constant(f16, [0.0] * 16), s)
    with cgutils.for_range(b, nb_v) as loop:
        blk = loop.index
        off = b.mul(blk, ir.Constant(_I64, tsize))
        ptrs = [b.gep(raw_data, [b.add(p, off)]) for p in (p0, b.add(p0, rb_v))]
        for ptr in ptrs:
            for line in range(0, tsize, 64):
                _prefetch(b, b.gep(ptr, [ir.Constant(_I64, PREFETCH_BYTES + line)]), 2)
        k0, k1 = (_Block(b, ptr) for ptr in ptrs)
        for row, slot in zip(rows, slots, strict=True):
            xs, sums, dx4 = row_block(b, row, blk)
            b.store(_pair_k(tv, b, k0, k1, xs, sums, dx4, b.load(slot)), slot)
    lo, hi = _reduce_halves(b, [b.load(s) for s in slots])
    return lo + hi


def _two(b: ir.IRBuilder, x: ir.Value, y: ir.Value, first: list[int], second: list[int]) -> ir.Value:
    """The sum of two shuffles of x and y (lanes 16 and up name y's)."""
    return b.fadd(b.shuffle_vector(x, y, ir.Constant(_vec(_I32, 16), first)),
                  b.shuffle_vector(x, y, ir.Constant(_vec(_I32, 16), second)))


def _reduce_halves(b: ir.IRBuilder, accs: list[ir.Value]) -> tuple[list[ir.Value], list[ir.Value]]:
    """The sums of the low and of the high eight lanes of each <16 x float> in accs, each as
    `simd._reduce` adds eight lanes, ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) (float
    addition commutes exactly, so only this grouping matters; tests/test_kernels_pair_rows.py
    holds it to the one-row pass), but eight accumulators at a time in 21 vector steps where one
    at a time took ~7 each."""
    zero = ir.Constant(_vec(_F32, 16), [0.0] * 16)
    padded = accs + [zero] * (-len(accs) % 8)
    lo, hi = [], []
    for g in range(0, len(padded), 8):
        a = padded[g:g + 8]
        s = [_two(b, a[2 * i], a[2 * i + 1], [0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27],
                  [4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31]) for i in range(4)]
        t = [_two(b, s[2 * i], s[2 * i + 1], [v for k in range(4) for v in (4 * k, 4 * k + 1, 16 + 4 * k, 17 + 4 * k)],
                  [v for k in range(4) for v in (4 * k + 2, 4 * k + 3, 18 + 4 * k, 19 + 4 * k)]) for i in range(2)]
        u = _two(b, t[0], t[1], [2 * k for k in range(8)] + [16 + 2 * k for k in range(8)],
                 [2 * k + 1 for k in range(8)] + [17 + 2 * k for k in range(8)])
        # u's lanes: accumulators 0, 2, 1, 3 low halves, then their high halves; then 4-7 alike
        for i in range(min(8, len(accs) - g)):
            lane = 8 * (i // 4) + (0, 2, 1, 3)[i % 4]
            lo.append(b.extract_element(u, ir.Constant(_I32, lane)))
            hi.append(b.extract_element(u, ir.Constant(_I32, lane + 4)))
    return lo, hi


@intrinsic
def idot_pair(typingctx, t, w, r, raw, p0, row_bytes, n_blocks, xq, xd, xs, x_row0):
    """`w` (4 of Q8_0/Q4_0, 2 of Q4_K/Q5_K) consecutive weight rows, the first at byte p0 of raw, each `row_bytes` long
    (`n_blocks` blocks of type `t`), dotted with the 8-bit activation rows x_row0 .. x_row0 + r - 1:
    w x r float32, weight row by weight row, each with the bits `idot_rows` gives it."""
    tv, nw, nr = _literal(t), _literal(w), _literal(r)
    if tv not in PAIR_TYPES or nw not in PAIR_WEIGHT_ROWS or nr not in PAIR_ROWS:
        return None
    sig = types.UniTuple(types.float32, nw * nr)(t, w, r, raw, p0, row_bytes, n_blocks, xq, xd, xs, x_row0)

    def codegen(context, b, signature, args):
        raw_a = context.make_array(signature.args[3])(context, b, args[3])
        p0_v, rb_v, nb_v, r0_v = (_i64(context, b, args[i], signature.args[i]) for i in (4, 5, 6, 10))
        rows = activation_rows(context, b, signature, args, 7, r0_v, nr)
        if pair_form(tv) and tv in X8_TYPES:
            sums = [v for j in range(0, nw, 2) for v in _k_pair_pass(
                b, tv, raw_a.data, b.add(p0_v, b.mul(rb_v, ir.Constant(_I64, j))), rb_v, nb_v, rows)]
        elif pair_form(tv):
            sums = _pair_pass(b, tv, raw_a.data, p0_v, rb_v, nb_v, nw, rows)
        else:
            ps = [b.add(p0_v, b.mul(rb_v, ir.Constant(_I64, j))) for j in range(nw)]
            sums = [s for p in ps for s in row_sums(context, b, tv, raw_a.data, p, nb_v, rows)]
        return context.make_tuple(b, signature.return_type, sums)

    return sig, codegen
