"""Chat templates render exactly as the reference renders of the real Qwen3.6 template."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clover_runtime.errors import TemplateError
from clover_runtime.text.chat_template import ChatTemplate, opens_reasoning

FIXTURES = Path(__file__).resolve().parent / "fixtures_text"
SOURCE = (FIXTURES / "qwen3.6-chat-template.jinja").read_text(encoding="utf-8")
_RENDERS_TEXT = (FIXTURES / "qwen3.6-template-renders.txt").read_text(encoding="utf-8")
# Renders follow the "(verbatim render between the markers)" rule lines; the header mentions the markers too.
RENDERS = re.findall(r"markers\)\n<<<BEGIN>>>(.*?)<<<END>>>", _RENDERS_TEXT, re.DOTALL)

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "description": "Forecast length"},
        "units": {"type": "string", "enum": ["metric", "imperial"]}}, "required": ["city"]}}}


def test_fixture_has_four_renders() -> None:
    assert len(RENDERS) == 4


def test_thinking_on_by_default() -> None:
    out = ChatTemplate(SOURCE).render(SYSTEM_USER)
    assert out == RENDERS[0]
    assert opens_reasoning(out)


def test_thinking_off() -> None:
    out = ChatTemplate(SOURCE).render(SYSTEM_USER, enable_thinking=False)
    assert out == RENDERS[1]
    assert not opens_reasoning(out)


def test_tools_and_tool_reply_with_openai_string_arguments() -> None:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris for 3 days, metric, with options?"},
        {"role": "assistant", "content": "", "reasoning_content": "The user wants the forecast; call get_weather.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather",
             "arguments": '{"city": "Paris", "days": 3, "units": "metric", "opts": {"hourly": true}, '
                          '"tags": ["a", "b"]}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18, "sky": "cloudy"}'},
    ]
    tpl = ChatTemplate(SOURCE)
    assert tpl.supports_tools
    assert tpl.render(messages, tools=[WEATHER_TOOL]) == RENDERS[2]


def test_parallel_calls_and_merged_tool_replies() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Read a.txt and b.txt"},
        {"role": "assistant", "content": "I'll read both files.", "tool_calls": [
            {"type": "function", "function": {"name": "read_file",
                                              "arguments": {"path": "a.txt", "follow": True, "limit": None}}},
            {"type": "function", "function": {"name": "read_file",
                                              "arguments": {"path": "b.txt", "follow": False, "limit": 10}}},
        ]},
        {"role": "tool", "content": "AAA"},
        {"role": "tool", "content": "BBB"},
    ]
    assert ChatTemplate(SOURCE).render(messages) == RENDERS[3]


def test_template_errors_name_the_line() -> None:
    with pytest.raises(TemplateError, match=r"line 2"):
        ChatTemplate("ok\n{{ raise_exception('boom') }}").render([])
    with pytest.raises(TemplateError, match="System message must be at the beginning"):
        ChatTemplate(SOURCE).render([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
    with pytest.raises(TemplateError, match="does not compile at line 1"):
        ChatTemplate("{% if %}")


def test_fallback_and_override(tmp_path: Path) -> None:
    tpl = ChatTemplate.from_metadata({})
    assert tpl.is_fallback
    assert tpl.render([{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    own = tmp_path / "mine.jinja"
    own.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}", encoding="utf-8")
    tpl = ChatTemplate.from_metadata({"tokenizer.chat_template": SOURCE}, override_path=own)
    assert not tpl.is_fallback
    assert tpl.render([{"role": "user", "content": "hi"}]) == "[user] hi\n"
    assert ChatTemplate.from_metadata({"tokenizer.chat_template": SOURCE}).render(SYSTEM_USER) == RENDERS[0]


def test_template_capabilities() -> None:
    qwen = ChatTemplate(SOURCE)
    assert qwen.supports_tools and qwen.opens_think() and not qwen.opens_think(enable_thinking=False)
    assert qwen.generation_prompt() == "<|im_start|>assistant\n<think>\n"
    assert qwen.generation_prompt(enable_thinking=False) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    chatml = ChatTemplate.from_metadata({})
    assert not chatml.supports_tools and not chatml.opens_think()


def test_hf_jinja_helpers() -> None:
    tpl = ChatTemplate("{{ {'b': '<é>', 'a': 1} | tojson }}|{{ strftime_now('%Y') | length }}|{{ flag }}")
    assert tpl.render([], flag="x") == '{"b": "<é>", "a": 1}|4|x'
    with pytest.raises(TemplateError, match="not valid JSON"):
        ChatTemplate(SOURCE).render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "",
                                     "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}])


def test_sandbox_blocks_python_internals() -> None:
    with pytest.raises(TemplateError, match="line 1"):
        ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}").render([])


def test_user_kwargs_cannot_replace_the_conversation() -> None:
    tpl = ChatTemplate(SOURCE)
    extra = {"messages": [{"role": "user", "content": "evil"}]}
    out = tpl.render(SYSTEM_USER, add_generation_prompt=False, **extra)
    assert "evil" not in out and out == RENDERS[0][: -len("<|im_start|>assistant\n<think>\n")]
