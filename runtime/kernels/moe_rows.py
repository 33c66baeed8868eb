"""The per-row glue of a MoE layer, each step one compiled call.

Between its weight products a decode step's MoE used to make ~170 small numpy calls (softmax,
top-k, the grouping of slots by expert, SiLU(gate)·up, the weighted sum, the shared expert's gate),
~0.2 ms a layer on one thread against ~1.7 ms of weight streaming. Each function here does one of
those steps for every row in one call, row by row in a fixed order, so a row's result does not
depend on how many rows share the call (a verified block's commit must round as AR's one-row
steps do). The weighted sum and the shared expert's gating add in the order `engine.moe` writes
them, so they give numpy's bits; the softmax and the dot of the shared gate sum in their own
order (the float32 round-off of any other order).
"""

from __future__ import annotations

import numpy as np

from .act import _FM, _sigmoid_into, silu_inplace
from .jit import njit, parallel_pays, prange


@njit(inline="always")
def _route_row(logits, r, k, probs, taken, ids, weights):
    n_expert = logits.shape[1]
    m = logits[r, 0]
    for e in range(1, n_expert):
        if logits[r, e] > m:
            m = logits[r, e]
    total = np.float32(0.0)
    for e in range(n_expert):
        probs[e] = np.exp(logits[r, e] - m)
        total += probs[e]
    for e in range(n_expert):
        probs[e] = probs[e] / total
        taken[e] = False
    picked = np.float32(0.0)
    for j in range(k):
        best = -1
        for e in range(n_expert):  # the largest untaken; the lowest id on ties (a stable sort's order)
            if not taken[e] and (best < 0 or probs[e] > probs[best]):
                best = e
        taken[best] = True
        ids[r, j] = best
        weights[r, j] = probs[best]
        picked += probs[best]
    for j in range(k):
        weights[r, j] = weights[r, j] / picked


@njit(cache=True, nogil=True)
def _route(logits, k, ids, weights):
    probs = np.empty(logits.shape[1], np.float32)
    taken = np.empty(logits.shape[1], np.bool_)
    for r in range(logits.shape[0]):
        _route_row(logits, r, k, probs, taken, ids, weights)


