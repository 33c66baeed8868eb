"""Reasoning and tool-call parsing: the examples of tool-calls.md, fed whole and split at every
boundary, and random text with tag-like pieces."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.output_parser import OutputParser, accumulate, convert_value, parse_full

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


def _split_equal(text: str, reasoning: bool) -> None:
    whole = _norm(parse_full(text, TOOLS, starts_in_reasoning=reasoning))
    for i in range(len(text) + 1):
        parser = OutputParser(TOOLS, starts_in_reasoning=reasoning)
        got = accumulate(parser.feed(text[:i]) + parser.feed(text[i:]) + parser.finish())
        assert _norm(got) == whole, f"split at {i}"
    parser = OutputParser(TOOLS, starts_in_reasoning=reasoning)
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()
    assert _norm(accumulate(deltas)) == whole


def test_example_1_reasoning_content_and_one_call() -> None:
    out = parse_full(EX1, TOOLS, starts_in_reasoning=True)
    assert out.reasoning == "The user wants a 3-day forecast for Paris; call get_weather."
    assert out.content == "I'll check the forecast."
    assert [c["function"]["arguments"] for c in out.tool_calls] == ['{"city": "Paris", "days": 3}']
    assert out.tool_calls[0]["id"].startswith("call_") and len(out.tool_calls[0]["id"]) == 29
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


def test_old_json_form_and_errors() -> None:
    out = parse_full(OLD_JSON, TOOLS)
    assert json.loads(out.tool_calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    _split_equal(OLD_JSON, False)
    unknown = parse_full("<tool_call>\n<function=launch>\n</function>\n</tool_call>", TOOLS)
    assert unknown.errors == ["the model called an unknown function 'launch'"]
    assert unknown.tool_calls[0]["function"]["arguments"] == "{}"
    broken = parse_full("<tool_call>\nnot a call\n</tool_call>", TOOLS)
    assert broken.errors and broken.errors[0].startswith("malformed tool call")
    assert broken.content == "not a call"


@pytest.mark.parametrize(("raw", "schema", "value"), [
    ("3", {"type": "integer"}, 3), ("2.0", {"type": "number"}, 2), ("2.5", {"type": "number"}, 2.5),
    ("True", {"type": "boolean"}, True), ("false", {"type": "boolean"}, False),
    ("None", {"type": ["integer", "null"]}, None), ("007", {"type": "string"}, "007"),
    ("{'k': 'v'}", {"type": "object"}, {"k": "v"}), ("[1, 2]", {"type": "array"}, [1, 2]),
    ("42", None, "42"), ("x y", {"type": "integer"}, "x y"),
])
def test_values_are_typed_by_schema(raw: str, schema, value) -> None:
    assert convert_value(raw, schema) == value


def test_thinking_off_plain_content() -> None:
    out = parse_full("Paris is the capital.", TOOLS)
    assert (out.content, out.reasoning, out.tool_calls) == ("Paris is the capital.", None, [])
    _split_equal("Paris is the capital.", False)
    explicit = parse_full("<think>\nhmm\n</think>\n\nAnswer", TOOLS)
    assert (explicit.reasoning, explicit.content) == ("hmm", "Answer")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["a", " ", "\n", "<", ">", "/", "<tool", "_call>", "</think>", "<think>", "x<b>",
                                 "</tool_call>", "<function=get_weather>", "<parameter=city>", "</parameter>"]),
                max_size=25), st.booleans())
def test_random_tag_soup_is_split_invariant(pieces: list[str], reasoning: bool) -> None:
    _split_equal("".join(pieces), reasoning)
