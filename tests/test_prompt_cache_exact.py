"""The prompt cache does not change answers with the default (8-bit activation) kernels.

A cached continuation starts at an aligned checkpoint and the engine cuts its rows at the same
absolute positions on every path, so its logits equal a cold prefill's (the issue measured 0.59
before, and one replayed agent reply changed). The reference is always a cold pass from an empty
state; the models are random-weight synthetic files, where a round-off difference grows fast.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from clover_runtime import load_model
from clover_runtime.chat import load_chat
from clover_runtime.decoding import DecodeParams
from clover_runtime.engine.align import ALIGN
from clover_runtime.prompt_cache import PromptCache
from clover_runtime.text.reply import ContentDelta, ReasoningDelta, ToolCallArgs, ToolCallStart
from synth_models import small_model_path

TOL = 1e-5
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _max_abs(got: np.ndarray, want: np.ndarray) -> float:
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite)
    return float(np.max(np.abs(got[finite] - want[finite])))


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_continuation_from_any_aligned_split_equals_cold(quant: str) -> None:
    model = load_model(small_model_path(quant), backend="numba")
    assert not model.weights.exact_kernels
    ids = np.random.default_rng(0).integers(10, model.config.n_tokens, 5 * ALIGN + 17)
    cold = model.forward(ids)
    for split in (ALIGN, 2 * ALIGN, 4 * ALIGN, 5 * ALIGN):
        state = model.new_state(len(ids))
        got = np.concatenate([model.forward(ids[:split], state), model.forward(ids[split:], state)])
        assert _max_abs(got, cold) <= TOL, split
        assert np.array_equal(got.argmax(1), cold.argmax(1))


def _reply(events) -> tuple[str, list[str]]:  # noqa: ANN001
    text, calls = [], []
    for ev in events:
        if isinstance(ev, (ContentDelta, ReasoningDelta)):
            text.append(ev.text)
        elif isinstance(ev, (ToolCallStart, ToolCallArgs)):
            calls.append(repr(ev))
    return "".join(text), calls


def test_replayed_tool_conversation_same_with_and_without_cache() -> None:
    """An agent loop (tools, a call, its result, an answer, a follow-up) replayed turn by turn:
    greedy replies and the logits at every turn's last prompt token agree with a cold prefill."""
    session = load_chat(small_model_path("Q8_0"), n_ctx=2048, backend="numba")
    model = session.model
    params = DecodeParams(decode="ar", max_tokens=8)  # greedy: the file says temp 0
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    script = [
        {"role": "system", "content": "You answer weather questions with the tool. " * 6},
        {"role": "user", "content": "What is the weather in Paris tomorrow afternoon?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp_c": 27, "sky": "clear"})},
        {"role": "assistant", "content": "It will be 27 °C and clear in Paris."},
        {"role": "user", "content": "And in Lyon? Answer in one short sentence please."},
    ]
    warm = session.new_cache(checkpoint_every=0)
    probe = session.new_cache(checkpoint_every=0)  # the same turns, for the logits
    cached = []
    for turn in (2, 4, 6):
        messages = script[:turn]
        cold_reply = _reply(session.stream(messages, tools=TOOLS, params=params))
        warm_reply = _reply(session.stream(messages, tools=TOOLS, params=params, cache=warm))
        assert warm_reply == cold_reply, turn
        ids = session.prepare(messages, tools=TOOLS).ids
        cached.append(probe.prepare(ids).cached)
        got = model.forward(ids[-1:], probe.state)
        assert _max_abs(got, model.forward(ids, last_only=True)) <= TOL, turn
        reply_ids = session.tokenizer.encode(cold_reply[0])[:8]
        for t in reply_ids:  # decoded one at a time, as a generation leaves the state
            model.forward([t], probe.state)
        probe.finish(ids, reply_ids)
    assert cached[0] == 0 and all(c > 0 and c % ALIGN == 0 for c in cached[1:]), cached


def test_cache_never_resumes_from_an_unaligned_or_decoded_state() -> None:
    model = load_model(small_model_path("Q8_0"), backend="numba")
    cache = PromptCache(model, 1024, checkpoint_every=0)
    prompt = list(np.random.default_rng(1).integers(10, model.config.n_tokens, 150))
    cache.prepare(prompt)
    model.forward(prompt[-1:] + [11, 12], cache.state)
    cache.finish(prompt, [11, 12])
    assert cache.reusable(prompt + [11, 12, 13, 14]) == 2 * ALIGN  # not the 152 tokens held
