"""Explicit-vector LLVM code for the ggml block formats, as numba intrinsics.

numba's auto-vectoriser widens small integers to 64-bit lanes and reduces every 32-weight
sub-block horizontally; both cost 4-5x against hand-written vectors. Here each block format is
written once as portable LLVM vector IR (no target intrinsics: the backend picks AVX-512, AVX2 or
NEON instructions for the CPU numba compiles for): a *decoder* that turns one block into float32
vectors of 16 lanes, exactly as `clover_runtime.quants.dequantize` defines the weights, and two users of
it: `dot_rows` (one weight row against R activation rows, R in 1, 2, 4, 8, vector accumulators
kept across the whole row) and `decode_row` (a weight row into a float32 buffer, for BLAS).

The ggml type and R reach the code generator as compile-time literals, so every (type, R) pair is
its own straight-line loop.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..quants.formats import BF16, F16, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F16, _F32 = ir.HalfType(), ir.FloatType()
_FAST = ("fast",)
LANES = 16

# bytes per block, weights per block; one loop iteration decodes `256 // block` blocks
GEOMETRY = {Q4_K: (144, 256), Q5_K: (176, 256), Q6_K: (210, 256), Q8_0: (34, 32), Q4_0: (18, 32),
            Q4_1: (20, 32), Q5_0: (22, 32), Q5_1: (24, 32), F16: (32, 16), BF16: (32, 16)}
DOT_ROWS = (8, 4, 2, 1)
_ACCUMULATORS = {1: 4, 2: 4, 4: 2, 8: 1}  # independent FMA chains per activation row


def _vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _vfma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """x * y + z, lane by lane, one rounding (llvm.fma on a float vector)."""
    n = x.type.count
    fnty = ir.FunctionType(x.type, [x.type] * 3)
    return b.call(cgutils.get_or_insert_function(b.module, fnty, f"llvm.fma.v{n}f32"), [x, y, z])


def splat(b: ir.IRBuilder, v: ir.Value, n: int = LANES) -> ir.Value:
    """The scalar v in all n lanes of a vector."""
    one = b.insert_element(ir.Constant(_vec(v.type, 1), None), v, ir.Constant(_I32, 0))
    return b.shuffle_vector(one, one, ir.Constant(_vec(_I32, n), [0] * n))


class _Block:
    """IR helpers bound to one block: byte loads at constant offsets from its start pointer."""

    def __init__(self, b: ir.IRBuilder, ptr: ir.Value):
        self.b, self.ptr = b, ptr

    def bytes(self, off: int, n: int) -> ir.Value:
        p = self.b.gep(self.ptr, [ir.Constant(_I64, off)])
        return self.b.load(self.b.bitcast(p, _vec(_I8, n).as_pointer()), align=1)

    def f16(self, off: int) -> ir.Value:
        p = self.b.gep(self.ptr, [ir.Constant(_I64, off)])
        h = self.b.load(self.b.bitcast(p, _F16.as_pointer()), align=1)
        return self.b.fpext(h, _F32)

    def u32(self, off: int) -> ir.Value:
        p = self.b.gep(self.ptr, [ir.Constant(_I64, off)])
        return self.b.load(self.b.bitcast(p, _I32.as_pointer()), align=1)

    # vector arithmetic
    def const(self, t: ir.Type, values: list[int] | list[float]) -> ir.Constant:
        return ir.Constant(_vec(t, len(values)), list(values))

    def splat(self, v: ir.Value, n: int = LANES) -> ir.Value:
        return splat(self.b, v, n)

    def shuffle(self, v: ir.Value, idx: list[int]) -> ir.Value:
        return self.b.shuffle_vector(v, v, ir.Constant(_vec(_I32, len(idx)), idx))

    def half(self, v: ir.Value, which: int) -> ir.Value:
        return self.shuffle(v, list(range(LANES * which, LANES * which + LANES)))

    def lane(self, v: ir.Value, i: int) -> ir.Value:
        return self.b.extract_element(v, ir.Constant(_I32, i))

    def and8(self, v: ir.Value, m: int) -> ir.Value:
        return self.b.and_(v, self.const(_I8, [m] * v.type.count))

    def shr8(self, v: ir.Value, s: int) -> ir.Value:
        return self.b.lshr(v, self.const(_I8, [s] * v.type.count))

    def shl8(self, v: ir.Value, s: int) -> ir.Value:
        return self.b.shl(v, self.const(_I8, [s] * v.type.count))

    def ufloat(self, v: ir.Value) -> ir.Value:
        return self.b.uitofp(v, _vec(_F32, v.type.count))

    def fma(self, a: ir.Value, s: ir.Value, c: ir.Value) -> ir.Value:
        """a * s + c with one rounding (s, c scalars)."""
        return _vfma(self.b, a, self.splat(s, a.type.count), self.splat(c, a.type.count))

    def mul(self, a: ir.Value, s: ir.Value) -> ir.Value:
        return self.b.fmul(a, self.splat(s, a.type.count))

    def split(self, v: ir.Value) -> list[ir.Value]:
        return [self.half(v, i) for i in range(v.type.count // LANES)]


# Decoders: one block -> list of <16 x float>, in weight order. Each follows the block layout as
# clover_runtime.quants.dequant writes it; min/offset terms use one fused multiply-add.


def _dec_q8_0(k: _Block) -> list[ir.Value]:
    d = k.f16(0)
    q = k.b.sitofp(k.bytes(2, 32), _vec(_F32, 32))
    return k.split(k.mul(q, d))


def _dec_q4_0(k: _Block) -> list[ir.Value]:
    d = k.f16(0)
    q = k.bytes(2, 16)
    off = k.b.fmul(d, ir.Constant(_F32, -8.0))
    return [k.fma(k.ufloat(k.and8(q, 15)), d, off), k.fma(k.ufloat(k.shr8(q, 4)), d, off)]


def _dec_q4_1(k: _Block) -> list[ir.Value]:
    d, m = k.f16(0), k.f16(2)
    q = k.bytes(4, 16)
    return [k.fma(k.ufloat(k.and8(q, 15)), d, m), k.fma(k.ufloat(k.shr8(q, 4)), d, m)]


def _q5_high(k: _Block, qh: ir.Value, first: int) -> ir.Value:
    """Bit (first + j) of the 32-bit field qh, as <16 x i8> holding 0 or 16."""
    v = k.b.lshr(k.splat(qh), k.const(_I32, list(range(first, first + 16))))
    v = k.b.shl(k.b.and_(v, k.const(_I32, [1] * 16)), k.const(_I32, [4] * 16))
    return k.b.trunc(v, _vec(_I8, 16))


def _dec_q5_0(k: _Block) -> list[ir.Value]:
    d = k.f16(0)
    qh = k.u32(2)
    q = k.bytes(6, 16)
    off = k.b.fmul(d, ir.Constant(_F32, -16.0))
    lo = k.b.or_(k.and8(q, 15), _q5_high(k, qh, 0))
    hi = k.b.or_(k.shr8(q, 4), _q5_high(k, qh, 16))
    return [k.fma(k.ufloat(lo), d, off), k.fma(k.ufloat(hi), d, off)]


def _dec_q5_1(k: _Block) -> list[ir.Value]:
    d, m = k.f16(0), k.f16(2)
    qh = k.u32(4)
    q = k.bytes(8, 16)
    lo = k.b.or_(k.and8(q, 15), _q5_high(k, qh, 0))
    hi = k.b.or_(k.shr8(q, 4), _q5_high(k, qh, 16))
    return [k.fma(k.ufloat(lo), d, m), k.fma(k.ufloat(hi), d, m)]


def _k_scales(k: _Block, d: ir.Value, dmin: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K block, times d and -dmin."""
    sc, mn = _k_scale_bytes(k)
    neg = k.b.fneg(dmin)
    return k.mul(k.ufloat(sc), d), k.mul(k.ufloat(mn), neg)


