"""Reasoning and tool-call parsing: the examples of docs/tool-calls.md, fed whole and split at every
boundary, and random text with tag-like pieces."""

from __future__ import annotations

import codecs
import json
import re

import pytest
from clover_runtime.text.output_parser import OutputParser, accumulate, convert_value, parse_full
from clover_runtime.text.reply import ToolCallArgs, ToolCallStart
from hypothesis import given, settings
from hypothesis import strategies as st

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "limit": {"type": ["integer", "null"]}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}, "options": {"type": "object"},
        "tags": {"type": "array"}, "dry_run": {"type": "boolean"}}}}},
]

EX1 = ("The user wants a 3-day forecast for Paris; call get_weather.\n</think>\n\nI'll check the forecast.\n\n"
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
       "</parameter>\n</function>\n</tool_call>")
EX2 = ("<tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n</parameter>\n</function>\n</tool_call>\n"
       "<tool_call>\n<function=read_file>\n<parameter=path>\nb.txt\n</parameter>\n<parameter=limit>\n10\n"
       "</parameter>\n</function>\n</tool_call>")
EX3 = ('<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/app.py\n</parameter>\n<parameter=content>\n'
       'def main():\n    print("use <parameter=x> literally")\n\n</parameter>\n<parameter=options>\n'
       '{"mode": "overwrite", "mkdirs": true}\n</parameter>\n<parameter=tags>\n["py", "demo"]\n</parameter>\n'
       '<parameter=dry_run>\nfalse\n</parameter>\n</function>\n</tool_call>')
EX4 = ("Maybe <tool_call>\n<function=read_file>\n<parameter=path>\ndraft.txt\n</parameter>\n</function>\n"
       "</tool_call> — no, read the real file.\n</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\n"
       "007\n</parameter>\n<parameter=limit>\nNone\n</parameter>\n</function>\n</tool_call>")
OLD_JSON = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'


def _norm(p):
    return (p.content, p.reasoning, [(c["function"]["name"], c["function"]["arguments"]) for c in p.tool_calls],
            p.errors)


def _feed_all(pieces: list[str], reasoning: bool, tools=TOOLS) -> list:
    parser = OutputParser(tools, starts_in_reasoning=reasoning)
    return [d for piece in pieces for d in parser.feed(piece)] + parser.finish()


def _split_equal(text: str, reasoning: bool, tools=TOOLS) -> None:
    """Two pieces cut at every UTF-8 byte boundary (each side decoded as a stream decoder would:
    a partial character waits for its last byte), then one character at a time."""
    whole = _norm(parse_full(text, tools, starts_in_reasoning=reasoning))
    data = text.encode("utf-8")
    for i in range(len(data) + 1):
        dec = codecs.getincrementaldecoder("utf-8")()
        pieces = [dec.decode(data[:i]), dec.decode(data[i:], final=True)]
        assert _norm(accumulate(_feed_all(pieces, reasoning, tools))) == whole, f"split at byte {i}"
    assert _norm(accumulate(_feed_all(list(text), reasoning, tools))) == whole
    for call in parse_full(text, tools, starts_in_reasoning=reasoning).tool_calls:
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


def test_example_1_reasoning_content_and_one_call() -> None:
    out = parse_full(EX1, TOOLS, starts_in_reasoning=True)
    assert out.reasoning == "The user wants a 3-day forecast for Paris; call get_weather."
    assert out.content == "I'll check the forecast."
    assert [c["function"]["arguments"] for c in out.tool_calls] == ['{"city": "Paris", "days": 3}']
    assert re.fullmatch(r"call_[0-9a-f]{24}", out.tool_calls[0]["id"])
    _split_equal(EX1, True)


def test_example_2_two_calls_no_content() -> None:
    out = parse_full(EX2, TOOLS)
    assert out.content is None
    assert [json.loads(c["function"]["arguments"]) for c in out.tool_calls] == [
        {"path": "a.txt"}, {"path": "b.txt", "limit": 10}]
    _split_equal(EX2, False)


def test_example_3_code_object_array_boolean() -> None:
    args = json.loads(parse_full(EX3, TOOLS).tool_calls[0]["function"]["arguments"])
    assert args == {"path": "src/app.py", "content": 'def main():\n    print("use <parameter=x> literally")\n',
                    "options": {"mode": "overwrite", "mkdirs": True}, "tags": ["py", "demo"], "dry_run": False}
    _split_equal(EX3, False)


def test_example_4_call_inside_reasoning_is_not_a_call() -> None:
    out = parse_full(EX4, TOOLS, starts_in_reasoning=True)
    assert "draft.txt" in out.reasoning
    assert [json.loads(c["function"]["arguments"]) for c in out.tool_calls] == [{"path": "007", "limit": None}]
    _split_equal(EX4, True)


