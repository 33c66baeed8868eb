"""Block-diffusion decoding invariants on synthetic models, and a model whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime import load_model
from clover_runtime.decoding import (
    BlockEvent,
    DecodeParams,
    DoneEvent,
    PassEvent,
    SamplingParams,
    generate,
    generate_ar,
)
from clover_runtime.decoding.policy import (
    choose_decode_mode,
    draft_window,
    fixed_count_reveal,
    logit_rows_for,
    low_confidence_reveal,
    verify_commits,
)
from clover_runtime.text.reply import Timings
from decoding_models import successor_model_path
from synth_models import tiny_model_path

PROMPT = [11, 12, 13, 14, 15]


def _run(model, prompt, **kw):
    events = list(generate(model, prompt, DecodeParams(**kw)))
    assert isinstance(events[-1], DoneEvent)
    tokens = [t for e in events if isinstance(e, BlockEvent) for t in e.token_ids]
    return events, tokens, events[-1].stats


@pytest.fixture(scope="module")
def tiny():
    return load_model(tiny_model_path("F32"))


def test_policy_functions() -> None:
    assert list(low_confidence_reveal(np.array([0.2, 0.95, 0.91]), 0.9)) == [1, 2]
    assert list(low_confidence_reveal(np.array([0.2, 0.5, 0.3]), 0.9)) == [1]
    assert list(fixed_count_reveal(np.array([0.2, 0.95, 0.91, 0.5]), 2)) == [1, 2]
    assert list(fixed_count_reveal(np.array([0.2, 0.95]), 4)) == [0, 1]
    rng = np.random.default_rng(0)
    for k in (1, 3, 7):  # against picking the maximum k times by hand
        probs = rng.random(12)
        left, picked = list(range(12)), []
        for _ in range(k):
            best = max(left, key=lambda i: probs[i])
            picked.append(best)
            left.remove(best)
        assert list(fixed_count_reveal(probs, k)) == sorted(picked)
    assert logit_rows_for([0, 3, 5], True) == ([2, 4], True)
    assert logit_rows_for([0, 3, 5], False) == ([0, 3, 5], False)
    assert choose_decode_mode("auto", True)[:2] == ("diffusion", True)
    assert choose_decode_mode("auto", False)[:2] == ("ar", True)
    assert choose_decode_mode("diffusion", False)[:2] == ("diffusion", False)
    assert verify_commits(None, 0.0) and verify_commits(True, 0.0) and not verify_commits(False, 0.0)
    assert verify_commits(None, 0.7) and not verify_commits(False, 0.7)  # sampling: the speculative rule
    assert not verify_commits(None, 0.0, fixed_reveal=True) and verify_commits(True, 0.0, fixed_reveal=True)


def test_threshold_one_reveals_one_token_per_pass_deterministically(tiny) -> None:
    kw = {"decode": "diffusion", "threshold": 1.0, "max_tokens": 40, "block_length": 16, "verify": False}
    a, toks_a, stats = _run(tiny, PROMPT, **kw)
    b, toks_b, _ = _run(tiny, PROMPT, **kw)
    assert toks_a == toks_b and len(toks_a) == 40
    passes = [e for e in a if isinstance(e, PassEvent)]
    assert [len(e.revealed) for e in passes] == [1] * len(passes)
    assert [e.revealed for e in passes] == [e.revealed for e in b if isinstance(e, PassEvent)]
    assert stats.passes == 40 and stats.blocks == 3


def test_every_block_resolves_within_block_length_passes(tiny) -> None:
    events, toks, stats = _run(tiny, PROMPT, decode="diffusion", max_tokens=64, block_length=8, threshold=0.3)
    per_block: dict[int, int] = {}
    for e in events:
        if isinstance(e, PassEvent):
            per_block[e.block] = max(per_block.get(e.block, 0), e.pass_index)
    assert per_block and all(n <= 8 for n in per_block.values())
    assert len(toks) == 64


@pytest.mark.parametrize(("verify", "max_tokens"), [(False, 16), (True, 16), (True, 61)])
def test_commit_leaves_the_state_of_a_plain_causal_forward(tiny, verify: bool, max_tokens: int) -> None:
    """Also after the verifying commit cut blocks (restore, then the kept tokens go in with the next
    commit). The state holds what was committed: all of it unchecked, and checked all but the
    tokens of a cut block still waiting for a commit when max_tokens ran out (as AR leaves its
    last token)."""
    state = tiny.new_state(128)
    events = list(generate(tiny, PROMPT, DecodeParams(decode="diffusion", max_tokens=max_tokens, block_length=8,
                                                      verify=verify), state=state))
    toks = [t for e in events if isinstance(e, BlockEvent) for t in e.token_ids]
    assert (events[-1].stats.corrections > 0) == verify  # random weights: the preview and AR disagree
    assert len(toks) == max_tokens
    held = (PROMPT + toks)[: state.n_past]
    assert len(held) == state.n_past > len(PROMPT) + (15 if not verify else 0)
    ref = tiny.new_state(128)
    tiny.forward(held, ref)
    for layer in tiny.config.attention_layers:
        for got, want in zip(state.kv(layer), ref.kv(layer), strict=True):
            np.testing.assert_allclose(got[:, : state.n_past], want[:, : ref.n_past], rtol=1e-4, atol=1e-5)
    for layer in tiny.config.gdn_layers:
        for got, want in zip(state.gdn(layer), ref.gdn(layer), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _greedy_by_full_forwards(model, prompt: list[int], n: int) -> list[int]:
    """Greedy AR the slow, independent way: the whole sequence through a fresh forward per token."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(model.forward(seq)[-1])))
    return seq[len(prompt):]


