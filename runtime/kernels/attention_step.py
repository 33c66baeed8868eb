"""A decode row's whole gated-attention layer in one compiled call: norm, the q|gate, k and v
projections, the q and k norms, RoPE, the cache write, `attention._attend` over the cache, the
sigmoid gate, the output projection, the residual, then the MoE half (`moe_step._residual_moe`).

The GDN layers' counterpart (`gdn_step`) says why: the same compiled steps as the step-by-step
layer (`engine.steps.causal_layer` with `engine.attention.causal`), in the same order, so a row
gets the same bits; a change to those steps must be made here too
(tests/test_kernels_attention_step.py compares the two).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .act import _CHUNK, _sigmoid_flat, _sigmoid_small
from .attention import _attend, _rope, chunk_of
from .jit import current_threads, njit
from .moe_step import Plan as MoEPlan
from .moe_step import _dense, _fields, _residual_moe, float_router, integer_matrix
from .norm import _norm_serial
from .x8_choice import x8_pays


@njit(cache=True)
def _normed_heads(y, c0, heads, width, stride, weight, eps):
    """Rows of `width` values every `stride` columns of the one row y from column c0, copied
    contiguous and RMS-normed (`engine.attention.project`'s q and k norms): (1, heads, width)."""
    rows = np.empty((heads, width), np.float32)
    for hh in range(heads):
        for t in range(width):
            rows[hh, t] = y[0, c0 + hh * stride + t]
    out = np.empty((heads, width), np.float32)
    _norm_serial(rows, weight, eps, out)
    return out.reshape(1, heads, width)


@njit(cache=True)
def _rotated(x, pos, inv_freq):
    """`attention.rope` of x (1, heads, dim) at position pos: a copy, its rotated dims replaced."""
    out = x.copy()
    if inv_freq.shape[0]:
        _rope(x, np.array([pos], np.int64), inv_freq, out)
    return out


@njit(cache=True)
def _attention_layer(x, threads, norm_w, eps,
                     qt, qx8, qraw, qnb, qts, q_out, qblk,
                     kt, kx8, kraw, knb, kts, k_out, kblk,
                     vt, vx8, vraw, vnb, vts, v_out, vblk,
                     n_head, kv_heads, hd, hv, q_norm, k_norm, inv_freq, pos, K, V,
                     ot, ox8, oraw, onb, ots, o_out, oblk,
                     moe_norm_w, router_w, k,
                     moe, gate_inp, gated):
    """`steps.causal_layer` for the one row x (1, hidden) of an attention layer at position
    `pos`: the new row (1, hidden); its K and V are written into the cache K, V."""
    hidden = x.shape[1]
    h = np.empty((1, hidden), np.float32)
    _norm_serial(x, norm_w, eps, h)
    qg = _dense(qt, qx8, qraw, qnb, qts, q_out, qblk, h, threads)
    kk = _dense(kt, kx8, kraw, knb, kts, k_out, kblk, h, threads)
    vv = _dense(vt, vx8, vraw, vnb, vts, v_out, vblk, h, threads)
    q = _rotated(_normed_heads(qg, 0, n_head, hd, 2 * hd, q_norm, eps), pos, inv_freq)
    kr = _rotated(_normed_heads(kk, 0, kv_heads, hd, hd, k_norm, eps), pos, inv_freq)
    gate = np.empty(n_head * hd, np.float32)
    for hh in range(n_head):
        for t in range(hd):
            gate[hh * hd + t] = qg[0, hh * 2 * hd + hd + t]
    for hh in range(kv_heads):
        for t in range(hd):
            K[hh, pos, t] = kr[0, hh, t]
        for t in range(hv):
            V[hh, pos, t] = vv[0, hh * hv + t]
    o = np.empty((1, n_head, hv), np.float32)
    _attend(q, K, V, pos + 1, np.array([pos + 1], np.int64), np.float32(1.0 / np.sqrt(hd)),
            chunk_of(K.shape[1], kv_heads, threads), o)
    sig = np.empty(n_head * hd, np.float32)
    if gate.shape[0] <= _CHUNK:
        _sigmoid_small(gate, sig)
    else:
        _sigmoid_flat(gate, sig)
    y = np.empty((1, n_head * hv), np.float32)
    flat = o.reshape(-1)
    for i in range(n_head * hv):
        y[0, i] = flat[i] * sig[i]
    return _residual_moe(x, y, ot, ox8, oraw, onb, ots, o_out, oblk, eps, threads, moe_norm_w, router_w, k,
                         moe, gate_inp, gated)


class Plan:
    """One attention layer's arguments for `_attention_layer`, gathered once at load."""

    __slots__ = ("norm", "eps", "q", "k", "v", "shape", "q_norm", "k_norm", "inv_freq", "out", "moe_norm",
                 "router", "moe")

    @staticmethod
    def build(norm: np.ndarray, eps: float, q: Any, k: Any, v: Any, n_head: int, kv_heads: int, head_dim: int,
              v_dim: int, q_norm: np.ndarray, k_norm: np.ndarray, inv_freq: np.ndarray, out: Any,
              moe_norm: np.ndarray, router: Any, moe: MoEPlan | None) -> Plan | None:
        """The plan where q (with its gate), k, v and the output are integer matrices apart, the
        router is float32 and the MoE has its own plan; else None (the step-by-step path)."""
        rows = float_router(router)
        if (moe is None or rows is None or not all(integer_matrix(m) for m in (q, k, v, out))
                or q.n_out != 2 * n_head * head_dim or k.n_out != kv_heads * head_dim
                or v.n_out != kv_heads * v_dim or v_dim != head_dim or n_head % kv_heads or q_norm.size != head_dim
                or k_norm.size != head_dim):
            return None
        p = Plan()
        p.norm, p.moe_norm, p.q_norm, p.k_norm = (np.ascontiguousarray(a, np.float32).reshape(-1)
                                                  for a in (norm, moe_norm, q_norm, k_norm))
        p.eps = np.float32(eps)
        p.q, p.k, p.v, p.out = (_fields(m) for m in (q, k, v, out))
        p.shape = (n_head, kv_heads, head_dim, v_dim)
        p.inv_freq = np.ascontiguousarray(inv_freq, np.float64)
        p.router = rows
        p.moe = moe
        return p

    def run(self, x: np.ndarray, pos: int, K: np.ndarray, V: np.ndarray) -> np.ndarray:
        """The layer's new row for x (1, hidden) at position `pos`; its K/V go into the cache."""
        eight = x8_pays()
        qt, qx8, qraw, qnb, qts, _, q_out, qblk = self.q
        kt, kx8, kraw, knb, kts, _, k_out, kblk = self.k
        vt, vx8, vraw, vnb, vts, _, v_out, vblk = self.v
        ot, ox8, oraw, onb, ots, _, o_out, oblk = self.out
        n_head, kv_heads, hd, hv = self.shape
        m = self.moe
        return _attention_layer(np.ascontiguousarray(x, np.float32), current_threads(), self.norm, self.eps,
                                qt, qx8 and eight, qraw, qnb, qts, q_out, qblk,
                                kt, kx8 and eight, kraw, knb, kts, k_out, kblk,
                                vt, vx8 and eight, vraw, vnb, vts, v_out, vblk,
                                n_head, kv_heads, hd, hv, self.q_norm, self.k_norm, self.inv_freq, pos, K, V,
                                ot, ox8 and eight, oraw, onb, ots, o_out, oblk,
                                self.moe_norm, self.router, m.k, m.arguments(eight), m.gate_inp, m.gated)
