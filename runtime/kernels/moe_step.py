"""A decode row's whole MoE in one compiled call: routing, the routed experts' gate/up products,
SwiGLU, their down products, the shared expert and the weighted sum.

Done step by step from Python (`engine.moe`), one decode row's MoE made ~20 compiled calls and
~150 small Python ones between its weight products: ~0.1 ms a layer with warm caches and ~0.2 ms
in a decode step, where streaming 15 MB of weights a layer has evicted the interpreter's data,
against ~0.8 ms of products at one thread. Here every step after the router's product runs in one
call, calling the same compiled functions the step-by-step path calls (`moe_rows`' routing,
SwiGLU and weighted sum, `q8`'s quantizer, `intmatmul`'s grouped integer products) on the same
values in the same order, so a row gets the same bits either way: a verified block's commit
(many rows, step by step) still rounds as AR's one-row steps do.

It serves one row whose experts' gate and up are one matrix (read into memory and fused at load,
or fused in the file) and whose shared expert, if any, is fused too, all with integer kernels;
anything else takes the step-by-step path (`Plan.build` says which).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..quants.formats import Q4_0, Q4_K, Q5_K, Q6_K, Q8_0
from .intmatmul import _int_q4_0, _int_q4_k, _int_q5_k, _int_q6_k, _int_q8_0
from .jit import current_threads, njit
from .matmul import _f32_rows
from .moe_rows import _group, _mix_serial, _route, _swiglu_serial, balanced_items
from .norm import _norm_serial
from .q8 import SUM_GROUP, _quantize_serial
from .x8_choice import x8_pays


@njit(cache=True)
def _product(t, x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, y):
    """The grouped integer product of weight type t (a run-time choice among the compiled ones)."""
    if t == Q4_K:
        _int_q4_k(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, y)
    elif t == Q5_K:
        _int_q5_k(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, y)
    elif t == Q6_K:
        _int_q6_k(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, y)
    elif t == Q8_0:
        _int_q8_0(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, y)
    else:
        _int_q4_0(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, y)


@njit(cache=True)
def _quantized(x, block):
    """`q8.Q8Rows` of x's rows, as (values, scales, sums of 16)."""
    n, n_in = x.shape
    q = np.empty((n, n_in), np.int8)
    d = np.empty((n, n_in // block), np.float32)
    sums = np.empty((n, n_in // SUM_GROUP), np.int16)
    _quantize_serial(x, block, q, d, sums)
    return q, d, sums


@njit(cache=True)
def _taken(q, d, sums, rows):
    """`Q8Rows.take`: the given rows in that order."""
    return q[rows], d[rows], sums[rows]


@njit(cache=True)
def _dense(t, x8, raw, nb, ts, n_out, block, x, threads):
    """x (1, n_in) times matrix 0 of raw: (1, n_out), as `Matrices.matmul`."""
    q, d, s = _quantized(x, block)
    y = np.empty((1, n_out), np.float32)
    experts = np.zeros(1, np.int64)
    ie, r0, r1 = balanced_items(experts, n_out, threads)
    starts = np.array([0, 1], np.int64)
    _product(t, x8, raw, nb, ts, raw.shape[0], q, d, s, starts, ie, r0, r1, np.zeros(1, np.int64), y)
    return y


@njit(cache=True)
def _moe_row(h, logits, k, threads,
             gu_t, gu_x8, gu_raw, gu_nb, gu_ts, gu_eb, gu_out, gu_blk,
             dn_t, dn_x8, dn_raw, dn_nb, dn_ts, dn_eb, dn_out, dn_blk,
             sh, su_t, su_x8, su_raw, su_nb, su_ts, su_out, su_blk,
             sd_t, sd_x8, sd_raw, sd_nb, sd_ts, sd_out, sd_blk,
             gate_inp, gated, out):
    """`engine.moe.moe` of the one row h (1, hidden) given its router logits (1, n_expert):
    writes out (1, hidden), returns the experts used, ascending."""
    n_expert = logits.shape[1]
    ids = np.empty((1, k), np.int64)
    weights = np.empty((1, k), np.float32)
    _route(logits, k, ids, weights)
    counts = np.empty(n_expert, np.int64)
    order = np.empty(k, np.int64)
    starts = np.empty(n_expert + 1, np.int64)
    n_used = _group(ids.reshape(-1), n_expert, counts, order, starts)
    used = np.empty(n_used, np.int64)
    j = 0
    for e in range(n_expert):
        if counts[e]:
            used[j] = e
            j += 1
    # gate | up of every slot (all read the one row), SwiGLU, then each slot's down product
    q, d, s = _quantized(h, gu_blk)
    gq, gd, gs = _taken(q, d, s, np.zeros(k, np.int64))
    ie, r0, r1 = balanced_items(used, gu_out, threads)
    gu = np.empty((k, gu_out), np.float32)
    _product(gu_t, gu_x8, gu_raw, gu_nb, gu_ts, gu_eb, gq, gd, gs, starts, ie, r0, r1, order, gu)
    f = gu_out // 2
    g3 = gu.reshape(1, k, gu_out)
    act = np.empty((1, k, f), np.float32)
    _swiglu_serial(g3[:, :, :f], g3[:, :, f:], act)
    q, d, s = _quantized(act.reshape(k, f), dn_blk)
    dq, dd, ds = _taken(q, d, s, order)
    ie, r0, r1 = balanced_items(used, dn_out, threads)
    down = np.empty((k, dn_out), np.float32)
    _product(dn_t, dn_x8, dn_raw, dn_nb, dn_ts, dn_eb, dq, dd, ds, starts, ie, r0, r1, order, down)
    shared = np.empty((0, 0), np.float32)
    if sh:
        su = _dense(su_t, su_x8, su_raw, su_nb, su_ts, su_out, su_blk, h, threads)
        sf = su_out // 2
        s3 = su.reshape(1, 1, su_out)
        sact = np.empty((1, 1, sf), np.float32)
        _swiglu_serial(s3[:, :, :sf], s3[:, :, sf:], sact)
        shared = _dense(sd_t, sd_x8, sd_raw, sd_nb, sd_ts, sd_out, sd_blk, sact.reshape(1, sf), threads)
    _mix_serial(weights, down.reshape(1, k, dn_out), shared, h, gate_inp, gated, out)
    return used


@njit(cache=True)
def _residual_moe(x, y, ot, ox8, oraw, onb, ots, o_out, oblk, eps, threads, moe_norm_w, router_w, k, moe,
                  gate_inp, gated):
    """The end of a decode row's layer, as `steps.causal_layer` takes it, shared by the GDN and
    attention layers: x1 = x + the output projection (ot...oblk) of the mixer's row y, then
    x1 + MoE(RMSNorm(x1)), the router's float32 product included. `moe`: the products'
    arguments as one tuple (`Plan.arguments`), so the one-call layers pass them through without
    naming them. Returns the new row (1, hidden)."""
    o = _dense(ot, ox8, oraw, onb, ots, o_out, oblk, y, threads)
    hidden = x.shape[1]
    x1 = np.empty((1, hidden), np.float32)
    for i in range(hidden):
        x1[0, i] = x[0, i] + o[0, i]
    h2 = np.empty((1, hidden), np.float32)
    _norm_serial(x1, moe_norm_w, eps, h2)
    logits = np.empty((1, router_w.shape[0]), np.float32)
    _f32_rows(h2, router_w, logits)
    out = np.empty((1, hidden), np.float32)
    _moe_row(h2, logits, k, threads, *moe, gate_inp, gated, out)
    for i in range(hidden):
        x1[0, i] += out[0, i]
    return x1


def float_router(router: Any) -> np.ndarray | None:
    """The router's (n_expert, hidden) float32 rows where the step-by-step path multiplies them
    with `matmul._f32_rows` (a float32 matrix, row-exact kernels), else None."""
    if getattr(router, "t", None) == 0 and getattr(router, "row_exact", False) and router.count == 1:
        return router.rows(0, 0, router.n_out)
    return None


def integer_matrix(m: Any, stack: bool = False) -> bool:
    """Whether m is a prepared matrix with integer kernels: one matrix (what `_dense` multiplies),
    or with `stack`, any number of them (an expert stack, what `_product` multiplies)."""
    return getattr(m, "integer", False) and hasattr(m, "int_blocks") and (stack or m.count == 1)


_NO_MATRIX = np.zeros(0, np.uint8)
_NO_MATRIX.flags.writeable = False  # the prepared matrices' type: one compiled form
_NO_GATE = np.zeros(0, np.float32)


def _fields(m: Any) -> tuple:
    """A prepared matrix's product arguments: type, eight-row flag (filled per call), bytes,
    blocks a row, block bytes, bytes a matrix, rows, activation block."""
    return (m.t, m.x8, m.raw, m.int_blocks, m.tsize, m.expert_bytes, m.n_out, m.act_block)


class Plan:
    """One layer's MoE arguments for `_moe_row`, gathered once at load."""

    __slots__ = ("k", "routed", "down", "shared", "gate_inp", "gated")

    def __init__(self, k: int, gate_up: Any, down: Any, shared_gate_up: Any, shared_down: Any,
                 gate_inp: np.ndarray | None) -> None:
        self.k = k
        self.routed = _fields(gate_up)
        self.down = _fields(down)
        self.shared = (_fields(shared_gate_up) + _fields(shared_down)) if shared_down is not None else None
        self.gated = shared_down is not None and gate_inp is not None
        self.gate_inp = np.ascontiguousarray(gate_inp, np.float32) if self.gated else _NO_GATE

    @staticmethod
    def build(k: int, gate_up: Any, down: Any, shared_gate_up: Any, shared_down: Any,
              gate_inp: np.ndarray | None) -> Plan | None:
        """The plan where every product is a prepared integer matrix (gate and up as one, the
        shared expert's too, or no shared expert), else None: those take the step-by-step path."""
        shared_ok = shared_down is None or (integer_matrix(shared_gate_up) and integer_matrix(shared_down))
        if not (integer_matrix(gate_up, stack=True) and integer_matrix(down, stack=True) and shared_ok
                and gate_up.n_out % 2 == 0):
            return None
        if shared_gate_up is not None and shared_gate_up.n_out % 2:
            return None
        return Plan(k, gate_up, down, shared_gate_up, shared_down, gate_inp)

    def arguments(self, eight: bool) -> tuple:
        """`_moe_row`'s product arguments, from gate|up to the shared down projection; `eight`:
        whether a row takes the eight-row pass on this machine (`x8_choice`)."""
        t, x8, raw, nb, ts, eb, n_out, blk = self.routed
        dt, dx8, draw, dnb, dts, deb, dn_out, dblk = self.down
        if self.shared is not None:
            st, sx8, sraw, snb, sts, _, s_out, sblk, pt, px8, praw, pnb, pts, _, p_out, pblk = self.shared
        else:
            st, sx8, sraw, snb, sts, s_out, sblk = Q4_0, False, _NO_MATRIX, 0, 0, 0, 32
            pt, px8, praw, pnb, pts, p_out, pblk = Q4_0, False, _NO_MATRIX, 0, 0, 0, 32
        return (t, x8 and eight, raw, nb, ts, eb, n_out, blk,
                dt, dx8 and eight, draw, dnb, dts, deb, dn_out, dblk,
                self.shared is not None, st, sx8 and eight, sraw, snb, sts, s_out, sblk,
                pt, px8 and eight, praw, pnb, pts, p_out, pblk)

    def run(self, h: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The MoE output (1, hidden) of the row h (1, hidden) and the experts it used."""
        out = np.empty((1, self.down[6]), np.float32)
        used = _moe_row(h, logits, self.k, current_threads(), *self.arguments(x8_pays()), self.gate_inp, self.gated,
                        out)
        return out, used