def _k_scale_bytes(k: _Block) -> tuple[ir.Value, ir.Value]:
    """The eight 6-bit scales and minimums of a Q4_K/Q5_K block, unpacked as <8 x i8> each
    (shared by the float kernels here and the integer ones in intdot)."""
    both = k_scales_of(k.b, k.bytes(0, 16))
    return k.shuffle(both, list(range(8))), k.shuffle(both, list(range(8, 16)))


def k_scales_of(b: ir.IRBuilder, heads: ir.Value) -> ir.Value:
    """The 6-bit scales and minimums of n Q4_K/Q5_K blocks from their first 16 bytes each (d,
    dmin, the 12 scale bytes), given as one <16n x i8>: a <16n x i8> of the n blocks' eight
    scales, then their eight minimums. The bytes shifted by 2 and by 4 once, then two byte
    permutes and a masked merge: the pick-and-shift per half it replaced (byte shifts by different
    amounts became three instructions each) was a quarter of the eight-row pass's time."""
    size = heads.type.count
    n = size // 16
    starts = [16 * i + 4 for i in range(n)]  # block i's scale byte j at 16i + 4 + j

    def splat(v: int) -> ir.Constant:
        return ir.Constant(_vec(_I8, size), [v] * size)

    def pick(a: ir.Value, c: ir.Value, idx: list[int]) -> ir.Value:
        return b.shuffle_vector(a, c, ir.Constant(_vec(_I32, size), idx))

    s2, s4 = b.lshr(heads, splat(2)), b.lshr(heads, splat(4))
    # scales: bytes 0-3 and 8-11's low bits; minimums: bytes 4-7, and 8-11's high nibble (from s4)
    low = [o + j for o in starts for j in (0, 1, 2, 3, 8, 9, 10, 11)]
    low += [v for o in starts for v in [o + 4 + j for j in range(4)] + [size + o + 8 + j for j in range(4)]]
    # the high two bits of scales and minimums 4-7: bytes 0-3 and 4-7 shifted right by 2
    high = [o + j for o in starts for j in (0, 0, 0, 0, 0, 1, 2, 3)]
    high += [o + j for o in starts for j in (4, 4, 4, 4, 4, 5, 6, 7)]
    keep = ir.Constant(_vec(_I8, size), ([63] * 4 + [15] * 4) * 2 * n)
    top = ir.Constant(_vec(_I8, size), ([0] * 4 + [48] * 4) * 2 * n)
    return b.or_(b.and_(pick(heads, s4, low), keep), b.and_(pick(s2, s2, high), top))


