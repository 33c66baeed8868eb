"""Fused dequantize-and-multiply: y = x · Wᵀ straight from the quantized bytes of W.

Two regimes, chosen per weight matrix by how many activation rows it meets:
- few rows (decode, diffusion previews, most experts): `dot_rows` walks each weight row once and
  multiplies every decoded 16-weight vector by up to 8 activation rows held in vector registers;
  one compiled call covers all (expert, output-row run) work items of a layer, in parallel;
- many rows (prefill of dense layers, busy experts): a tile of weight rows is decoded to float32
  in a compiled call and multiplied by BLAS, whose blocked sgemm is far faster at that size.
Neither keeps decoded weights beyond one tile. Results match dequantize-then-matmul to float32
round-off (tests: ≤ 1e-5 relative).
"""

from __future__ import annotations

import functools

import numpy as np

from ..quants.dequant import dequantize_rows
from ..quants.formats import (
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
    check_supported,
    row_bytes,
)
from .blas import pool
from .gemv_x8 import fused_form
from .intmatmul import INT_KERNELS, activation_block, integer_code
from .jit import current_threads, njit, prange
from .moe_rows import balanced_items, group
from .q8 import Q8Rows, quantize_rows
from .simd import GEOMETRY, decode_row, dot_rows
from .x8_choice import x8_pays

BLAS_ROWS = 16  # activation rows from which decode + sgemm beats the fused kernel
_TILE_BYTES = 1 << 20  # float32 bytes of one decoded tile of weight rows


@njit(inline="always")
def _grouped(t, raw, n_blocks, tsize, expert_bytes, xg, starts, item_expert, item_row0, item_row1, yg):
    """For each item (expert e, output rows o0..o1): rows starts[e]..starts[e+1] of xg times W_e."""
    rb = n_blocks * tsize
    for it in prange(item_expert.shape[0]):
        e = item_expert[it]
        s0 = starts[e]
        cnt = starts[e + 1] - s0
        for o in range(item_row0[it], item_row1[it]):
            p = e * expert_bytes + o * rb
            r = 0
            while cnt - r >= 8:
                v8 = dot_rows(t, 8, raw, p, n_blocks, xg, s0 + r)
                for i in range(8):
                    yg[s0 + r + i, o] = v8[i]
                r += 8
            if cnt - r >= 4:
                v4 = dot_rows(t, 4, raw, p, n_blocks, xg, s0 + r)
                for i in range(4):
                    yg[s0 + r + i, o] = v4[i]
                r += 4
            if cnt - r >= 2:
                v2 = dot_rows(t, 2, raw, p, n_blocks, xg, s0 + r)
                yg[s0 + r, o] = v2[0]
                yg[s0 + r + 1, o] = v2[1]
                r += 2
            if cnt - r >= 1:
                yg[s0 + r, o] = dot_rows(t, 1, raw, p, n_blocks, xg, s0 + r)[0]