def test_ar_mode_equals_greedy_by_full_forwards(tiny) -> None:
    _, toks, stats = _run(tiny, PROMPT, decode="ar", max_tokens=24)
    assert toks == _greedy_by_full_forwards(tiny, PROMPT, 24)
    assert stats.decode_mode == "ar" and Timings.of(stats).tokens_per_forward <= 1.0


@pytest.mark.parametrize("prompt", [PROMPT, [40, 7, 300, 2, 99, 5, 18], [250]])
def test_verified_diffusion_writes_what_greedy_ar_writes(tiny, prompt: list[int]) -> None:
    """Random weights: the preview's guesses are mostly wrong, so the check cuts most blocks; the
    text is AR's all the same. Unchecked, the same decoder writes something else."""
    ar = list(generate_ar(tiny, prompt, max_tokens=40))
    _, checked, stats = _run(tiny, prompt, decode="diffusion", max_tokens=40, block_length=16)
    assert checked == ar and stats.corrections > 0
    _, unchecked, _ = _run(tiny, prompt, decode="diffusion", max_tokens=40, block_length=16, verify=False)
    assert unchecked != ar


def test_draft_window_follows_what_the_commits_kept() -> None:
    assert draft_window(32, 32, 32, None) == 32  # kept whole: stays (or grows to) the block
    assert draft_window(32, 8, 8, None) == 16 and draft_window(32, 16, 16, None) == 32
    assert draft_window(32, 32, 32, 0) == 8  # nothing kept: the next draft covers 8 positions
    assert [draft_window(32, 32, 32, k) for k in (1, 2, 3, 20)] == [16, 24, 32, 32]
    assert draft_window(4, 4, 4, 0) == 4 and draft_window(16, 8, 5, None) == 16


def test_after_a_block_with_nothing_kept_the_next_drafts_eight_positions(tiny) -> None:
    """Random weights: AR refuses most drafts at their first token, so the blocks after such a cut
    draft (and compute logits for) eight positions, not the whole block; the text stays AR's. The
    window follows what previews draft: a block drafted by a commit's tail (no pass) leaves it."""
    events, toks, stats = _run(tiny, PROMPT, decode="diffusion", max_tokens=30, block_length=32)
    assert toks == list(generate_ar(tiny, PROMPT, max_tokens=30))
    committed = {e.block: len(e.token_ids) for e in events if isinstance(e, BlockEvent)}
    passes = [e for e in events if isinstance(e, PassEvent)]
    previewed = {e.block for e in passes}
    assert max(r for e in passes if e.block == 0 for r in e.revealed) >= 8  # the first block drafts it all
    after_nothing_kept = [e for e in passes if committed.get(e.block - 1) == 1 and e.block - 1 in previewed]
    assert after_nothing_kept and all(r < 8 for e in after_nothing_kept for r in e.revealed)


def test_verified_diffusion_stops_where_greedy_ar_stops(tiny) -> None:
    full = list(generate_ar(tiny, PROMPT, max_tokens=40))
    stop = full[20]
    ar = list(generate_ar(tiny, PROMPT, max_tokens=40, stop_ids=[stop]))
    assert len(ar) <= 20
    state = tiny.new_state(128)
    events = list(generate(tiny, PROMPT, DecodeParams(decode="diffusion", max_tokens=40, block_length=16,
                                                      stop_ids=frozenset({stop})), state=state))
    assert [t for e in events if isinstance(e, BlockEvent) for t in e.token_ids] == ar
    assert events[-1].stats.finish_reason == "stop" and events[-1].stats.stop_token == stop
    assert state.n_past <= len(PROMPT) + len(ar)  # the stopping block is not left in the state


def test_known_answer_model_continues_the_sequence() -> None:
    path, mask = successor_model_path()
    model = load_model(path)
    events, toks, stats = _run(model, PROMPT, decode="diffusion", max_tokens=40, block_length=16,
                               mask_token_id=mask)
    assert toks == list(range(16, 56))
    assert stats.blocks == 3 and stats.exact


def test_stop_token_mid_block_truncates_exactly_there() -> None:
    path, mask = successor_model_path()
    model = load_model(path)
    _, toks, stats = _run(model, PROMPT, decode="diffusion", max_tokens=40, block_length=16,
                          mask_token_id=mask, stop_ids=frozenset({21}))
    assert toks == [16, 17, 18, 19, 20]
    assert stats.finish_reason == "stop" and stats.stop_token == 21


def test_sampling_is_reproducible_with_a_seed(tiny) -> None:
    sp = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=7)
    _, a, _ = _run(tiny, PROMPT, decode="diffusion", max_tokens=20, sampling=sp)
    _, b, _ = _run(tiny, PROMPT, decode="diffusion", max_tokens=20, sampling=sp)
    assert a == b


def test_expert_coreset_limits_distinct_experts(tiny) -> None:
    _, _, free = _run(tiny, PROMPT, decode="diffusion", max_tokens=16, block_length=16)
    _, _, core = _run(tiny, PROMPT, decode="diffusion", max_tokens=16, block_length=16, expert_coreset=2)
    assert core.experts_per_pass <= 2 < free.experts_per_pass