def route(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over each row's router logits (n, n_expert), then its k most probable experts,
    most probable first, and their probabilities renormalised to sum to 1: (ids int64, weights
    float32), both (n, k)."""
    logits = np.ascontiguousarray(logits, np.float32)
    n = logits.shape[0]
    k = min(int(k), logits.shape[1])
    ids = np.empty((n, k), np.int64)
    weights = np.empty((n, k), np.float32)
    if n:
        _route(logits, k, ids, weights)
    return ids, weights


@njit(cache=True, nogil=True)
def _group(flat, count, counts, order, starts):
    """Counts per expert, the slots in expert order (stable), the group starts; the number of
    experts used, or -1 when an id lies outside 0..count-1."""
    for v in flat:
        if v < 0 or v >= count:
            return -1
    counts[:] = 0
    for v in flat:
        counts[v] += 1
    starts[0] = 0
    used = 0
    for e in range(count):
        starts[e + 1] = starts[e] + counts[e]
        if counts[e]:
            used += 1
    fill = starts[:-1].copy()
    for i in range(flat.shape[0]):
        order[fill[flat[i]]] = i
        fill[flat[i]] += 1
    return used


def group(ids: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The slots of `ids` (n, k) grouped by expert: (counts (count,), order (n·k,) the slots in
    expert order, stable, starts (count + 1,), used: the experts with a slot, ascending).
    Raises ValueError for an id outside 0..count-1."""
    flat = np.ascontiguousarray(ids, np.int64).reshape(-1)
    counts = np.empty(count, np.int64)
    order = np.empty(flat.shape[0], np.int64)
    starts = np.empty(count + 1, np.int64)
    used = _group(flat, count, counts, order, starts)
    if used < 0:
        raise ValueError(f"expert ids must lie in 0..{count - 1}")
    return counts, order, starts, np.flatnonzero(counts)


@njit(cache=True, nogil=True)
def _work_items(experts, n_out, run, item_expert, row0, row1):
    per = (n_out + run - 1) // run
    for a in range(experts.shape[0]):
        for b in range(per):
            i = a * per + b
            item_expert[i] = experts[a]
            row0[i] = b * run
            row1[i] = min(n_out, (b + 1) * run)


RUN_MIN, RUN_MAX = 4, 64  # output rows a balanced work item holds


@njit(cache=True, nogil=True)
def balanced_items(experts, n_out, threads):
    """`work_items` in runs long enough to amortise a pass (RUN_MIN rows at least, RUN_MAX at most)
    and short enough to give every thread ~8 items: the split the grouped products use, whether
    called from Python (`matmul`) or inside a compiled step (`moe_step`). A row's bits do not
    depend on it."""
    want = 8 * threads
    run = min(RUN_MAX, max(RUN_MIN, (experts.shape[0] * n_out + want - 1) // want))
    per = (n_out + run - 1) // run
    item_expert = np.empty(experts.shape[0] * per, np.int64)
    row0 = np.empty_like(item_expert)
    row1 = np.empty_like(item_expert)
    _work_items(experts, n_out, run, item_expert, row0, row1)
    return item_expert, row0, row1


def work_items(experts: np.ndarray, n_out: int, run: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grouped kernels' work items: each expert's output rows in runs of `run` (the last one
    shorter), as (expert, first row, end row) int64 arrays, expert by expert."""
    per = -(-n_out // run)
    item_expert, row0, row1 = (np.empty(len(experts) * per, np.int64) for _ in range(3))
    _work_items(experts, n_out, run, item_expert, row0, row1)
    return item_expert, row0, row1


@njit(inline="always")
def _swiglu_row(gate, up, r, out, v, e, bits):
    """Row r's slots through scratch v (indexed in place: a view per slot cost more in reference
    counts than its arithmetic)."""
    f = gate.shape[2]
    for j in range(gate.shape[1]):
        for i in range(f):
            v[i] = gate[r, j, i]
        silu_inplace(v, e, bits)
        for i in range(f):
            out[r, j, i] = v[i] * up[r, j, i]


@njit(cache=True, nogil=True, fastmath=_FM)  # act.silu's flags: the same bits
def _swiglu_serial(gate, up, out):
    v = np.empty(gate.shape[2], np.float32)
    e = np.empty(gate.shape[2], np.float32)
    bits = np.empty(gate.shape[2], np.int32)
    for r in range(gate.shape[0]):
        _swiglu_row(gate, up, r, out, v, e, bits)


@njit(cache=True, nogil=True, parallel=True, fastmath=_FM)
def _swiglu_parallel(gate, up, out):
    f = gate.shape[2]
    for r in prange(gate.shape[0]):
        _swiglu_row(gate, up, r, out, np.empty(f, np.float32), np.empty(f, np.float32), np.empty(f, np.int32))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """SiLU(gate)·up of expert products (n, k, f) each (views of a fused gate | up are fine):
    (n, k, f) float32, the bits of `act.silu(gate) * up`."""
    if gate.shape != up.shape or gate.ndim != 3:
        raise ValueError(f"gate and up must be (n, k, f) alike, got {gate.shape} and {up.shape}")
    gate = np.asarray(gate, np.float32)
    up = np.asarray(up, np.float32)
    out = np.empty(gate.shape, np.float32)
    (_swiglu_parallel if parallel_pays(gate.size) else _swiglu_serial)(gate, up, out)
    return out


@njit(inline="always")
def _mix_row(weights, down, shared, h, gate_inp, gated, r, out, g1, g2, bits):
    k = down.shape[1]
    for i in range(down.shape[2]):
        out[r, i] = down[r, 0, i] * weights[r, 0]
    for j in range(1, k):
        w = weights[r, j]
        for i in range(down.shape[2]):
            out[r, i] += down[r, j, i] * w
    if shared.shape[0] == 0:
        return
    g = np.float32(1.0)
    if gated:
        s = np.float32(0.0)
        for i in range(h.shape[1]):
            s += h[r, i] * gate_inp[i]
        g1[0] = s
        _sigmoid_into(g1, g2, bits)
        g = g2[0]
    for i in range(down.shape[2]):
        out[r, i] += shared[r, i] * g if gated else shared[r, i]


@njit(cache=True, nogil=True)
def _mix_serial(weights, down, shared, h, gate_inp, gated, out):
    g1 = np.empty(1, np.float32)
    g2 = np.empty(1, np.float32)
    bits = np.empty(1, np.int32)
    for r in range(down.shape[0]):
        _mix_row(weights, down, shared, h, gate_inp, gated, r, out, g1, g2, bits)


@njit(cache=True, nogil=True, parallel=True)
def _mix_parallel(weights, down, shared, h, gate_inp, gated, out):
    for r in prange(down.shape[0]):
        _mix_row(weights, down, shared, h, gate_inp, gated, r, out, np.empty(1, np.float32),
                 np.empty(1, np.float32), np.empty(1, np.int32))


_NONE = np.zeros((0, 0), np.float32)
_NO_GATE = np.zeros(0, np.float32)


def mix(weights: np.ndarray, down: np.ndarray, shared: np.ndarray | None = None, h: np.ndarray | None = None,
        gate_inp: np.ndarray | None = None) -> np.ndarray:
    """Σ_j weights[:, j] · down[:, j] in slot order, plus the shared expert's output, scaled by
    σ(h · gate_inp) per row when `gate_inp` is given: (n, hidden) float32."""
    weights = np.ascontiguousarray(weights, np.float32)
    down = np.ascontiguousarray(down, np.float32)
    n = down.shape[0]
    gated = shared is not None and gate_inp is not None
    sh = _NONE if shared is None else np.ascontiguousarray(shared, np.float32)
    hh = np.ascontiguousarray(h, np.float32) if gated else _NONE
    gi = np.ascontiguousarray(gate_inp, np.float32) if gated else _NO_GATE
    out = np.empty((n, down.shape[2]), np.float32)
    (_mix_parallel if parallel_pays(down.size) else _mix_serial)(weights, down, sh, hh, gi, gated, out)
    return out
