"""The reasoning budget in the chat session, under block diffusion: thinking is cut at exactly N
tokens, `</think>` is written, and the answer continues from the same decoding state. Checked
against raw completions of prompts built by hand (a fresh prefill each, no budget code)."""

from __future__ import annotations

import pytest
from clover_runtime.chat import load_chat
from clover_runtime.decoding import BlockEvent, DecodeParams, generate
from clover_runtime.reasoning_budget import CLOSE_THINK, EFFORT_BUDGETS, effort_budget
from clover_runtime.text.reply import ContentDelta, Finished, ReasoningDelta
from synth_models import tiny_model_path

MESSAGES = [{"role": "user", "content": "Tell me a story."}]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def session():
    return load_chat(str(tiny_model_path()), n_ctx=1024)


def _params(**kw):
    kw.setdefault("max_tokens", MAX_TOKENS)
    return DecodeParams(decode="diffusion", block_length=4, verify=False, **kw)  # whole blocks, as counted


def _reply(session, params):
    reasoning, content, done = "", "", None
    for ev in session.stream(MESSAGES, params=params):
        if isinstance(ev, ReasoningDelta):
            reasoning += ev.text
        elif isinstance(ev, ContentDelta):
            content += ev.text
        elif isinstance(ev, Finished):
            done = ev
    return reasoning, content, done


def _raw_ids(session, ids, max_tokens):
    """Token ids of a raw diffusion generation from `ids` (no template, no budget), fresh state."""
    tok = session.tokenizer
    params = _params(max_tokens=max_tokens, stop_ids=frozenset(tok.stop_ids), mask_token_id=tok.mask_id)
    return [t for ev in generate(session.model, ids, params) if isinstance(ev, BlockEvent) for t in ev.token_ids]


def test_effort_levels_are_an_increasing_ladder():
    assert effort_budget("none") == 0
    assert effort_budget("xhigh") is effort_budget("max") is effort_budget("ultra") is None
    limited = [effort_budget(e) for e in ("minimal", "low", "medium", "high")]
    assert limited == sorted(limited) and len(set(limited)) == 4
    assert set(EFFORT_BUDGETS) == {"none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"}


@pytest.mark.parametrize("budget", [0, 3, 8])
def test_budget_cuts_diffusion_thinking_and_continues_from_the_state(session, budget):
    tok = session.tokenizer
    prompt = session.render(MESSAGES)
    assert prompt.endswith("<think>\n")
    ids, close = tok.encode(prompt), tok.encode(CLOSE_THINK)
    free = _raw_ids(session, ids, MAX_TOKENS)
    assert tok.token_id("</think>") not in free and len(free) == MAX_TOKENS  # it would think all the way

    reasoning, content, done = _reply(session, _params(reasoning_budget=budget))
    # The thinking is a generation of `budget` tokens (its last block as long as the budget leaves);
    # on a block boundary that is the start of the unbudgeted thinking.
    thought = _raw_ids(session, ids, budget) if budget else []
    assert len(thought) == budget and (budget % 4 or thought == free[:budget])
    assert reasoning == tok.decode(thought).strip()  # (the parser trims the reasoning)
    rest = _raw_ids(session, ids + thought + close, MAX_TOKENS - budget - len(close))
    assert content == tok.decode(rest).lstrip() and rest
    assert done.usage.completion_tokens == MAX_TOKENS and done.finish_reason == "length"
    assert done.stats.blocks == -(-budget // 4) + 1 + -(-len(rest) // 4)  # the closing text: one block


def test_no_budget_when_thinking_is_off(session):
    off = {"enable_thinking": False}
    plain = list(session.stream(MESSAGES, params=_params(), chat_template_kwargs=off))
    budgeted = list(session.stream(MESSAGES, params=_params(reasoning_budget=2), chat_template_kwargs=off))
    texts = [[getattr(e, "text", None) for e in run if isinstance(e, (ContentDelta, ReasoningDelta))]
             for run in (plain, budgeted)]
    assert texts[0] == texts[1] and not any(isinstance(e, ReasoningDelta) for e in plain)
