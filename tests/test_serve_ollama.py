"""The Ollama API (`/api/*`) driven by the official `ollama` client against the real server: model
listing under Ollama names, chat and generate streamed as NDJSON and not, think, options, a tool round
trip in Ollama's tool_calls shape, format json, and the 501s."""

from __future__ import annotations

import json

import api_helpers as h
import httpx
import ollama
import pytest
from api_helpers import ANSWER, ARGS, CALL, KEY, QUESTION, REASONING

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                           "parameters": h.WEATHER_SCHEMA}}]
ASK = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def server():
    with h.tool_server() as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def test_models_under_ollama_names(client):
    (model,) = client.list().models
    assert model.model == "tool-model:latest" and model.details.format == "gguf" and model.size > 0
    (running,) = client.ps().models
    assert running.model == "tool-model:latest" and running.context_length == 2048
    shown = client.show("tool-model:latest")
    assert "tools" in shown.capabilities and "thinking" in shown.capabilities
    assert "<tool_call>" in shown.template


def test_chat_tool_round_trip(client):
    first = client.chat(model="tool-model:latest", messages=ASK, tools=TOOLS, stream=False, think=False,
                        options={"temperature": 0, "num_predict": 64, "num_ctx": 2048, "seed": 1, "top_k": 20})
    assert first.done and first.done_reason == "stop" and first.message.content == ""
    (call,) = first.message.tool_calls
    assert call.function.name == "get_weather" and dict(call.function.arguments) == ARGS
    assert first.prompt_eval_count > 0 and first.eval_count > 0 and first.eval_duration > 0
    history = [*ASK, first.message.model_dump(exclude_none=True),
               {"role": "tool", "content": "18 °C, sunny", "tool_name": "get_weather"}]
    second = client.chat(model="tool-model", messages=history, tools=TOOLS, stream=False, think=False)
    assert second.message.content == ANSWER and not second.message.tool_calls


def test_chat_streams_ndjson_with_thinking(client, server):
    parts = list(client.chat(model="tool-model:7b", messages=ASK, tools=TOOLS, think=True, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "stop"
    assert "".join(p.message.thinking or "" for p in parts) == REASONING
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", ARGS)]
    whole = client.chat(model="tool-model", messages=ASK, tools=TOOLS, think=True, stream=False)
    assert whole.message.thinking == REASONING
    with server.client(headers={"x-api-key": KEY}) as c:  # streaming is the default, as in Ollama
        r = c.post("/api/chat", json={"model": "tool-model", "messages": ASK, "think": False})
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert len(lines) >= 2 and [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]


def test_generate_streamed_and_not(client):
    plain = client.generate(model="tool-model", prompt=QUESTION, think=False, stream=True,
                            options={"stop": ["get_weather"]})
    text = "".join(p.response for p in plain)
    assert text == CALL[:CALL.index("get_weather")]
    whole = client.generate(model="tool-model", prompt=QUESTION, think=False, stream=False,
                            options={"num_predict": 3})
    assert whole.done_reason == "length" and whole.eval_count == 3
    raw = client.generate(model="tool-model", prompt="<|im_start|>user\nhi", raw=True, stream=False,
                          options={"num_predict": 2})
    assert raw.done and raw.eval_count == 2
    loaded = client.generate(model="tool-model", prompt="")  # what clients send to preload a model
    assert loaded.done_reason == "load"
    as_json = client.chat(model="tool-model", messages=ASK, format="json", stream=False, think=False,
                          options={"num_predict": 1})
    as_text = client.chat(model="tool-model", messages=ASK, stream=False, think=False, options={"num_predict": 1})
    assert as_json.prompt_eval_count > as_text.prompt_eval_count  # format json: an instruction in the prompt


def test_501s_and_errors_are_ollama_shaped(client, server):
    with pytest.raises(ollama.ResponseError) as info:
        client.embed(model="tool-model", input="hi")
    assert info.value.status_code == 501 and "embeddings are not supported" in info.value.error
    with httpx.Client(base_url=server.base_url) as c:
        r = c.post("/api/chat", headers={"x-api-key": KEY},  # the ollama client refuses this format itself
                   json={"model": "tool-model", "messages": ASK, "format": "yaml", "stream": False})
        assert r.status_code == 400 and r.json()["error"].startswith("format:")
        r = c.post("/api/chat", json={"model": "tool-model", "messages": ASK})
        assert r.status_code == 401 and r.json() == {"error": "Invalid API Key"}
        r = c.post("/api/chat", headers={"x-api-key": KEY}, json={"messages": ASK})
        assert r.status_code == 400 and r.json()["error"].startswith("model:")
    with pytest.raises(ollama.ResponseError) as info:
        client.pull("tool-model")
    assert info.value.status_code == 501 and "clover pull" in info.value.error


def test_demo_model_weather_round_trip():
    """The shipped demo model through the Ollama API: it calls get_weather, then reports (streamed)."""
    system, tools = h.demo_tools()
    ask = [{"role": "system", "content": system}, {"role": "user", "content": "What is the weather in Paris?"}]
    with h.demo_server() as live:
        client = ollama.Client(host=live.base_url, timeout=120)
        first = client.chat(model="demo:latest", messages=ask, tools=tools, think=False, stream=False,
                            options={"num_predict": 64})
        (call,) = first.message.tool_calls
        assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        history = [*ask, first.message.model_dump(exclude_none=True),
                   {"role": "tool", "content": "Paris: 18 °C, sunny", "tool_name": "get_weather"}]
        parts = list(client.chat(model="demo", messages=history, tools=tools, think=False, stream=True,
                                 options={"num_predict": 64}))
    assert "".join(p.message.content for p in parts) == "It is 18 °C and sunny in Paris."
    assert parts[-1].done
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                               "temp_c": {"type": "integer", "minimum": -60, "maximum": 60}},
              "required": ["city", "temp_c"], "additionalProperties": False}
    with h.demo_server() as live:  # format as a JSON schema: the constrained decoder writes valid JSON
        shaped = ollama.Client(host=live.base_url, timeout=120).chat(
            model="demo", messages=ask, format=schema, think=False, stream=False, options={"num_predict": 64})
    reply = json.loads(shaped.message.content)
    assert set(reply) == {"city", "temp_c"} and isinstance(reply["temp_c"], int) and len(reply["city"]) <= 16
