"""Tool calling end to end: a model that always answers with one `<tool_call>` (and, after a tool
result, with a sentence), served for real and driven with the official `openai` SDK."""

from __future__ import annotations

import json

import openai
import pytest
from serve_helpers import chat_factory, fixed_reply_model, live_server

CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
REASONING = "The user asks about the weather, so I call the tool."
ANSWER = "It is 18 °C and sunny in Paris."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
ARGS = {"city": "Paris", "days": 3}
QUESTION = [{"role": "user", "content": "What will the weather be in Paris?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server():
    model = fixed_reply_model(CALL, reasoning=REASONING, after_tool=ANSWER)
    with live_server(chat_factory(model, 2048), model_id="tool-model", n_ctx_slot=2048) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


def _ask(client, messages, **kw):
    kw.setdefault("extra_body", NO_THINKING)
    return client.chat.completions.create(model="tool-model", messages=messages, tools=TOOLS, max_tokens=64,
                                          temperature=0, **kw)


def test_tool_call_round_trip(server, client):
    first = _ask(client, QUESTION)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGS  # typed by the schema: days is an integer

    result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18, "sky": "sunny"})}
    history = [*QUESTION, choice.message.model_dump(exclude_none=True), result]
    second = _ask(client, history)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == ANSWER
    assert not second.choices[0].message.tool_calls
    assert second.usage.prompt_tokens > first.usage.prompt_tokens

    with server.client() as c:  # the server rendered the call and the result back into the prompt
        prompt = c.post("/apply-template", json={"messages": history, "tools": TOOLS, **NO_THINKING}).json()["prompt"]
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in prompt
    assert '<tool_response>\n{"temp_c": 18, "sky": "sunny"}\n</tool_response>' in prompt


def test_streamed_tool_call_deltas(client):
    chunks = list(_ask(client, QUESTION, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert len(deltas) >= 2, "the arguments should arrive in more than one delta"
    head, rest = deltas[0], deltas[1:]
    assert head.index == 0 and head.id.startswith("call_") and head.type == "function"
    assert head.function.name == "get_weather"
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == ARGS
    assert not any(c.choices and c.choices[0].delta.content for c in chunks)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0

    whole = _ask(client, QUESTION).choices[0].message.tool_calls[0]
    assert whole.function.arguments == arguments


def test_thinking_mode_splits_reasoning_before_the_call(client):
    res = _ask(client, QUESTION, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    message = res.choices[0].message
    assert message.model_extra["reasoning_content"] == REASONING
    assert res.choices[0].finish_reason == "tool_calls"
    assert json.loads(message.tool_calls[0].function.arguments) == ARGS


def test_tool_choice(client):
    named = _ask(client, QUESTION, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"
    required = _ask(client, QUESTION, tool_choice="required")
    assert required.choices[0].finish_reason == "tool_calls"
    # "none": the tools leave the prompt and nothing the model writes becomes a call.
    none = _ask(client, QUESTION, tool_choice="none")
    assert none.choices[0].finish_reason == "stop" and not none.choices[0].message.tool_calls
    assert none.choices[0].message.content == CALL
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, QUESTION, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert info.value.body["param"] == "tool_choice" and "get_time" in info.value.body["message"]


def test_bad_tool_messages_are_400_naming_the_field(server):
    bad_args = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{city: Paris"}}]}]
    bad_tool = [{"role": "user", "content": "hi"}, {"role": "tool", "content": 7}]
    no_name = {"messages": QUESTION, "tools": [{"type": "function", "function": {"description": "x"}}]}
    with server.client() as c:
        cases = [
            (c.post("/v1/chat/completions", json={"messages": bad_args, "tools": TOOLS}),
             "messages.1.tool_calls.0.function.arguments"),
            (c.post("/v1/chat/completions", json={"messages": bad_tool}), "messages.1.content"),
            (c.post("/v1/chat/completions", json=no_name), "tools.0.function.name"),
        ]
    for r, field in cases:
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and err["message"].startswith(field), err


def test_named_tool_choice_counts_the_prompt_it_generates(server, client):
    """With a named tool only that tool is in the prompt, so the context check counts that prompt:
    a request whose other tools would not fit is served, and its usage is that prompt's length."""
    big = {"type": "function", "function": {"name": "search_archive", "description": "archive entry " * 600,
                                            "parameters": {"type": "object", "properties": {}}}}
    with server.client() as c:
        def n_tokens(tools):  # noqa: ANN001, ANN202
            prompt = c.post("/apply-template", json={"messages": QUESTION, "tools": tools, **NO_THINKING}).json()
            return len(c.post("/tokenize", json={"content": prompt["prompt"]}).json()["tokens"])

        n_named, n_all = n_tokens(TOOLS), n_tokens([*TOOLS, big])
    assert n_named + 64 < 2048 <= n_all, (n_named, n_all)  # the test's premise: only the named prompt fits
    named = client.chat.completions.create(
        model="tool-model", messages=QUESTION, tools=[*TOOLS, big], max_tokens=64, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, extra_body=NO_THINKING)
    assert named.usage.prompt_tokens == n_named
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"
    with pytest.raises(openai.BadRequestError) as info:  # "auto" offers every tool: too long
        client.chat.completions.create(model="tool-model", messages=QUESTION, tools=[*TOOLS, big], max_tokens=64,
                                       extra_body=NO_THINKING)
    assert info.value.body["code"] == "context_length_exceeded" and info.value.body["n_prompt_tokens"] == n_all
