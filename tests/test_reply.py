"""The reply accumulator: finish reasons and tool calls assembled from the parser's streamed events."""

from __future__ import annotations

import json

import pytest
from clover_runtime.text.output_parser import OutputParser
from clover_runtime.text.reply import (
    ContentDelta,
    Finished,
    ParseError,
    ReasoningDelta,
    Reply,
    ToolCallArgs,
    ToolCallStart,
    Usage,
)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
TWO_CALLS = ("Checking both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
             "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>")


def _streamed(text: str, size: int, reason: str = "stop") -> tuple[Reply, list]:
    parser = OutputParser(TOOLS)
    events = []
    for i in range(0, len(text), size):
        events += parser.feed(text[i:i + size])
    events += parser.finish()
    events.append(Finished(reason, Usage(5, 9)))
    reply = Reply()
    for ev in events:
        reply.add(ev)
    return reply, events


@pytest.mark.parametrize("size", [1, 3, 7, 32, len(TWO_CALLS)])
def test_tool_calls_assemble_from_fragments_however_the_text_is_split(size: int) -> None:
    reply, events = _streamed(TWO_CALLS, size)
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [e.index for e in starts] == [0, 1]
    if size < 16:  # small pieces: the arguments of the first call arrive in several fragments
        assert sum(isinstance(e, ToolCallArgs) and e.index == 0 for e in events) > 1
    assert reply.content == "Checking both."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Oslo"})]
    assert [c["id"] for c in reply.tool_calls] == [e.id for e in starts]
    assert reply.finish_reason == "tool_calls"
    assert reply.message()["tool_calls"] == reply.tool_calls


def test_finish_reason_stop_length_and_cancelled_pass_through_without_calls() -> None:
    for reason in ("stop", "length", "cancelled"):
        reply, _ = _streamed("Just an answer.", 4, reason)
        assert reply.finish_reason == reason and reply.tool_calls == []
        assert reply.usage == Usage(5, 9) and reply.usage.total_tokens == 14


def test_a_reply_cut_by_length_after_a_call_says_length() -> None:
    reply, _ = _streamed(TWO_CALLS, 5, "length")
    assert len(reply.calls) == 2 and reply.finish_reason == "length"


def test_no_finish_reason_before_finished_and_a_call_without_arguments_is_empty_json() -> None:
    reply = Reply()
    for ev in (ReasoningDelta("hmm"), ContentDelta("a"), ContentDelta("b"), ToolCallStart(0, "call_x", "now"),
               ParseError("bad call")):
        reply.add(ev)
    assert reply.finish_reason is None and reply.usage == Usage() and reply.stats is None
    assert (reply.reasoning, reply.content, reply.errors) == ("hmm", "ab", ["bad call"])
    assert reply.tool_calls == [{"id": "call_x", "type": "function", "function": {"name": "now", "arguments": "{}"}}]
    reply.add(Finished("stop"))
    assert reply.finish_reason == "tool_calls"
    assert reply.message() == {"role": "assistant", "content": "ab", "reasoning_content": "hmm",
                               "tool_calls": reply.tool_calls}


def test_a_call_started_out_of_order_is_an_error() -> None:
    reply = Reply()
    with pytest.raises(ValueError, match="out of order"):
        reply.add(ToolCallStart(1, "call_y", "f"))
