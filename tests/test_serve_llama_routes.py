"""llama-server's remaining routes and forms against the real server: native `/completion` (streamed
and not), `GET /v1/models/{id}`, `n > 1` and a list of prompts, `echo` when streaming, `/tokenize`
with vLLM's `prompt`, and a 404 that names the nearest route."""

from __future__ import annotations

import json

import api_helpers as h
import openai
import pytest
from api_helpers import CALL, KEY, QUESTION
from serve_helpers import sse_events

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server():
    with h.tool_server() as live:
        yield live


@pytest.fixture(scope="module")
def http(server):
    with server.client(headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def test_native_completion(http):
    r = http.post("/completion", json={"prompt": "<|im_start|>user\nhi", "n_predict": 3, "temperature": 0})
    body = r.json()
    assert r.status_code == 200 and body["stop"] is True and body["tokens_predicted"] == 3
    assert body["stop_type"] == "limit" and body["tokens_evaluated"] > 0 and body["timings"]["predicted_n"] == 3
    with http.stream("POST", "/completion", json={"prompt": "<|im_start|>user\nhi", "n_predict": 3,
                                                  "stream": True}) as r:
        events = [json.loads(e) for e in sse_events(r.iter_lines())]  # no [DONE]: llama-server sends none here
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == body["content"]


def test_model_by_id(server, http):
    client = server.openai(api_key=KEY)
    assert client.models.retrieve("tool-model").id == "tool-model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_several_choices(server, http):
    client = server.openai(api_key=KEY)
    messages = [{"role": "user", "content": QUESTION}]
    res = client.chat.completions.create(model="tool-model", messages=messages, n=3, max_tokens=64, seed=5,
                                         extra_body=NO_THINKING)
    assert [c.index for c in res.choices] == [0, 1, 2]
    assert all(c.message.content == CALL or c.message.tool_calls for c in res.choices)
    one = client.chat.completions.create(model="tool-model", messages=messages, max_tokens=64,
                                         extra_body=NO_THINKING)
    assert res.usage.prompt_tokens == one.usage.prompt_tokens
    assert res.usage.completion_tokens == 3 * one.usage.completion_tokens
    batch = client.completions.create(model="tool-model", prompt=["<|im_start|>user\nhi", "<|im_start|>user\nyo"],
                                      n=2, max_tokens=2, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3] and batch.usage.completion_tokens == 8
    assert batch.choices[0].text == batch.choices[1].text  # greedy: the same prompt gives the same text
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tool-model", messages=messages, n=2, stream=True)


def test_echo_when_streaming(server):
    client = server.openai(api_key=KEY)
    prompt = "<|im_start|>user\nhi"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tool-model", prompt=prompt, max_tokens=3, echo=True, stream=True, temperature=0) if c.choices)
    whole = client.completions.create(model="tool-model", prompt=prompt, max_tokens=3, echo=True, temperature=0)
    assert streamed == whole.choices[0].text and streamed.startswith(prompt)


def test_tokenize_prompt_and_nearest_route(http):
    vllm = http.post("/tokenize", json={"prompt": "hello world"}).json()
    native = http.post("/tokenize", json={"content": "hello world"}).json()
    assert vllm["tokens"] == native["tokens"] and vllm["count"] == len(native["tokens"])
    assert vllm["max_model_len"] == 2048
    assert http.post("/tokenize", json={}).status_code == 400
    r = http.post("/v1/chat/completion", json={})
    assert r.status_code == 404 and r.json()["error"]["message"].endswith("did you mean /v1/chat/completions?")
    r = http.get("/api/tag")
    assert r.status_code == 404 and "did you mean /api/tags?" in r.json()["error"]