def test_old_json_form() -> None:
    out = parse_full(OLD_JSON, TOOLS)
    assert json.loads(out.tool_calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    _split_equal(OLD_JSON, False)


def test_unknown_function_is_reported_and_kept_as_content() -> None:
    """A call to a tool the request did not offer never reaches the client as a tool call."""
    text = "<tool_call>\n<function=launch>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
    out = parse_full(text, TOOLS)
    assert out.errors == ["the model called an unknown function 'launch'; its text is kept as content"]
    assert out.tool_calls == [] and out.content == text
    assert [(m.name, m.arguments) for m in out.markup] == [("launch", (("x", "1"),))]
    _split_equal(text, False)


def test_a_call_when_no_tools_were_given_is_markup_not_a_call() -> None:
    """As llama-server and OpenAI answer a request without tools: no `tool_calls`; the text stays
    content, marked as markup (name and arguments as written) for a screen to word."""
    text = ("Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
            "</function>\n</tool_call>")
    out = parse_full(text, None)
    assert out.tool_calls == [] and out.content == text
    assert out.errors == ["the model called 'get_weather' but no tools were given; its text is kept as content"]
    assert [(m.text, m.name, m.arguments) for m in out.markup] == [
        ("\n\n" + text.split("\n\n", 1)[1], "get_weather", (("city", "Oslo"),))]
    old = parse_full(OLD_JSON, None)
    assert old.tool_calls == []
    assert [(m.name, m.arguments) for m in old.markup] == [("get_weather", (("city", "Oslo"), ("days", 2)))]
    _split_equal(text, False, tools=None)
    _split_equal(OLD_JSON, False, tools=None)


@pytest.mark.parametrize("text", [
    "Islo\n</parameter>\n</function>\n</tool_call>",  # what the demo model wrote for "What is the weather in Oslo?"
    "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function> and more text",
    "Sure. </tool_call> Done </function>",
])
def test_stray_tags_outside_a_call_are_markup_and_the_content_is_unchanged(text: str) -> None:
    for tools in (TOOLS, None):
        out = parse_full(text, tools)
        assert out.content == text and out.tool_calls == []
        assert out.markup and all(m.name is None for m in out.markup)
        shown = out.content
        for m in out.markup:
            shown = shown.replace(m.text, "")
        assert "</" not in shown and "<function=" not in shown and "<parameter=" not in shown
        _split_equal(text, False, tools=tools)
        pieces = _feed_all(list(text), False, tools)
        assert [d.text for d in pieces if type(d).__name__ == "ToolMarkup"] == [m.text for m in out.markup]


def test_tags_stay_plain_text_when_calls_are_not_parsed() -> None:
    out = parse_full("a </parameter> b", TOOLS, parse_tool_calls=False)
    assert out.content == "a </parameter> b" and out.markup == []


@pytest.mark.parametrize("text", [
    "<tool_call>\nnot a call\n</tool_call>",
    "<tool_call>\n<function={{ tool.name }}>\n</function>\n</tool_call>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>",
])
def test_malformed_calls_are_reported_and_kept_as_content(text: str) -> None:
    out = parse_full(text, TOOLS)
    assert out.tool_calls == []
    assert len(out.errors) == 1 and out.errors[0].startswith("malformed tool call")
    assert out.content == text
    _split_equal(text, False)


def test_tags_inside_values_count_only_in_context() -> None:
    text = ("<tool_call>\n<function=write_file>\n<parameter=content>\nclose with </parameter> then go on\n"
            "<parameter=nope>\n</parameter>\n<parameter=path>\nREADME.md\n</parameter>\n</function>\n</tool_call>")
    args = json.loads(parse_full(text, TOOLS).tool_calls[0]["function"]["arguments"])
    assert args == {"content": "close with </parameter> then go on\n<parameter=nope>", "path": "README.md"}
    _split_equal(text, False)


def test_missing_close_tags_are_tolerated() -> None:
    text = ("<tool_call>\n<function=write_file>\n<parameter=content>\nabc\n<parameter=path>\np.txt\n</parameter>\n"
            "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n")
    out = parse_full(text, TOOLS)
    assert [json.loads(c["function"]["arguments"]) for c in out.tool_calls] == [
        {"content": "abc", "path": "p.txt"}, {"city": "Rome"}]
    assert out.errors == []
    _split_equal(text, False)


def test_a_reply_cut_inside_a_call_still_gives_valid_arguments() -> None:
    text = ("Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
            "<parameter=content>\nx = 1")
    out = parse_full(text, TOOLS)
    assert out.content == "Writing it."
    assert json.loads(out.tool_calls[0]["function"]["arguments"]) == {"path": "a.py", "content": "x = 1"}
    assert any("cut off" in e for e in out.errors)
    _split_equal(text, False)


def test_call_ending_unclosed_reasoning_is_a_call_but_a_draft_is_not() -> None:
    call = "<tool_call>\n<function=read_file>\n<parameter=path>\nx\n</parameter>\n</function>\n</tool_call>"
    out = parse_full("I need the file. " + call, TOOLS, starts_in_reasoning=True)
    assert out.reasoning == "I need the file." and out.content is None
    assert [c["function"]["name"] for c in out.tool_calls] == ["read_file"]
    draft = parse_full("Maybe " + call + "\nNo, not yet.", TOOLS, starts_in_reasoning=True)
    assert draft.tool_calls == [] and draft.reasoning.endswith("No, not yet.") and "read_file" in draft.reasoning
    _split_equal("I need the file. " + call, True)
    _split_equal("Maybe " + call + "\nNo, not yet.", True)


def test_content_after_the_calls_and_disabled_call_parsing() -> None:
    text = EX2 + "\nDone."
    out = parse_full(text, TOOLS)
    assert len(out.tool_calls) == 2 and out.content == "Done."
    plain = parse_full(EX1, TOOLS, starts_in_reasoning=True, parse_tool_calls=False)
    assert plain.tool_calls == [] and plain.content.startswith("I'll check the forecast.\n\n<tool_call>")
    _split_equal(text, False)


def test_deltas_arrive_as_soon_as_they_are_certain() -> None:
    parser = OutputParser(TOOLS)
    assert parser.feed("<tool_call>\n<function=read_fi") == []
    start = parser.feed("le>\n<parameter=path>\na.txt\n</parameter>\n")
    assert [type(d) for d in start] == [ToolCallStart, ToolCallArgs]
    assert start[0].name == "read_file" and start[1].fragment == "{"
    # One diffusion block can finish a parameter, the call and start the next call.
    block = parser.feed("<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>\n"
                        "<tool_call>\n<function=get_weather>\n")
    assert [(type(d), d.index) for d in block] == [(ToolCallArgs, 0), (ToolCallStart, 1), (ToolCallArgs, 1)]
    assert block[0].fragment == '"path": "a.txt", "limit": 5}'
    rest = parser.feed("<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>") + parser.finish()
    assert "".join(d.fragment for d in rest) == '"city": "Oslo"}'


@pytest.mark.parametrize(("raw", "schema", "value"), [
    ("3", {"type": "integer"}, 3), ("2.0", {"type": "number"}, 2), ("2.5", {"type": "number"}, 2.5),
    ("True", {"type": "boolean"}, True), ("false", {"type": "boolean"}, False),
    ("None", {"type": ["integer", "null"]}, None), ("007", {"type": "string"}, "007"),
    ("{'k': 'v'}", {"type": "object"}, {"k": "v"}), ("[1, 2]", {"type": "array"}, [1, 2]),
    ("42", None, "42"), ("x y", {"type": "integer"}, "x y"), ("1e999", {"type": "number"}, "1e999"),
    ("12345678901234567890", {"type": "number"}, 12345678901234567890), ("NULL", {"type": "integer"}, None),
    ("null", {"type": "string"}, "null"), ("null", {"anyOf": [{"type": "string"}, {"type": "null"}]}, None),
    ("True", {"type": ["boolean", "null"]}, True), ("{1, 2}", {"type": "object"}, "{1, 2}"),
    ("metric", {"enum": ["metric", "imperial"]}, "metric"),
])
def test_values_are_typed_by_schema(raw: str, schema, value) -> None:
    assert convert_value(raw, schema) == value


def test_thinking_off_plain_content() -> None:
    out = parse_full("Paris is the capital.", TOOLS)
    assert (out.content, out.reasoning, out.tool_calls) == ("Paris is the capital.", None, [])
    _split_equal("Paris is the capital.", False)
    explicit = parse_full("<think>\nhmm\n</think>\n\nAnswer", TOOLS)
    assert (explicit.reasoning, explicit.content) == ("hmm", "Answer")


TAG_SOUP = ["a", " ", "\n", "<", ">", "/", "—", "<tool", "_call>", "</think>", "<think>", "x<b>", "{", "}", "None",
            "</tool_call>", "<tool_call>", "<function=get_weather>", "<function=read_file>", "<function={{x}}>",
            "<parameter=city>", "<parameter=limit>", "<parameter=path>", "</parameter>", "</function>", "7",
            '{"name": "read_file", "arguments": {"path": "p"}}']


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(TAG_SOUP), max_size=25), st.booleans())
def test_random_tag_soup_is_split_invariant(pieces: list[str], reasoning: bool) -> None:
    _split_equal("".join(pieces), reasoning)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([EX1, EX2, EX3, EX4, OLD_JSON]), st.lists(st.integers(0, 400), max_size=8))
def test_examples_cut_into_many_pieces(text: str, cuts: list[int]) -> None:
    reasoning = text in (EX1, EX4)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    whole = parse_full(text, TOOLS, starts_in_reasoning=reasoning)
    assert _norm(accumulate(_feed_all(pieces, reasoning))) == _norm(whole)
