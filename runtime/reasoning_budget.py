"""A reasoning budget: at most N thinking tokens, then `</think>` is written for the model.

Block diffusion reveals a whole block at once, so a token cannot be forced mid-block by the
sampler. Instead the first phase generates at most `budget` tokens and stops early at `</think>`;
if the model is still thinking, the closing text is appended to the same decoding state (no
re-prefill) and generation continues from there as the answer. Both phases' events come out as
one generation: block indices continue and the statistics are summed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .decoding import BlockEvent, DecodeParams, DoneEvent, GenerationStats, PassEvent, generate

# OpenAI's `reasoning_effort` levels (and Hermes Agent's "max" and "ultra") as thinking-token
# budgets. Qwen3.6 has no effort levels of its own; these follow the common 1K/4K/16K ladder (low
# answers quickly, high leaves room for the long chains Qwen recommends for hard problems). Above
# "high" there is no limit; "none" turns thinking off.
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096,
                                         "high": 16384, "xhigh": None, "max": None, "ultra": None}
ANSWER_LEAD = "\n\n"  # what the model writes between `</think>` and its answer
CLOSE_THINK = "\n</think>" + ANSWER_LEAD  # what the model itself writes after its reasoning (docs/tool-calls.md)


def effort_budget(effort: str) -> int | None:
    """Thinking tokens allowed for a `reasoning_effort` level: 0 = thinking off, None = no limit."""
    return EFFORT_BUDGETS[effort]


def generate_with_budget(model: Any, prompt_ids: Sequence[int], params: DecodeParams, *, state: Any,
                         cancel: threading.Event | None, budget: int | None, end_id: int,
                         close_ids: Sequence[int], lead_ids: Sequence[int] = ()) -> Iterator[Any]:
    """`decoding.generate` for a prompt that opens a `<think>` block, with at most `budget`
    tokens before `</think>` (`end_id`; None: no limit); when the budget runs out, `close_ids` are
    written. A grammar in `params` constrains the answer only, as vLLM's reasoning parsers do: the
    reasoning is free, and after the model's own `</think>` the blank line it writes there
    (`lead_ids`) is written for it, so the constrained answer starts where the model's would."""
    start = state.n_past + len(prompt_ids)
    first = replace(params, max_tokens=params.max_tokens if budget is None else min(budget, params.max_tokens),
                    stop_ids=frozenset(params.stop_ids) | {int(end_id)}, grammar=None)
    emitted: list[int] = []
    head: GenerationStats | None = None
    for ev in generate(model, prompt_ids, first, state=state, cancel=cancel):
        if isinstance(ev, DoneEvent):
            head = ev.stats
            continue
        if isinstance(ev, BlockEvent):
            emitted.extend(ev.token_ids)
        yield ev
    assert head is not None
    if head.finish_reason == "stop" and head.stop_token == end_id:
        tail = [int(end_id)]  # the model closed its reasoning itself, within the budget
        if params.grammar is not None:
            tail += [int(t) for t in lead_ids]
    elif head.finish_reason == "length" and head.generated_tokens == first.max_tokens < params.max_tokens:
        tail = [int(t) for t in close_ids]  # still thinking at the budget: close it for the model
    else:  # an end of turn, max_tokens, a full context or a cancel: nothing follows
        yield DoneEvent(head)
        return
    head.generated_tokens += len(tail)
    head.blocks += 1
    yield BlockEvent(head.blocks - 1, tuple(tail))
    # Tokens of a block cut at `</think>` were shown but never committed to the state.
    pending = emitted[state.n_past - start:] + tail
    rest = params.max_tokens - head.generated_tokens
    if rest <= 0 or len(pending) >= state.remaining:
        head.finish_reason = "length"
        yield DoneEvent(head)
        return
    offset = head.blocks
    for ev in generate(model, pending, replace(params, max_tokens=rest), state=state, cancel=cancel):
        if isinstance(ev, PassEvent):
            yield replace(ev, block=ev.block + offset)
        elif isinstance(ev, BlockEvent):
            yield replace(ev, block=ev.block + offset)
        elif isinstance(ev, DoneEvent):
            yield DoneEvent(_merged(head, ev.stats))


def _merged(head: GenerationStats, tail: GenerationStats) -> GenerationStats:
    """One generation's statistics from its two phases (the second phase's prefill is generation)."""
    history = head.experts_history + tail.experts_history
    return replace(
        head,
        generated_tokens=head.generated_tokens + tail.generated_tokens,
        gen_ms=head.gen_ms + tail.prompt_ms + tail.gen_ms,
        forwards=head.forwards + 1 + tail.forwards,
        passes=head.passes + tail.passes,
        blocks=head.blocks + tail.blocks,
        experts_per_pass=float(np.mean(history)) if history else 0.0,
        finish_reason=tail.finish_reason,
        stop_token=tail.stop_token,
        stop_logprob=tail.stop_logprob,
        experts_history=history,
    )
