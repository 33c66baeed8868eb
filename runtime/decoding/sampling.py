"""The one sampler: every decoder (block diffusion and exact AR) picks its tokens here.

The chain is llama.cpp's default order: penalties, top-k, top-p, min-p, temperature, then the
draw. Top-p and min-p therefore act on the untempered distribution (renormalised over what the
earlier filters kept), and temperature only reshapes the survivors; temperature 0 is greedy.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .events import TokenLogprob
from .params import SamplingParams


def apply_penalties(logits: np.ndarray, history: Counter, p: SamplingParams) -> np.ndarray:
    """Presence, frequency and repetition penalties over tokens generated so far (rows × vocab).

    As llama.cpp: a repeated token's logit is divided by the repetition penalty when positive and
    multiplied when not; then count × frequency and the presence penalty are subtracted.
    """
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


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of each row (float64, so tiny probabilities keep their digits)."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def token_logprob(logits: np.ndarray, token: int, k: int) -> TokenLogprob:
    """The logprob of `token` and the `k` most likely tokens (ties: lower id first) under one row
    of penalised logits: the distribution the token was chosen from, before temperature and the
    top-k/top-p/min-p cut (as llama-server's n_probs and OpenAI's logprobs report it)."""
    lp = log_softmax(np.asarray(logits).reshape(-1))
    if k <= 0:
        return TokenLogprob(float(lp[token]))
    k = min(k, lp.size)
    top = np.argpartition(-lp, k - 1)[:k]
    top = top[np.lexsort((top, -lp[top]))]
    return TokenLogprob(float(lp[token]), tuple(int(t) for t in top), tuple(float(lp[t]) for t in top))


def candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities) that one row's draw chooses from: top-k, top-p, min-p, then
    softmax at the temperature (> 0)."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    cand = np.flatnonzero(np.isfinite(x))
    if cand.size == 0:
        raise ValueError("no finite logit to sample from")
    if 0 < p.top_k < cand.size:
        cand = np.sort(cand[np.argpartition(-x[cand], p.top_k - 1)[:p.top_k]])
    if p.top_p < 1.0:
        cand = _top_p(x, cand, p.top_p)
    if p.min_p > 0.0:
        cand = cand[x[cand] >= x[cand].max() + np.log(p.min_p)]  # probability >= min_p × the best one's
    return cand, _softmax(x[cand] / p.temperature)


def _top_p(x: np.ndarray, cand: np.ndarray, top_p: float, head: int = 1024) -> np.ndarray:
    """The smallest most-likely prefix of `cand` (ids in increasing order) whose probability,
    renormalised over `cand`, reaches top_p; the token that crosses top_p stays. Ties keep the
    lower id first. A full-vocabulary sort per row is the costly step, so the most likely `head`
    candidates are tried first; the whole set is sorted only when they do not reach top_p."""
    z = x[cand]
    w = np.exp(z - z.max())
    total = w.sum()
    for width in (min(head, cand.size), cand.size):
        idx = np.arange(cand.size) if width == cand.size else np.sort(np.argpartition(-z, width - 1)[:width])
        idx = idx[np.argsort(-z[idx], kind="stable")]
        cum = np.cumsum(w[idx]) / total
        if width == cand.size or cum[-1] >= top_p:
            return cand[idx[:min(int(np.searchsorted(cum, top_p)) + 1, width)]]
    raise AssertionError("unreachable: the last width is the whole set")


def pick(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(token, confidence) per row of penalised logits (rows × vocab).

    Greedy at temperature <= 0 (the first maximum; no randomness used), with the confidence the
    token's probability under the plain softmax. Otherwise one draw per row from `candidates`,
    with the confidence the picked token's probability in that final distribution.
    """
    logits = np.asarray(logits, dtype=np.float32)
    if p.temperature <= 0:
        tok = np.argmax(logits, axis=-1)
        return tok, _softmax(logits)[np.arange(len(tok)), tok]
    tokens = np.empty(len(logits), dtype=np.int64)
    conf = np.empty(len(logits), dtype=np.float64)
    for r, row in enumerate(logits):
        ids, probs = candidates(row, p)
        j = min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")), ids.size - 1)
        tokens[r], conf[r] = ids[j], probs[j]
    return tokens, conf
