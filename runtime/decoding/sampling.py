"""Picking each masked position's candidate token and its confidence."""

from __future__ import annotations

from collections import Counter

import numpy as np

from .params import SamplingParams


def apply_penalties(logits: np.ndarray, history: Counter, p: SamplingParams) -> np.ndarray:
    """Presence, frequency and repetition penalties over tokens generated so far (rows × vocab)."""
    if not history or (p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1):
        return logits
    out = logits.copy()
    ids = np.fromiter(history.keys(), dtype=np.int64)
    counts = np.fromiter(history.values(), dtype=np.float32)
    cols = out[:, ids]
    if p.repetition_penalty != 1:
        cols = np.where(cols > 0, cols / p.repetition_penalty, cols * p.repetition_penalty)
    cols = cols - p.frequency_penalty * counts - p.presence_penalty
    out[:, ids] = cols
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def pick(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(token, confidence) per row. Greedy at temperature 0; otherwise top-k, top-p and min-p
    filtering then sampling. The confidence is the picked token's probability under the
    (temperature-scaled, filtered) distribution."""
    logits = logits.astype(np.float32, copy=False)
    if p.temperature <= 0:
        probs = _softmax(logits)
        tok = np.argmax(logits, axis=-1)
        return tok, probs[np.arange(len(tok)), tok]
    x = logits / p.temperature
    if p.top_k and p.top_k > 0 and p.top_k < x.shape[-1]:
        kth = np.partition(x, -p.top_k, axis=-1)[:, -p.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    probs = _softmax(x)
    if p.min_p > 0:
        probs = np.where(probs < p.min_p * probs.max(axis=-1, keepdims=True), 0.0, probs)
    if p.top_p < 1.0:
        order = np.argsort(-probs, axis=-1)
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        keep_sorted = np.cumsum(sorted_p, axis=-1) - sorted_p < p.top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    tok = np.array([rng.choice(probs.shape[-1], p=row) for row in probs], dtype=np.int64)
    return tok, probs[np.arange(len(tok)), tok]
