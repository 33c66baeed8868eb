"""A prefill chunk's passes over one head's delta-rule state, as explicit-vector LLVM code.

The chunked Gated DeltaNet (`gdn._gdn`) reads each head's state S (k_dim x v_dim float32) for
Sᵀk_i and Sᵀq_i of every row i of a chunk, and writes it once at the chunk's end,
e^{G_C}·S + Σ_j w_j k_j ⊗ u_j. As numba loops over columns inside loops over rows, every one of
those multiply-adds loaded and stored its sum: the stores, not the arithmetic, set the pace.
Here the sums of four rows (32 columns each) stay in vector registers across all of S's rows,
each state row read once for the four, and the update keeps 32 columns of a state row in
registers across the chunk's rows.

Every column's sum is the same chain of fused multiply-adds in the same order as those loops
(row by row from a zero, or from the decayed state), so the bits are theirs.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import _F32, _I64, LANES, _literal, _vec, _vfma, splat

_GROUPS = ((LANES, 2), (LANES, 1), (1, 1))  # (lanes a vector, vectors): 32 columns, then 16, then 1
ROWS = 4  # chunk rows a `chunk_sums` call takes at most


def _at(b: ir.IRBuilder, base: ir.Value, index: ir.Value, lanes: int) -> ir.Value:
    return b.bitcast(b.gep(base, [index]), _vec(_F32, lanes).as_pointer())


def _column_groups(b: ir.IRBuilder, width: ir.Value, body) -> None:
    """body(first column, lanes, vectors) over columns 0 .. width - 1, widest groups first."""
    done = ir.Constant(_I64, 0)
    for lanes, count in _GROUPS:
        span = ir.Constant(_I64, lanes * count)
        groups = b.udiv(b.sub(width, done), span)
        with cgutils.for_range(b, groups) as loop:
            body(b.add(done, b.mul(loop.index, span)), lanes, count)
        done = b.add(done, b.mul(groups, span))


def _c_float32(*arrays) -> bool:
    """Whether every argument is a C-contiguous float32 matrix (the code indexes raw pointers)."""
    return all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" and a.ndim == 2
               for a in arrays)


@intrinsic
def chunk_sums(typingctx, r, S, K, Q, i0, U, QS):
    """U[i] = Sᵀ K[i] and QS[i] = Sᵀ Q[i] for the r rows i0 .. i0 + r - 1 (r a literal, 1 .. ROWS):
    S (k_dim, v_dim); K, Q (chunk, k_dim); U, QS (chunk, v_dim)."""
    nr = _literal(r)
    if nr is None or not 1 <= nr <= ROWS or not _c_float32(S, K, Q, U, QS):
        return None
    sig = types.void(r, S, K, Q, i0, U, QS)

    def codegen(context, b, signature, args):
        s_a, k_a, q_a, u_a, qs_a = (context.make_array(signature.args[i])(context, b, args[i]) for i in (1, 2, 3, 5, 6))
        first = context.cast(b, args[4], signature.args[4], types.int64)
        depth, width = (b.extract_value(s_a.shape, i) for i in (0, 1))
        rows = [b.add(first, ir.Constant(_I64, i)) for i in range(nr)]

        def body(c0, lanes, count):
            vty = _vec(_F32, lanes)
            slots = [[cgutils.alloca_once(b, vty) for _ in range(2 * count)] for _ in range(nr)]
            for row in slots:
                for s in row:
                    b.store(ir.Constant(vty, [0.0] * lanes), s)
            with cgutils.for_range(b, depth) as loop:
                a = loop.index
                state = [b.load(_at(b, s_a.data, b.add(b.mul(a, width), b.add(c0, ir.Constant(_I64, j * lanes))),
                                    lanes), align=4) for j in range(count)]
                for i, row in zip(rows, slots, strict=True):
                    at = b.add(b.mul(i, depth), a)
                    ki = splat(b, b.load(b.gep(k_a.data, [at])), lanes)
                    qi = splat(b, b.load(b.gep(q_a.data, [at])), lanes)
                    for j, v in enumerate(state):
                        b.store(_vfma(b, ki, v, b.load(row[j])), row[j])
                        b.store(_vfma(b, qi, v, b.load(row[count + j])), row[count + j])
            for i, row in zip(rows, slots, strict=True):
                for j in range(count):
                    at = b.add(b.mul(i, width), b.add(c0, ir.Constant(_I64, j * lanes)))
                    b.store(b.load(row[j]), _at(b, u_a.data, at, lanes), align=4)
                    b.store(b.load(row[count + j]), _at(b, qs_a.data, at, lanes), align=4)

        _column_groups(b, width, body)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def chunk_update(typingctx, S, total, W, U, n):
    """S[a] = total·S[a] + Σ_{j < n} W[j, a]·U[j], the rows j in order: S (k_dim, v_dim) in
    place; W (chunk, k_dim) each row's weights; U (chunk, v_dim)."""
    if not _c_float32(S, W, U):
        return None
    sig = types.void(S, total, W, U, n)

    def codegen(context, b, signature, args):
        s_a, w_a, u_a = (context.make_array(signature.args[i])(context, b, args[i]) for i in (0, 2, 3))
        decay = context.cast(b, args[1], signature.args[1], types.float32)
        rows = context.cast(b, args[4], signature.args[4], types.int64)
        depth, width = (b.extract_value(s_a.shape, i) for i in (0, 1))

        def body(c0, lanes, count):
            vty = _vec(_F32, lanes)
            total_v = splat(b, decay, lanes)
            with cgutils.for_range(b, depth) as outer:
                a = outer.index
                cols = [b.add(b.mul(a, width), b.add(c0, ir.Constant(_I64, j * lanes))) for j in range(count)]
                slots = [cgutils.alloca_once(b, vty) for _ in range(count)]
                for s, col in zip(slots, cols, strict=True):
                    b.store(b.fmul(b.load(_at(b, s_a.data, col, lanes), align=4), total_v), s)
                with cgutils.for_range(b, rows) as inner:
                    j = inner.index
                    wj = splat(b, b.load(b.gep(w_a.data, [b.add(b.mul(j, depth), a)])), lanes)
                    for k, s in enumerate(slots):
                        at = b.add(b.mul(j, width), b.add(c0, ir.Constant(_I64, k * lanes)))
                        b.store(_vfma(b, wj, b.load(_at(b, u_a.data, at, lanes), align=4), b.load(s)), s)
                for s, col in zip(slots, cols, strict=True):
                    b.store(b.load(s), _at(b, s_a.data, col, lanes), align=4)

        _column_groups(b, width, body)
        return context.get_dummy_value()

    return sig, codegen
