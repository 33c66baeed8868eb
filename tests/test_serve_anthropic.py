"""Anthropic's Messages API (`/v1/messages`) driven by the official `anthropic` SDK against the real
server: a tool round trip (tool_use, then tool_result), thinking blocks, stop sequences, the exact
streamed event sequence, count_tokens, x-api-key auth and Anthropic-shaped errors."""

from __future__ import annotations

import json

import anthropic
import api_helpers as h
import httpx
import pytest
from api_helpers import ANSWER, ARGS, CALL, KEY, QUESTION, REASONING

TOOLS = [{"name": "get_weather", "description": "Weather forecast for a city", "input_schema": h.WEATHER_SCHEMA}]
ASK = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def server():
    with h.tool_server() as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60)


def _ask(client, messages=ASK, **kw):
    kw.setdefault("max_tokens", 64)
    kw.setdefault("tools", TOOLS)
    # this SDK has no sampling arguments any more; older clients send them as fields of the body
    kw.setdefault("extra_body", {"temperature": 0.0, "top_p": 0.9, "top_k": 20})
    return client.messages.create(model="tool-model", messages=messages, **kw)


def test_tool_use_round_trip(client):
    first = _ask(client, system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Use tools."}])
    assert first.type == "message" and first.role == "assistant" and first.id.startswith("msg_")
    assert first.stop_reason == "tool_use" and first.stop_sequence is None
    (call,) = first.content  # thinking is off unless asked for, as in Anthropic's API
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == ARGS
    assert call.id.startswith("toolu_")
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0

    result = {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "18 °C, sunny"}]}
    second = _ask(client, [*ASK, {"role": "assistant", "content": first.content},
                           {"role": "user", "content": [result]}])
    assert second.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in second.content] == [("text", ANSWER)]
    total = second.usage.input_tokens + second.usage.cache_read_input_tokens  # cache reads count apart
    assert total > first.usage.input_tokens + first.usage.cache_read_input_tokens


def test_thinking_blocks_and_count_tokens(client):
    res = _ask(client, thinking={"type": "enabled", "budget_tokens": 256})
    assert [b.type for b in res.content] == ["thinking", "tool_use"]
    assert res.content[0].thinking == REASONING
    counted = client.messages.count_tokens(model="tool-model", messages=ASK, tools=TOOLS,
                                           thinking={"type": "enabled", "budget_tokens": 256})
    assert counted.input_tokens == res.usage.input_tokens + res.usage.cache_read_input_tokens
    plain = client.messages.count_tokens(model="tool-model", messages=ASK)
    assert 0 < plain.input_tokens < counted.input_tokens  # the tool definitions are in the prompt


def test_streamed_event_sequence(client):
    with client.messages.create(model="tool-model", messages=ASK, tools=TOOLS, max_tokens=64, stream=True,
                                thinking={"type": "enabled", "budget_tokens": 256}) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[0].message.usage.input_tokens > 0 and events[0].message.content == []
    starts = [e for e in events if e.type == "content_block_start"]
    assert [(s.index, s.content_block.type) for s in starts] == [(0, "thinking"), (1, "tool_use")]
    # each block: start, its deltas, stop, before the next one starts
    blocks = [e for e in events if e.type.startswith("content_block")]
    for index, kind in ((0, "thinking_delta"), (1, "input_json_delta")):
        mine = [e for e in blocks if e.index == index]
        assert mine[0].type == "content_block_start" and mine[-1].type == "content_block_stop"
        assert {e.delta.type for e in mine[1:-1]} == {kind}
    assert [e.index for e in blocks] == sorted(e.index for e in blocks)
    thinking = "".join(e.delta.thinking for e in blocks if e.type == "content_block_delta" and e.index == 0)
    arguments = "".join(e.delta.partial_json for e in blocks if e.type == "content_block_delta" and e.index == 1)
    assert thinking == REASONING and json.loads(arguments) == ARGS
    assert starts[1].content_block.name == "get_weather" and starts[1].content_block.id.startswith("toolu_")
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens > 0

    with client.messages.stream(model="tool-model", messages=ASK, tools=TOOLS, max_tokens=64) as stream:
        final = stream.get_final_message()  # the SDK's own accumulation of the events
    assert final.stop_reason == "tool_use" and final.content[0].input == ARGS


def test_stop_sequences_max_tokens_and_tool_choice(client):
    res = _ask(client, tool_choice={"type": "none"}, stop_sequences=["get_weather"])
    assert res.stop_reason == "stop_sequence" and res.stop_sequence == "get_weather"
    assert res.content[0].text == CALL[:CALL.index("get_weather")]
    short = _ask(client, tool_choice={"type": "none"}, max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    forced = _ask(client, tool_choice={"type": "tool", "name": "get_weather"})
    assert forced.stop_reason == "tool_use"


def test_errors_are_anthropic_shaped(server, client):
    with httpx.Client(base_url=server.base_url, headers={"x-api-key": KEY}) as c:  # max_tokens is required
        r = c.post("/v1/messages", json={"model": "tool-model", "messages": ASK})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "max_tokens: Field required"}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as info:
        _ask(client, [{"role": "user", "content": [image]}])
    assert "messages.0.content.0: image content is not supported" in info.value.message
    with pytest.raises(anthropic.AuthenticationError) as info:
        anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0).messages.create(
            model="tool-model", messages=ASK, max_tokens=8)
    assert info.value.body["error"]["type"] == "authentication_error"
    with httpx.Client(base_url=server.base_url) as c:  # Bearer works here as everywhere
        r = c.post("/v1/messages", headers={"Authorization": f"Bearer {KEY}"},
                   json={"messages": ASK, "max_tokens": 8, "tool_choice": {"type": "tool"}, "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("tool_choice.name")


def test_demo_model_weather_round_trip():
    """The shipped demo model through the Messages API: it calls get_weather, then reports."""
    system, tools = h.demo_tools()
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in tools]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with h.demo_server() as live:
        client = anthropic.Anthropic(base_url=live.base_url, api_key="none", max_retries=0, timeout=120)
        first = client.messages.create(model="demo", system=system, messages=ask, tools=tools, max_tokens=64)
        assert first.stop_reason == "tool_use", first.content
        call = first.content[-1]
        assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
        result = {"type": "tool_result", "tool_use_id": call.id, "content": "Paris: 18 °C, sunny"}
        with client.messages.stream(model="demo", system=system, tools=tools, max_tokens=64, messages=[
                *ask, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
    assert final.stop_reason == "end_turn"
    assert text == "It is 18 °C and sunny in Paris."
