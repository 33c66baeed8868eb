"""A decode row's whole Gated DeltaNet layer in one compiled call: norm, the fused input
projection, the mixer (`gdn._gdn_mixer`), the output projection, the residual, the MoE's norm,
its router and the MoE itself (`moe_step`), the second residual.

`engine.steps.causal_layer` runs these steps from Python for any number of rows; for one row the
Python between the compiled calls (~25 calls and their argument checks) cost ~0.1 ms a layer in
a decode step, where the weights streamed past have evicted the interpreter's data. Here each step
calls the compiled function the step-by-step path calls, on the same values in the same order,
so a row gets the same bits either way (a verified block's commit, step by step, still rounds as
AR's one-row steps do); a change to the layer's order of steps in `steps.causal_layer` must be
made here too (tests/test_kernels_gdn_step.py compares the two on every GDN layer of a model).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .gdn import _gdn_mixer
from .jit import current_threads, njit
from .moe_step import _NO_MATRIX, _dense, _fields, _residual_moe, float_router, integer_matrix
from .moe_step import Plan as MoEPlan
from .norm import _norm_serial
from .x8_choice import x8_pays


@njit(cache=True)
def _columns(y, c0, c1):
    """Columns c0..c1 of the one row y (1, n) as a contiguous (1, c1 - c0) array (the mixer's
    inputs are copied contiguous by its wrapper too: one compiled form, the same loops)."""
    out = np.empty((1, c1 - c0), np.float32)
    for c in range(c0, c1):
        out[0, c - c0] = y[0, c]
    return out


@njit(cache=True)
def _gdn_layer(x, threads, norm_w, eps,
               it, ix8, iraw, inb, its, in_out, iblk,
               jt, jx8, jraw, jnb, jts, jn_out, jblk,
               n_conv, vh, vd, ring, taps, dt_bias, ssm_a, S, ssm_norm, k_heads, dk,
               ot, ox8, oraw, onb, ots, o_out, oblk,
               moe_norm_w, router_w, k,
               moe, gate_inp, gated):
    """`steps.causal_layer` for the one row x (1, hidden) of a GDN layer whose input projections
    are one matrix, or two (qkv, then z | beta | alpha: jn_out > 0): the new row (1, hidden); the
    ring and S advance in place."""
    hidden = x.shape[1]
    h = np.empty((1, hidden), np.float32)
    _norm_serial(x, norm_w, eps, h)
    y = _dense(it, ix8, iraw, inb, its, in_out, iblk, h, threads)
    if jn_out:
        rest = _dense(jt, jx8, jraw, jnb, jts, jn_out, jblk, h, threads)
        both = np.empty((1, in_out + jn_out), np.float32)
        for c in range(in_out):
            both[0, c] = y[0, c]
        for c in range(jn_out):
            both[0, in_out + c] = rest[0, c]
        y = both
    n_z = vh * vd
    u = _columns(y, 0, n_conv)
    z = _columns(y, n_conv, n_conv + n_z).reshape(1, vh, vd)
    b = _columns(y, n_conv + n_z, n_conv + n_z + vh)
    a = _columns(y, n_conv + n_z + vh, n_conv + n_z + 2 * vh)
    ring_new = np.empty_like(ring)
    mixed = np.empty((1, n_z), np.float32)
    _gdn_mixer(u, ring, taps, z, b, a, dt_bias, ssm_a, S, S, ring_new, ssm_norm, eps, k_heads, dk, mixed)
    for t in range(ring.shape[0]):
        for c in range(ring.shape[1]):
            ring[t, c] = ring_new[t, c]
    return _residual_moe(x, mixed, ot, ox8, oraw, onb, ots, o_out, oblk, eps, threads, moe_norm_w, router_w, k,
                         moe, gate_inp, gated)


_NO_REST = (2, False, _NO_MATRIX, 0, 0, 0, 0, 32)  # no second input matrix (Q4_0's type number, no rows)


class Plan:
    """One GDN layer's arguments for `_gdn_layer`, gathered once at load."""

    __slots__ = ("norm", "eps", "inputs", "rest", "shape", "taps", "dt_bias", "ssm_a", "ssm_norm", "out", "moe_norm",
                 "router", "moe")

    @staticmethod
    def build(norm: np.ndarray, eps: float, inputs: tuple, widths: tuple[int, int, int, int], taps: np.ndarray,
              dt_bias: np.ndarray, ssm_a: np.ndarray, ssm_norm: np.ndarray, k_heads: int, k_dim: int, out: Any,
              moe_norm: np.ndarray, router: Any, moe: MoEPlan | None) -> Plan | None:
        """The plan where the input projections are one integer matrix (or two: qkv, then
        z | beta | alpha, as a Q5_K qkv leaves them), the output projection is an integer matrix,
        the router is float32 and the MoE has its own plan; else None (the step-by-step path)."""
        if moe is None or len(inputs) not in (1, 2):
            return None
        n_conv, n_z, vh, _ = widths
        rows = float_router(router)
        if not (all(integer_matrix(m) for m in inputs) and integer_matrix(out) and rows is not None
                and sum(m.n_out for m in inputs) == sum(widths) and inputs[0].n_out in (n_conv, sum(widths))
                and n_z % vh == 0):
            return None
        p = Plan()
        p.norm, p.moe_norm = (np.ascontiguousarray(v, np.float32) for v in (norm, moe_norm))
        p.eps = np.float32(eps)
        p.inputs = _fields(inputs[0])
        p.rest = _fields(inputs[1]) if len(inputs) == 2 else _NO_REST
        p.shape = (n_conv, vh, n_z // vh, k_heads, k_dim)
        p.taps, p.dt_bias, p.ssm_a, p.ssm_norm = (np.ascontiguousarray(v, np.float32)
                                                  for v in (taps, dt_bias, ssm_a, ssm_norm))
        p.out = _fields(out)
        p.router = rows
        p.moe = moe
        return p

    def run(self, x: np.ndarray, ring: np.ndarray, S: np.ndarray) -> np.ndarray:
        """The layer's new row for x (1, hidden); `ring` and `S` (the state's own) advance in place."""
        eight = x8_pays()
        it, ix8, iraw, inb, its, _, in_out, iblk = self.inputs
        jt, jx8, jraw, jnb, jts, _, jn_out, jblk = self.rest
        ot, ox8, oraw, onb, ots, _, o_out, oblk = self.out
        n_conv, vh, vd, k_heads, dk = self.shape
        m = self.moe
        return _gdn_layer(np.ascontiguousarray(x, np.float32), current_threads(), self.norm, self.eps,
                          it, ix8 and eight, iraw, inb, its, in_out, iblk,
                          jt, jx8 and eight, jraw, jnb, jts, jn_out, jblk,
                          n_conv, vh, vd, ring, self.taps, self.dt_bias, self.ssm_a, S, self.ssm_norm, k_heads, dk,
                          ot, ox8 and eight, oraw, onb, ots, o_out, oblk,
                          self.moe_norm, self.router, m.k, m.arguments(eight), m.gate_inp, m.gated)
