"""Structured output and tool control through `clover serve`'s real HTTP server and the real clients
(the `openai` SDK's `.parse()`, LangChain's `with_structured_output`): the shipped demo model is far
too small to write schema-valid JSON or the tool it is told to on its own, so every assertion that
the reply validates is the constraint's doing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from serve_helpers import chat_factory, fixed_reply_model, live_server

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
CALCULATOR_TOOL = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression with +, - and *.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"},
                                                    "precision": {"type": "integer", "minimum": 0, "maximum": 9}},
                   "required": ["expression", "precision"]}}}
TOOLS = [WEATHER_TOOL, CALCULATOR_TOOL]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
JSON_REPLY = {"city": "Paris", "sky": "sunny", "temp_c": 18}
LAUNCH = "<tool_call>\n<function=launch>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
THREE_CALLS = "\n".join(f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n"
                        "</function>\n</tool_call>" for city in ("Paris", "London")) + "\n" + LAUNCH


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=16)
    sky: Literal["sunny", "cloudy", "rain"]
    temp_c: int = Field(ge=-60, le=60)


@pytest.fixture(scope="module")
def server():  # noqa: ANN201
    with live_server(chat_factory(Path("demo"), 2048), model_id="demo", n_ctx_slot=2048) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):  # noqa: ANN001, ANN201
    return server.openai(timeout=180.0)


def test_openai_parse_returns_a_valid_pydantic_object(client) -> None:  # noqa: ANN001
    for decode in ("ar", "diffusion"):
        done = client.chat.completions.parse(model="demo", messages=WEATHER_Q, response_format=Weather,
                                             max_tokens=96, temperature=0, extra_body={"decode": decode})
        message = done.choices[0].message
        assert done.choices[0].finish_reason == "stop", message.content
        assert isinstance(message.parsed, Weather), message.content
        assert Weather.model_validate_json(message.content) == message.parsed


def test_constrained_diffusion_writes_what_constrained_ar_writes(client) -> None:  # noqa: ANN001
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "strict": True,
                                                  "schema": Weather.model_json_schema()}}
    texts = {d: client.chat.completions.create(model="demo", messages=WEATHER_Q, response_format=fmt, max_tokens=96,
                                               temperature=0, extra_body={"decode": d}).choices[0].message.content
             for d in ("ar", "diffusion")}
    assert texts["ar"] == texts["diffusion"]
    Weather.model_validate_json(texts["ar"])


def test_json_object_and_llama_server_fields(server) -> None:  # noqa: ANN001
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    with server.client(timeout=180.0) as c:
        obj = c.post("/v1/chat/completions", json={"messages": WEATHER_Q, "response_format": {"type": "json_object"},
                                                   "max_tokens": 48, "temperature": 0})
        chat = c.post("/v1/chat/completions", json={"messages": WEATHER_Q, "json_schema": schema, "max_tokens": 48,
                                                    "temperature": 0})
        done = c.post("/v1/completions", json={"prompt": "The answer is", "json_schema": schema, "max_tokens": 48,
                                               "temperature": 0})
        gbnf = c.post("/v1/completions", json={"prompt": "Is it sunny?", "grammar": 'root ::= ("yes" | "no") "."',
                                               "max_tokens": 16, "temperature": 0})
        gchat = c.post("/v1/chat/completions", json={"messages": WEATHER_Q, "grammar": 'root ::= [0-9]{2} " C"',
                                                     "max_tokens": 16, "temperature": 0})
    assert obj.status_code == 200, obj.text
    text = obj.json()["choices"][0]["message"]["content"]
    if obj.json()["choices"][0]["finish_reason"] == "stop":  # a free object may run past max_tokens
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")
    jsonschema.validate(json.loads(chat.json()["choices"][0]["message"]["content"]), schema)
    jsonschema.validate(json.loads(done.json()["choices"][0]["text"]), schema)
    assert gbnf.json()["choices"][0]["text"] in ("yes.", "no.")
    reply = gchat.json()["choices"][0]["message"]["content"]
    assert len(reply) == 4 and reply[:2].isdigit() and reply.endswith(" C"), reply


def test_bad_grammars_and_schemas_are_400_naming_the_field(server) -> None:  # noqa: ANN001
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    cases = [
        ("/v1/chat/completions", {"messages": WEATHER_Q, "response_format": bad_schema},
         "response_format.json_schema.schema"),
        ("/v1/chat/completions", {"messages": WEATHER_Q, "response_format": {"type": "json_schema"}},
         "response_format.json_schema.schema"),
        ("/v1/chat/completions", {"messages": WEATHER_Q, "grammar": 'root ::= "a" | missing'}, "grammar"),
        ("/v1/completions", {"prompt": "x", "grammar": 'root ::= ("a"'}, "grammar"),
        ("/v1/completions", {"prompt": "x", "json_schema": {"properties": {"a": {"$ref": "#/nowhere"}}}},
         "json_schema"),
    ]
    with server.client() as c:
        for path, body, field in cases:
            r = c.post(path, json=body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == field and err["message"].startswith(field + ":"), err


def _ask_tools(client, **kw):  # noqa: ANN001, ANN202
    return client.chat.completions.create(model="demo", messages=WEATHER_Q, tools=TOOLS, max_tokens=96,
                                          temperature=0, **kw).choices[0]


def test_named_tool_choice_forces_that_tool_with_schema_valid_arguments(client) -> None:  # noqa: ANN001
    free = _ask_tools(client)  # the premise: asked freely, the demo model calls get_weather
    assert [c.function.name for c in free.message.tool_calls] == ["get_weather"]
    for decode in ("ar", "diffusion"):
        forced = _ask_tools(client, tool_choice={"type": "function", "function": {"name": "calculate"}},
                            extra_body={"decode": decode})
        assert forced.finish_reason == "tool_calls"
        (call,) = forced.message.tool_calls
        assert call.function.name == "calculate"
        jsonschema.validate(json.loads(call.function.arguments), CALCULATOR_TOOL["function"]["parameters"])


def test_required_tool_choice_and_single_call(client) -> None:  # noqa: ANN001
    required = _ask_tools(client, tool_choice="required", parallel_tool_calls=False)
    assert required.finish_reason == "tool_calls" and len(required.message.tool_calls) == 1
    call = required.message.tool_calls[0]
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    none = _ask_tools(client, tool_choice="none")
    assert not none.message.tool_calls


def test_langchain_with_structured_output_in_its_three_methods(server) -> None:  # noqa: ANN001
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=server.url("/v1"), api_key="none", model="demo", temperature=0,
                                      max_tokens=96, max_retries=0, timeout=180)
    for method in ("json_schema", "function_calling"):
        out = llm.with_structured_output(Weather, method=method).invoke("What is the weather in Paris?")
        assert isinstance(out, Weather), method


def test_langchain_json_mode(json_server) -> None:  # noqa: ANN001
    """json_mode sends `response_format: json_object` and no schema: a free JSON object, which the
    demo model cannot finish (its keys never close), so a model that answers with one serves here."""
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=json_server.url("/v1"), api_key="none", model="json", temperature=0,
                                      max_tokens=96, max_retries=0, timeout=180)
    assert llm.with_structured_output(None, method="json_mode").invoke("Weather in Paris, as JSON?") == JSON_REPLY
    assert llm.with_structured_output(Weather, method="json_mode").invoke("Weather in Paris?") == Weather(
        **JSON_REPLY)


@pytest.fixture(scope="module")
def json_server():  # noqa: ANN201
    model = fixed_reply_model(json.dumps(JSON_REPLY))
    with live_server(chat_factory(model, 2048), model_id="json", n_ctx_slot=2048) as live:
        yield live


def test_parallel_tool_calls_false_and_calls_to_tools_not_offered(server) -> None:  # noqa: ANN001
    """A GBNF grammar makes the demo model write two get_weather calls and one to `launch`, which
    the request does not offer: that one stays text, and `parallel_tool_calls: false` keeps one call."""
    grammar = "root ::= " + json.dumps(THREE_CALLS)
    with server.client(timeout=180.0) as c:
        def ask(**kw):  # noqa: ANN202
            body = {"messages": WEATHER_Q, "tools": [WEATHER_TOOL], "grammar": grammar, "max_tokens": 160,
                    "temperature": 0, **kw}
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]

        both, one = ask(), ask(parallel_tool_calls=False)
    cities = [json.loads(c["function"]["arguments"])["city"] for c in both["message"]["tool_calls"]]
    assert cities == ["Paris", "London"]
    assert both["message"]["content"] == LAUNCH  # the call to a tool that was not offered stays text
    assert [json.loads(c["function"]["arguments"])["city"] for c in one["message"]["tool_calls"]] == ["Paris"]


def test_unimplemented_schema_keywords_are_ignored_not_refused(client) -> None:  # noqa: ANN001
    """A schema keyword llguidance does not implement (a custom `format`) still compiles: ignored."""
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": {
        "type": "object", "properties": {"d": {"type": "string", "format": "x-custom", "maxLength": 8}},
        "required": ["d"], "additionalProperties": False}}}
    try:
        done = client.chat.completions.create(model="demo", messages=WEATHER_Q, response_format=fmt, max_tokens=48,
                                              temperature=0)
    except openai.BadRequestError as exc:
        raise AssertionError(exc.body) from None
    assert isinstance(json.loads(done.choices[0].message.content)["d"], str)


def _turn(c, think: bool, **body):  # noqa: ANN001, ANN202
    body = {"messages": WEATHER_Q, "max_tokens": 160, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": think}, **body}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("think", [True, False])
def test_every_constraint_applies_to_the_answer_with_thinking_on_or_off(server, think) -> None:  # noqa: ANN001
    """Thinking on (vLLM's behaviour with a reasoning parser): the reasoning is free text and the
    constraint starts after `</think>`; thinking off: at the reply's first token."""
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "strict": True,
                                                  "schema": Weather.model_json_schema()}}
    named = {"type": "function", "function": {"name": "calculate"}}
    with server.client(timeout=300.0) as c:
        answers = {d: _turn(c, think, response_format=fmt, decode=d) for d in ("ar", "diffusion")}
        gbnf = _turn(c, think, grammar='root ::= [0-9]{2} " C"')
        forced = _turn(c, think, tools=TOOLS, tool_choice=named)
        required = _turn(c, think, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    for choice in (*answers.values(), gbnf, forced, required):
        reasoning = choice["message"].get("reasoning_content") or ""
        assert bool(reasoning) == think, choice
        assert "{" not in reasoning and "<tool_call>" not in reasoning  # free text, not the constrained answer
    assert answers["ar"]["message"]["content"] == answers["diffusion"]["message"]["content"]
    Weather.model_validate_json(answers["ar"]["message"]["content"])
    reply = gbnf["message"]["content"]
    assert len(reply) == 4 and reply[:2].isdigit() and reply.endswith(" C"), reply
    (call,) = forced["message"]["tool_calls"]
    assert call["function"]["name"] == "calculate" and forced["finish_reason"] == "tool_calls"
    jsonschema.validate(json.loads(call["function"]["arguments"]), CALCULATOR_TOOL["function"]["parameters"])
    assert required["finish_reason"] == "tool_calls" and len(required["message"]["tool_calls"]) == 1


def test_a_reasoning_budget_closes_the_reasoning_before_a_constrained_answer(client) -> None:  # noqa: ANN001
    """A budget that cuts the reasoning writes `</think>` for the model; the answer is still the
    schema's, streamed as reasoning deltas first and then content deltas."""
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "strict": True,
                                                  "schema": Weather.model_json_schema()}}
    kinds, reasoning, content = [], "", ""
    for chunk in client.chat.completions.create(model="demo", messages=WEATHER_Q, response_format=fmt, max_tokens=160,
                                                temperature=0, stream=True, extra_body={"reasoning_budget_tokens": 3}):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None and getattr(delta, "reasoning_content", None):
            kinds.append("r")
            reasoning += delta.reasoning_content
        if delta is not None and delta.content:
            kinds.append("c")
            content += delta.content
    assert kinds and kinds == sorted(kinds, reverse=True)  # every reasoning delta before the first content one
    assert reasoning.strip() and "{" not in reasoning
    Weather.model_validate_json(content)