@njit(parallel=True, cache=True, fastmath={"contract", "nsz", "reassoc"})
def _f32_rows(x, w, y):
    """y = x · wᵀ with every element one dot product of fixed order: a row's result does not
    depend on the rows computed with it (sgemm's blocking does, by float32 round-off)."""
    n, n_in = x.shape
    n_out = w.shape[0]
    for ob in prange((n_out + 3) // 4):
        o = 4 * ob
        if o + 4 <= n_out:  # four weight rows meet each activation row (read once for all four)
            w0, w1, w2, w3 = w[o], w[o + 1], w[o + 2], w[o + 3]
            for r in range(n):
                xr = x[r]
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for i in range(n_in):
                    xi = xr[i]
                    a0 += xi * w0[i]
                    a1 += xi * w1[i]
                    a2 += xi * w2[i]
                    a3 += xi * w3[i]
                y[r, o], y[r, o + 1], y[r, o + 2], y[r, o + 3] = a0, a1, a2, a3
        else:
            for oo in range(o, n_out):
                wr = w[oo]
                for r in range(n):
                    xr = x[r]
                    acc = np.float32(0.0)
                    for i in range(n_in):
                        acc += xr[i] * wr[i]
                    y[r, oo] = acc


@njit(inline="always")
def _decode_rows(t, raw, n_blocks, tsize, base, row0, out):
    """Weight rows row0 .. row0 + len(out) of the matrix at byte `base`, as float32 into out."""
    rb = n_blocks * tsize
    for i in prange(out.shape[0]):
        decode_row(t, raw, base + (row0 + i) * rb, n_blocks, out[i], 0)


# One pair of compiled entry points per type: the type is a compile-time constant inside each
# (numba.literally would do the same with one function, at ~30 ms of dispatch per call), and a
# type's code is compiled only when a model first uses it. The decoders run serially, without the
# GIL, on the tile pool of `blas.pool`.
_P = {"parallel": True, "cache": True}
_S = {"cache": True, "nogil": True}


@njit(**_P)
def _grouped_q4_k(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(Q4_K, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_q5_k(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(Q5_K, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_q6_k(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(Q6_K, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_q8_0(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(Q8_0, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_q4_0(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(Q4_0, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_q4_1(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(Q4_1, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_q5_0(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(Q5_0, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_q5_1(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(Q5_1, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_f16(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(F16, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_P)
def _grouped_bf16(raw, nb, ts, eb, xg, st, ie, r0, r1, yg):
    _grouped(BF16, raw, nb, ts, eb, xg, st, ie, r0, r1, yg)


@njit(**_S)
def _decode_q4_k(raw, nb, ts, base, row0, out):
    _decode_rows(Q4_K, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_q5_k(raw, nb, ts, base, row0, out):
    _decode_rows(Q5_K, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_q6_k(raw, nb, ts, base, row0, out):
    _decode_rows(Q6_K, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_q8_0(raw, nb, ts, base, row0, out):
    _decode_rows(Q8_0, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_q4_0(raw, nb, ts, base, row0, out):
    _decode_rows(Q4_0, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_q4_1(raw, nb, ts, base, row0, out):
    _decode_rows(Q4_1, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_q5_0(raw, nb, ts, base, row0, out):
    _decode_rows(Q5_0, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_q5_1(raw, nb, ts, base, row0, out):
    _decode_rows(Q5_1, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_f16(raw, nb, ts, base, row0, out):
    _decode_rows(F16, raw, nb, ts, base, row0, out)


@njit(**_S)
def _decode_bf16(raw, nb, ts, base, row0, out):
    _decode_rows(BF16, raw, nb, ts, base, row0, out)


_KERNELS = {
    Q4_K: (_grouped_q4_k, _decode_q4_k), Q5_K: (_grouped_q5_k, _decode_q5_k),
    Q6_K: (_grouped_q6_k, _decode_q6_k), Q8_0: (_grouped_q8_0, _decode_q8_0),
    Q4_0: (_grouped_q4_0, _decode_q4_0), Q4_1: (_grouped_q4_1, _decode_q4_1),
    Q5_0: (_grouped_q5_0, _decode_q5_0), Q5_1: (_grouped_q5_1, _decode_q5_1),
    F16: (_grouped_f16, _decode_f16), BF16: (_grouped_bf16, _decode_bf16),
}


def _readonly_bytes(raw: np.ndarray) -> np.ndarray:
    """A flat read-only uint8 view: one compiled specialization whether or not raw is an mmap."""
    v = np.asarray(raw)
    if v.dtype != np.uint8:
        v = np.ascontiguousarray(v).view(np.uint8)
    v = v.reshape(-1).view()
    v.flags.writeable = False
    return v


def _check_raw(raw: np.ndarray, t: int, n_matrices: int | None, n_out: int,
               n_in: int) -> tuple[np.ndarray, int]:
    v = _readonly_bytes(raw)
    per = n_out * row_bytes(t, n_in)
    if per == 0 or v.size % per or (n_matrices is not None and v.size != n_matrices * per):
        raise ValueError(f"{v.size} bytes are not whole {n_out}x{n_in} matrices of this type")
    return v, v.size // per


def _vector_code(t: int, n_in: int) -> bool:
    """Whether the vector kernels handle this type and row length (float rows need 16 | n_in)."""
    return t in GEOMETRY and n_in % GEOMETRY[t][1] == 0


class Matrices:
    """The quantized bytes of one or more (n_out, n_in) matrices of one type, checked once.

    Built once per weight tensor at model load (`prepare`), so a product does no per-call setup
    beyond what its activation rows need.
    """

    def __init__(self, raw: np.ndarray, t: int, n_out: int, n_in: int, n_matrices: int | None,
                 exact: bool = False):
        self.t, self.n_out, self.n_in = t, n_out, n_in
        self.raw, self.count = _check_raw(raw, t, n_matrices, n_out, n_in)
        self.expert_bytes = n_out * row_bytes(t, n_in)
        self.vector = _vector_code(t, n_in) and t in _KERNELS
        if self.vector:
            self.tsize, blk = GEOMETRY[t]
            self.n_blocks = n_in // blk
        self.integer = not exact and integer_code(t, n_in)  # 8-bit activations, integer dot products
        # the default kernels compute each row alone (a cached continuation equals a cold prefill)
        self.row_exact = not exact
        if self.integer:
            self.act_block = activation_block(t)
            self.int_blocks = n_in // GEOMETRY[t][1]
        self.x8 = fused_form(t)  # a decode step's rows eight to a pass (`gemv_x8`)
        self._dense_items: tuple[int, tuple] | None = None  # (threads, _items of matrix 0)

    def rows(self, e: int, row0: int, row1: int, out: np.ndarray | None = None) -> np.ndarray:
        """Weight rows row0..row1 of matrix e as float32 (decoded in a compiled call when possible)."""
        if self.t == F32:
            w = self.raw[e * self.expert_bytes:(e + 1) * self.expert_bytes].view(np.float32)
            return w.reshape(self.n_out, self.n_in)[row0:row1]
        if not self.vector:
            return dequantize_rows(self.raw, self.t, self.n_in,
                                   slice(e * self.n_out + row0, e * self.n_out + row1))
        out = np.empty((row1 - row0, self.n_in), np.float32) if out is None else out[:row1 - row0]
        _KERNELS[self.t][1](self.raw, self.n_blocks, self.tsize, e * self.expert_bytes, row0, out)
        return out

    def tiles(self, e: int, x: np.ndarray, y: np.ndarray) -> list:
        """Tasks computing y = x · W_eᵀ one tile of weight rows each (decode, then sgemm)."""
        tile = max(16, _TILE_BYTES // (4 * self.n_in))

        def task(r0: int, r1: int) -> None:
            y[:, r0:r1] = x @ self.rows(e, r0, r1).T

        return [(task, r0, min(self.n_out, r0 + tile)) for r0 in range(0, self.n_out, tile)]

    def grouped(self, xg: np.ndarray, starts: np.ndarray, experts: np.ndarray, yg: np.ndarray) -> None:
        """All rows of the given experts through the fused kernel, in one compiled call."""
        if not len(experts):
            return
        if not self.vector or self.t == F32:
            for e in experts:
                s0, s1 = starts[e], starts[e + 1]
                yg[s0:s1] = xg[s0:s1] @ self.rows(int(e), 0, self.n_out).T
            return
        item_e, row0, row1 = self._items(experts)
        _KERNELS[self.t][0](self.raw, self.n_blocks, self.tsize, self.expert_bytes, xg, starts,
                            item_e, row0, row1, yg)


    def int_grouped(self, xq: Q8Rows, starts: np.ndarray, experts: np.ndarray, dest: np.ndarray, y: np.ndarray,
                    items: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """All rows of the given experts through the integer kernel, in one compiled call; the
        result of grouped row i goes to row dest[i] of y."""
        if not len(experts):
            return
        item_e, row0, row1 = self._items(experts) if items is None else items
        INT_KERNELS[self.t](self._x8(), self.raw, self.int_blocks, self.tsize, self.expert_bytes, xq.q, xq.d, xq.sums,
                            starts, item_e, row0, row1, dest, y)

    def _x8(self) -> bool:
        """Whether one activation row takes the eight-row pass (`gemv_x8`): where this type has it
        and it measured faster on this machine at this thread count (`x8_choice`). Either way
        the bits are the same."""
        return self.x8 and x8_pays()

    def _items(self, experts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if len(experts) != 1 or experts[0] != 0:
            return _items(experts, self.n_out)
        return self._dense()

    def _dense(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The work items of matrix 0 alone, made once per thread count (a decode step makes ~10
        products a layer, each used to rebuild them)."""
        n = current_threads()
        if self._dense_items is None or self._dense_items[0] != n:
            self._dense_items = (n, _items(_EXPERT_0, self.n_out))
        return self._dense_items[1]

    def matmul(self, x: np.ndarray, q8: Q8Rows | None = None) -> np.ndarray:
        """x (n, n_in) float32 times matrix 0 transposed: (n, n_out) float32. `q8`: x already in
        8-bit blocks of this matrix's activation block (shared by the products of one input)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.n_in:
            raise ValueError(f"x must be (n, {self.n_in}), got {x.shape}")
        n = x.shape[0]
        y = np.empty((n, self.n_out), np.float32)
        if self.integer:
            xq = q8 if q8 is not None and q8.block == self.act_block else quantize_rows(x, self.act_block)
            starts, rows = _dense_rows(n)
            INT_KERNELS[self.t](self._x8(), self.raw, self.int_blocks, self.tsize, self.expert_bytes, xq.q, xq.d,
                                xq.sums, starts, *self._dense(), rows, y)
        elif self.t == F32 and self.row_exact:
            _f32_rows(x, self.rows(0, 0, self.n_out), y)
        elif self.t == F32:
            np.matmul(x, self.rows(0, 0, self.n_out).T, out=y)
        elif n >= BLAS_ROWS or not self.vector:
            _run_tiles(self.tiles(0, x, y))
        else:
            self.grouped(x, np.array([0, n], np.int64), _EXPERT_0, y)
        return y

    def moe(self, x: np.ndarray, ids: np.ndarray, routes: Routes | None = None,
            q8: Q8Rows | None = None) -> np.ndarray:
        """Rows of x through their routed matrices: see `moe_matmul`. `routes`: the grouping of
        `ids` made once for a layer's expert products; `q8`: x (n, n_in) already in 8-bit blocks."""
        routes = Routes(ids, self.count) if routes is None else routes
        if routes.count != self.count:
            raise ValueError(f"routes are for {routes.count} experts, this tensor has {self.count}")
        n, k = routes.n, routes.k
        n_in, n_out = self.n_in, self.n_out
        x = np.asarray(x, dtype=np.float32)
        if x.shape == (n, n_in):
            xrow = routes.order // k  # row i's k slots all read x[i]
            x2d = x
        elif x.shape == (n, k, n_in):
            xrow = routes.order
            x2d = x.reshape(n * k, n_in)
            q8 = None
        else:
            raise ValueError(f"x must be ({n}, {n_in}) or ({n}, {k}, {n_in}), got {x.shape}")
        starts, used, counts = routes.starts, routes.used, routes.counts
        if self.integer:
            if q8 is None or q8.block != self.act_block:
                q8 = quantize_rows(x2d, self.act_block)
            y = np.empty((n * k, n_out), np.float32)
            self.int_grouped(q8.take(xrow), starts, used, routes.order, y, routes.items(n_out))
            return y.reshape(n, k, n_out)
        yg = np.empty((n * k, n_out), np.float32)
        xg = np.ascontiguousarray(x2d[xrow])
        self.grouped(xg, starts, used[counts[used] < BLAS_ROWS], yg)
        tasks = []
        for e in used[counts[used] >= BLAS_ROWS]:
            s0, s1 = starts[e], starts[e + 1]
            tasks += self.tiles(int(e), xg[s0:s1], yg[s0:s1])
        _run_tiles(tasks)
        return routes.unsort(yg).reshape(n, k, n_out)


class Routes:
    """The rows routed to each expert, grouped once per routing: a layer's gate, up and down
    products share it (each product regrouping the same ids cost ~20 small numpy calls)."""

    __slots__ = ("count", "n", "k", "order", "starts", "used", "counts", "_items")

    def __init__(self, ids: np.ndarray, count: int) -> None:
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"ids must be (n, k), got {ids.shape}")
        self.count = count
        self.n, self.k = ids.shape
        # slots grouped by expert (stable), each expert's first slot, the experts with a slot
        self.counts, self.order, self.starts, self.used = group(ids, count)
        self._items: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def items(self, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kernel's work items for matrices of n_out rows (made once per size and thread count)."""
        key = (n_out, current_threads())
        got = self._items.get(key)
        if got is None:
            got = self._items[key] = _items(self.used, n_out)
        return got

    def unsort(self, yg: np.ndarray) -> np.ndarray:
        """Rows computed in grouped order back in slot order."""
        y = np.empty_like(yg)
        y[self.order] = yg
        return y


_EXPERT_0 = np.zeros(1, np.int64)


@functools.lru_cache(maxsize=64)
def _dense_rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The group starts [0, n] and the identity row map of an n-row dense product (read-only)."""
    starts, rows = np.array([0, n], np.int64), np.arange(n, dtype=np.int64)
    starts.flags.writeable = rows.flags.writeable = False
    return starts, rows


def prepare(raw: np.ndarray, ggml_type: int, out_features: int, in_features: int,
            n_matrices: int | None = 1, *, exact: bool = False) -> Matrices:
    """Check and wrap a weight tensor once: n_matrices (out, in) matrices (None: as many as fit).

    Quantized types with integer kernels (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) multiply with 8-bit
    activations unless `exact`, which keeps the float kernels (the reference: results equal
    dequantize-then-matmul to float32 round-off).
    """
    return Matrices(raw, check_supported(ggml_type), out_features, in_features, n_matrices, exact)


def _run_tiles(tasks: list) -> None:
    """Run decode + sgemm tasks on the tile pool, with BLAS itself on one thread."""
    n = current_threads()
    if n == 1 or len(tasks) == 1:
        for fn, *args in tasks:
            fn(*args)
        return
    for f in [pool(n).submit(fn, *args) for fn, *args in tasks]:
        f.result()


def _items(experts: np.ndarray, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split each expert's output rows into runs, enough of them to keep every thread busy."""
    return balanced_items(np.ascontiguousarray(experts, np.int64), n_out, current_threads())


def matmul(raw: np.ndarray, ggml_type: int, out_features: int, in_features: int, x: np.ndarray, *,
           exact: bool = False) -> np.ndarray:
    """x (n, in) float32 times the (out, in) weight stored in `raw`: returns (n, out) float32."""
    return prepare(raw, ggml_type, out_features, in_features, 1, exact=exact).matmul(x)


def moe_matmul(raw: np.ndarray, ggml_type: int, out_features: int, in_features: int, x: np.ndarray,
               ids: np.ndarray, *, exact: bool = False) -> np.ndarray:
    """All routed experts of all rows: one compiled call, plus one sgemm per expert with many rows.

    `raw` is the 3-D expert tensor (n_expert, out, in); `ids` (n, k) the experts chosen per row;
    `x` is (n, in), shared by a row's k experts (gate/up), or (n, k, in), one input per routed
    slot (down). Returns (n, k, out) float32: y[i, j] = W[ids[i, j]] · x[i] (or x[i, j]).
    """
    return prepare(raw, ggml_type, out_features, in_features, None, exact=exact).moe(x, ids)