def _dec_q4_k(k: _Block) -> list[ir.Value]:
    d, dmin = k.f16(0), k.f16(2)
    dsc, dmn = _k_scales(k, d, dmin)
    out = []
    for g in range(4):
        q = k.bytes(16 + 32 * g, 32)
        for j, nib in ((2 * g, k.and8(q, 15)), (2 * g + 1, k.shr8(q, 4))):
            out += k.split(k.fma(k.ufloat(nib), k.lane(dsc, j), k.lane(dmn, j)))
    return out


def _dec_q5_k(k: _Block) -> list[ir.Value]:
    d, dmin = k.f16(0), k.f16(2)
    dsc, dmn = _k_scales(k, d, dmin)
    qh = k.bytes(16, 32)
    out = []
    for g in range(4):
        q = k.bytes(48 + 32 * g, 32)
        lo = k.b.or_(k.and8(q, 15), k.shl8(k.and8(k.shr8(qh, 2 * g), 1), 4))
        hi = k.b.or_(k.shr8(q, 4), k.shl8(k.and8(k.shr8(qh, 2 * g + 1), 1), 4))
        for j, v in ((2 * g, lo), (2 * g + 1, hi)):
            out += k.split(k.fma(k.ufloat(v), k.lane(dsc, j), k.lane(dmn, j)))
    return out


