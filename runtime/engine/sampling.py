"""Picking the next token from one row of logits: greedy, or seeded sampling with the usual filters."""

from __future__ import annotations

import numpy as np


def sample_token(logits: np.ndarray, rng: np.random.Generator | None = None, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> int:
    """The next token id.

    temperature <= 0 is greedy (first maximum). Otherwise, in llama.cpp's order: keep the top_k
    most likely (0 = all), then the smallest set whose probability reaches top_p, then those with
    probability >= min_p times the best one's; finally sample from softmax(logits / temperature).
    """
    logits = np.asarray(logits).reshape(-1)
    if temperature <= 0:
        return int(np.argmax(logits))
    rng = rng if rng is not None else np.random.default_rng()
    x = logits.astype(np.float64)
    cand = np.flatnonzero(np.isfinite(x))
    if cand.size == 0:
        return int(np.argmax(logits))
    order = cand[np.argsort(-x[cand], kind="stable")]
    if top_k > 0:
        order = order[:top_k]
    p = _softmax(x[order])
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1
        order, p = order[:keep], p[:keep]
    if min_p > 0.0:
        keep = p >= min_p * p[0]
        order = order[keep]
    p = _softmax(x[order] / temperature)
    pick = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
    return int(order[min(pick, len(order) - 1)])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()
