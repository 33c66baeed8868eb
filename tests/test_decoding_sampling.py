"""The one sampler (clover_runtime.decoding.sampling) against distributions computed here.

The reference below is written from llama.cpp's sampler chain (penalties, top-k, top-p, min-p,
temperature, dist) in plain Python over sorted (logit, id) pairs, sharing no code with the
sampler. Draws are compared with it by a chi-square test on many seeded draws.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from clover_runtime.decoding import SamplingParams
from clover_runtime.decoding.sampling import apply_penalties, candidates, pick

N_DRAWS = 10000


def reference(logits: list[float], temperature: float, top_k: int = 0, top_p: float = 1.0,
              min_p: float = 0.0) -> list[float]:
    """The exact probability of each id under llama.cpp's chain, step by step."""
    cand = sorted(((v, i) for i, v in enumerate(logits) if v != -math.inf), key=lambda c: (-c[0], c[1]))
    if top_k > 0:
        cand = cand[:top_k]
    if top_p < 1.0:  # the smallest most-likely prefix whose untempered probability reaches top_p
        total = sum(math.exp(v - cand[0][0]) for v, _ in cand)
        cum, kept = 0.0, []
        for v, i in cand:
            kept.append((v, i))
            cum += math.exp(v - cand[0][0]) / total
            if cum >= top_p:
                break
        cand = kept
    if min_p > 0.0:  # probability at least min_p times the most likely survivor's
        cand = [(v, i) for v, i in cand if math.exp(v - cand[0][0]) >= min_p]
    weights = {i: math.exp((v - cand[0][0]) / temperature) for v, i in cand}
    total = sum(weights.values())
    return [weights.get(i, 0.0) / total for i in range(len(logits))]


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty); z = 3.09 is the 0.999 normal quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def draw(logits: list[float], sp: SamplingParams, n: int = N_DRAWS) -> tuple[np.ndarray, np.ndarray]:
    """n independent draws in one call (one row per draw), as block diffusion asks for many rows."""
    rows = np.tile(np.asarray(logits, dtype=np.float32), (n, 1))
    return pick(rows, sp, np.random.default_rng(sp.seed))


LOGITS = [2.0, 1.2, 1.0, 0.3, -0.5, -3.0, -math.inf, 1.2]

CASES = {
    "temperature only": dict(temperature=0.7),
    "hot": dict(temperature=2.5),
    "top-k": dict(temperature=1.0, top_k=3),
    "top-p at a high temperature": dict(temperature=3.0, top_p=0.8),
    "min-p at a high temperature": dict(temperature=4.0, min_p=0.3),
    "the whole chain": dict(temperature=0.8, top_k=6, top_p=0.93, min_p=0.1),
    "llama.cpp defaults": dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
}


@pytest.mark.parametrize("name", list(CASES))
def test_draws_follow_the_chain_distribution(name: str) -> None:
    kw = CASES[name]
    want = np.array(reference(LOGITS, **kw))
    tokens, conf = draw(LOGITS, SamplingParams(seed=3, **kw))
    counts = np.bincount(tokens, minlength=len(LOGITS))
    assert np.all(counts[want == 0] == 0), f"drew a token the chain removes: {counts}"
    support = want > 0
    expected = N_DRAWS * want[support]
    stat = float(np.sum((counts[support] - expected) ** 2 / expected))
    df = int(support.sum()) - 1
    if df > 0:
        assert stat < chi_square_critical(df), f"chi-square {stat:.1f} with {df} degrees of freedom"
    np.testing.assert_allclose(conf, want[tokens], rtol=1e-5)  # confidence: the pick's final probability


def test_top_p_and_min_p_act_before_temperature() -> None:
    """A high temperature does not bring back what top-p or min-p removed (llama.cpp's order);
    tempering first would keep every token here."""
    logits = [3.0, 2.0, 1.0, 0.0]  # probabilities 0.64, 0.24, 0.09, 0.03
    counts = np.bincount(draw(logits, SamplingParams(temperature=5.0, top_p=0.9, seed=1), 4000)[0], minlength=4)
    assert counts[3] == 0 and np.all(counts[:3] > 0)
    counts = np.bincount(draw(logits, SamplingParams(temperature=5.0, min_p=0.2, seed=1), 4000)[0], minlength=4)
    assert counts[2] == counts[3] == 0 and np.all(counts[:2] > 0)