def _dec_q6_k(k: _Block) -> list[ir.Value]:
    d = k.f16(208)
    dsc = k.mul(k.b.sitofp(k.bytes(192, 16), _vec(_F32, 16)), d)
    minus32 = k.const(_F32, [-32.0] * 32)
    out = []
    for h in range(2):
        ql0, ql1, qh = k.bytes(64 * h, 32), k.bytes(64 * h + 32, 32), k.bytes(128 + 32 * h, 32)
        quarters = (
            k.b.or_(k.and8(ql0, 15), k.shl8(k.and8(qh, 3), 4)),
            k.b.or_(k.and8(ql1, 15), k.shl8(k.and8(k.shr8(qh, 2), 3), 4)),
            k.b.or_(k.shr8(ql0, 4), k.shl8(k.and8(k.shr8(qh, 4), 3), 4)),
            k.b.or_(k.shr8(ql1, 4), k.shl8(k.shr8(qh, 6), 4)),
        )
        for i, v in enumerate(quarters):
            centred = k.b.fadd(k.ufloat(v), minus32)  # exact: small integers
            for part, chunk in enumerate(k.split(centred)):
                out.append(k.mul(chunk, k.lane(dsc, 8 * h + 2 * i + part)))
    return out


def _dec_f16(k: _Block) -> list[ir.Value]:
    p = k.b.bitcast(k.ptr, _vec(_F16, 16).as_pointer())
    return [k.b.fpext(k.b.load(p, align=1), _vec(_F32, 16))]


def _dec_bf16(k: _Block) -> list[ir.Value]:
    p = k.b.bitcast(k.ptr, _vec(_I16, 16).as_pointer())
    wide = k.b.shl(k.b.zext(k.b.load(p, align=1), _vec(_I32, 16)), k.const(_I32, [16] * 16))
    return [k.b.bitcast(wide, _vec(_F32, 16))]


DECODERS = {Q8_0: _dec_q8_0, Q4_0: _dec_q4_0, Q4_1: _dec_q4_1, Q5_0: _dec_q5_0, Q5_1: _dec_q5_1,
            Q4_K: _dec_q4_k, Q5_K: _dec_q5_k, Q6_K: _dec_q6_k, F16: _dec_f16, BF16: _dec_bf16}


def _literal(ty: types.Type) -> int | None:
    """The value of a compile-time integer argument; None while numba tries the plain type."""
    return int(ty.literal_value) if isinstance(ty, types.IntegerLiteral) else None


def _i64(context, b: ir.IRBuilder, value: ir.Value, ty: types.Type) -> ir.Value:
    return context.cast(b, value, ty, types.int64)


def _block_loop(b: ir.IRBuilder, n_blocks: ir.Value, unroll: int, body) -> None:
    """body(block_index, count) for `unroll` blocks per iteration, then single blocks."""
    main = b.udiv(n_blocks, ir.Constant(_I64, unroll))
    with cgutils.for_range(b, main) as loop:
        body(b.mul(loop.index, ir.Constant(_I64, unroll)), unroll)
    if unroll > 1:
        done = b.mul(main, ir.Constant(_I64, unroll))
        with cgutils.for_range(b, b.sub(n_blocks, done)) as loop:
            body(b.add(done, loop.index), 1)


