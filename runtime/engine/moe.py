"""Mixture of experts: softmax routing, top-k renormalised, plus the sigmoid-gated shared expert.

An optional expert coreset (block-diffusion previews) restricts every row of a pass to one small
set of experts: the union of the rows' own top-k choices, cut to K by summed routing weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model_config import ModelConfig
from .layers import MoE
from .ops import compiled, sigmoid, silu, softmax
from .weights import Weights


@dataclass
class Routing:
    ids: np.ndarray  # (n, k) expert ids, most probable first
    weights: np.ndarray  # (n, k) float32, summing to 1 per row


def top_k(probs: np.ndarray, k: int, allowed: np.ndarray | None = None) -> Routing:
    """Each row's k most probable experts (only among `allowed` when given), weights renormalised."""
    p = probs
    if allowed is not None:
        mask = np.zeros(probs.shape[1], dtype=bool)
        mask[allowed] = True
        p = np.where(mask, probs, np.float32(-1))
        k = min(k, int(mask.sum()))
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(probs, ids, axis=1)
    return Routing(ids.astype(np.int64), (top / np.sum(top, axis=1, keepdims=True)).astype(np.float32))


def coreset(routing: Routing, size: int) -> np.ndarray:
    """The union of the rows' choices, keeping the `size` experts with the largest summed weight."""
    totals = np.zeros(int(routing.ids.max()) + 1 if routing.ids.size else 0, dtype=np.float64)
    np.add.at(totals, routing.ids.reshape(-1), routing.weights.reshape(-1))
    chosen = np.flatnonzero(totals > 0)
    order = np.argsort(-totals[chosen], kind="stable")
    return np.sort(chosen[order[:max(1, size)]])


def route(w: Weights, cfg: ModelConfig, m: MoE, h: np.ndarray, coreset_size: int | None = None) -> Routing:
    logits = m.router.matmul(h)
    rows = compiled("moe_rows")
    if rows is not None and coreset_size is None:
        return Routing(*rows.route(logits, cfg.n_expert_used))
    probs = softmax(logits)
    routing = top_k(probs, cfg.n_expert_used)
    if coreset_size is not None:
        routing = top_k(probs, cfg.n_expert_used, coreset(routing, coreset_size))
    return routing


def experts(w: Weights, cfg: ModelConfig, m: MoE, h: np.ndarray, routing: Routing) -> np.ndarray:
    """down_e(SiLU(gate_e h) ⊙ up_e h) for each row's routed experts e = ids[:, j]: (n, k, hidden),
    before their routing weights (`moe` sums them)."""
    f = cfg.expert_ff
    routes = w.routes(routing.ids, cfg.n_expert)
    if m.gate_up is not None:
        gu = w.expert_products([m.gate_up], h, routing.ids, routes)[0]
        gate, up = gu[..., :f], gu[..., f:]
    else:
        gate, up = w.expert_products([m.gate, m.up], h, routing.ids, routes)
    rows = compiled("moe_rows")
    act = rows.swiglu(gate, up) if rows is not None else silu(gate) * up
    return w.expert_products([m.down], act, routing.ids, routes)[0]


def weighted_sum(weights: np.ndarray, down: np.ndarray) -> np.ndarray:
    """Σ_j weights[:, j] · down[:, j] in slot order, elementwise, so a row's sum does not depend on
    how many rows share the call (a batched matmul would pick another summation order for n > 1,
    and a verified block's commit must round exactly as AR's one-row steps do)."""
    out = down[:, 0] * weights[:, 0, None]
    for j in range(1, down.shape[1]):
        out += down[:, j] * weights[:, j, None]
    return out


def row_dot(h: np.ndarray, v: np.ndarray) -> np.ndarray:
    """h (n, d) · v (d,) per row, summed along each row alone (BLAS's matrix-vector product sums in
    another order than a one-row dot, so a row's gate would depend on the batch)."""
    return np.add.reduce(h * v, axis=1)


def shared_products(w: Weights, m: MoE, h: np.ndarray) -> np.ndarray | None:
    """The shared expert's output before its sigmoid gate (None when the layer has none)."""
    if m.shared_down is None:
        return None
    if m.shared_gate_up is not None:
        gu = m.shared_gate_up.matmul(h)
        gate, up = gu[:, :gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
    else:
        gate, up = w.products([m.shared_gate, m.shared_up], h)
    rows = compiled("moe_rows")
    act = rows.swiglu(gate[:, None], up[:, None])[:, 0] if rows is not None else silu(gate) * up
    return m.shared_down.matmul(act)


def moe(w: Weights, cfg: ModelConfig, m: MoE, h: np.ndarray,
        coreset_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The layer's MoE output (n, hidden) and the distinct experts it used:
    Σ_j weight_j · expert_j(h) + σ(h · shared_gate_inp) · shared(h). A decode row takes one
    compiled call after its router (`Weights.moe_step`) where the layer's matrices allow: the
    same steps, the same bits."""
    if coreset_size is None and h.shape[0] == 1:
        step = w.moe_step(m, cfg.n_expert_used)
        if step is not None:
            return step.run(np.ascontiguousarray(h, np.float32), np.ascontiguousarray(m.router.matmul(h), np.float32))
    routing = route(w, cfg, m, h, coreset_size)
    down = experts(w, cfg, m, h, routing)
    shared = shared_products(w, m, h)
    used = np.unique(routing.ids)
    rows = compiled("moe_rows")
    if rows is not None:
        return rows.mix(routing.weights, down, shared, h, m.shared_gate_inp), used
    out = weighted_sum(routing.weights, down)
    if shared is not None:
        if m.shared_gate_inp is not None:
            shared *= sigmoid(row_dot(h, m.shared_gate_inp))[:, None]
        out += shared
    return out, used