@pytest.mark.parametrize("spread", [0.5, 6.0])  # flat: top-p needs most of the vocabulary; peaked: a few ids
@pytest.mark.parametrize("kw", [dict(top_p=0.9), dict(top_p=0.3, min_p=0.05), dict(top_k=50, top_p=0.95)])
def test_a_large_vocabulary_gives_the_exact_candidate_distribution(spread: float, kw: dict) -> None:
    """Over 5000 ids (more than the sampler's first, partial sort covers), with tied logits."""
    rng = np.random.default_rng(4)
    logits = rng.standard_normal(5000) * spread
    logits[rng.integers(0, 5000, 40)] = np.sort(logits)[-3]  # ties around the top
    logits = logits.astype(np.float32)
    want = np.array(reference(logits.astype(float).tolist(), temperature=0.7, **kw))
    ids, probs = candidates(logits, SamplingParams(temperature=0.7, **kw))
    got = np.zeros(len(logits))
    got[ids] = probs
    assert set(ids.tolist()) == set(np.flatnonzero(want).tolist())
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_top_p_keeps_the_token_that_crosses_it_and_always_one() -> None:
    logits = [math.log(0.5), math.log(0.3), math.log(0.2)]
    counts = np.bincount(draw(logits, SamplingParams(temperature=1.0, top_p=0.6, seed=2), 4000)[0], minlength=3)
    assert counts[2] == 0 and np.all(counts[:2] > 0)  # 0.5 < 0.6: the 0.3 token crosses and stays
    tokens, conf = draw(logits, SamplingParams(temperature=1.0, top_p=0.01, seed=2), 50)
    assert set(tokens.tolist()) == {0} and np.all(conf == 1.0)


def test_temperature_zero_is_greedy_and_uses_no_randomness() -> None:
    rows = np.array([[0.1, 2.0, 2.0, -1.0], [5.0, 1.0, 0.0, 0.0]], dtype=np.float32)
    rng = np.random.default_rng(0)
    tokens, conf = pick(rows, SamplingParams(temperature=0.0, top_k=1, top_p=0.1), rng)
    assert tokens.tolist() == [1, 0]  # the first maximum on a tie
    want = [math.exp(2.0) / (math.exp(0.1) + 2 * math.exp(2.0) + math.exp(-1.0)),
            math.exp(5.0) / (math.exp(5.0) + math.exp(1.0) + 2.0)]
    np.testing.assert_allclose(conf, want, rtol=1e-6)
    assert rng.random() == np.random.default_rng(0).random()


def test_same_seed_same_draws_and_rows_are_independent() -> None:
    sp = SamplingParams(temperature=1.0, seed=9)
    a, _ = draw(LOGITS, sp, 200)
    b, _ = draw(LOGITS, sp, 200)
    assert a.tolist() == b.tolist() and len(set(a.tolist())) > 2


def test_penalties_follow_llama_cpp() -> None:
    logits = np.array([[2.0, -1.0, 0.5, 3.0]], dtype=np.float32)
    sp = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5)
    out = apply_penalties(logits, Counter({0: 2, 1: 1}), sp)
    # id 0: 2.0 / 2 - 2 × 0.25 - 0.5; id 1: -1.0 × 2 - 0.25 - 0.5; ids 2, 3 untouched
    np.testing.assert_allclose(out, [[0.0, -2.75, 0.5, 3.0]])
    assert apply_penalties(logits, Counter(), sp) is logits
    tokens, _ = pick(apply_penalties(np.array([[2.0, 1.9]], np.float32), Counter({0: 1}),
                          SamplingParams(repetition_penalty=1.5)), SamplingParams(), np.random.default_rng())
    assert tokens.tolist() == [1]  # penalties come first in the chain, greedy included