def _reduce(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    fnty = ir.FunctionType(_F32, [_F32, v.type])
    fn = cgutils.get_or_insert_function(b.module, fnty, f"llvm.vector.reduce.fadd.v{v.type.count}f32")
    return b.call(fn, [ir.Constant(_F32, -0.0), v], fastmath=_FAST)


@intrinsic
def dot_rows(typingctx, t, r, raw, p0, n_blocks, x, x_row0):
    """One weight row (`n_blocks` blocks of type `t` from byte p0 of raw) dotted with rows
    x_row0 .. x_row0 + r - 1 of the C-contiguous float32 matrix x: a tuple of r float32."""
    tv, nr = _literal(t), _literal(r)
    if tv not in DECODERS or nr not in _ACCUMULATORS:
        return None
    tsize, blk = GEOMETRY[tv]
    unroll = max(1, 256 // blk)
    n_acc = _ACCUMULATORS[nr]
    sig = types.UniTuple(types.float32, nr)(t, r, raw, p0, n_blocks, x, x_row0)

    def codegen(context, b, signature, args):
        raw_a = context.make_array(signature.args[2])(context, b, args[2])
        x_a = context.make_array(signature.args[5])(context, b, args[5])
        p0_v, nb_v, r0_v = (_i64(context, b, args[i], signature.args[i]) for i in (3, 4, 6))
        ncols = b.extract_value(x_a.shape, 1)
        rows = [b.gep(x_a.data, [b.mul(b.add(r0_v, ir.Constant(_I64, i)), ncols)]) for i in range(nr)]
        vty = _vec(_F32, LANES)
        accs = [[cgutils.alloca_once(b, vty) for _ in range(n_acc)] for _ in range(nr)]
        for row in accs:
            for a in row:
                b.store(ir.Constant(vty, [0.0] * LANES), a)

        def body(first, count):
            for u in range(count):
                blk_i = b.add(first, ir.Constant(_I64, u))
                ptr = b.gep(raw_a.data, [b.add(p0_v, b.mul(blk_i, ir.Constant(_I64, tsize)))])
                chunks = DECODERS[tv](_Block(b, ptr))
                col0 = b.mul(blk_i, ir.Constant(_I64, blk))
                for c, w in enumerate(chunks):
                    col = b.add(col0, ir.Constant(_I64, LANES * c))
                    slot = (u * len(chunks) + c) % n_acc
                    for i in range(nr):
                        xp = b.bitcast(b.gep(rows[i], [col]), vty.as_pointer())
                        xv = b.load(xp, align=4)
                        acc = accs[i][slot]
                        b.store(_vfma(b, w, xv, b.load(acc)), acc)

        _block_loop(b, nb_v, unroll, body)
        sums = []
        for row in accs:
            total = b.load(row[0])
            for a in row[1:]:
                total = b.fadd(total, b.load(a), flags=_FAST)
            sums.append(_reduce(b, total))
        return context.make_tuple(b, signature.return_type, sums)

    return sig, codegen


@intrinsic
def decode_row(typingctx, t, raw, p0, n_blocks, out, o0):
    """Decode `n_blocks` blocks of type `t` from byte p0 of raw into out[o0:o0 + n_blocks*block]."""
    tv = _literal(t)
    if tv not in DECODERS:
        return None
    tsize, blk = GEOMETRY[tv]
    unroll = max(1, 256 // blk)
    sig = types.void(t, raw, p0, n_blocks, out, o0)

    def codegen(context, b, signature, args):
        raw_a = context.make_array(signature.args[1])(context, b, args[1])
        out_a = context.make_array(signature.args[4])(context, b, args[4])
        p0_v, nb_v, o0_v = (_i64(context, b, args[i], signature.args[i]) for i in (2, 3, 5))
        base = b.gep(out_a.data, [o0_v])
        vty = _vec(_F32, LANES)

        def body(first, count):
            for u in range(count):
                blk_i = b.add(first, ir.Constant(_I64, u))
                ptr = b.gep(raw_a.data, [b.add(p0_v, b.mul(blk_i, ir.Constant(_I64, tsize)))])
                col0 = b.mul(blk_i, ir.Constant(_I64, blk))
                for c, w in enumerate(DECODERS[tv](_Block(b, ptr))):
                    dst = b.gep(base, [b.add(col0, ir.Constant(_I64, LANES * c))])
                    b.store(w, b.bitcast(dst, vty.as_pointer()), align=4)

        _block_loop(b, nb_v, unroll, body)
        return context.get_dummy_value()

    return sig, codegen
