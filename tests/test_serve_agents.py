"""What agent clients (Hermes Agent, the OpenAI agent SDKs) rely on, driven with the `openai` SDK
against the real server: the usable context in `/v1/models`, thinking switched by
`reasoning_effort` / `think` / `thinking_budget`, a budget that really closes `</think>`, and a
context-exceeded error in OpenAI's words."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from serve_helpers import chat_factory, fixed_reply_model, live_server
from synth_models import tiny_model_path

from clover_cli.server.launch import bind

REASONING = ("First I read the question again, then I look at the tools, then I check the city name "
             "and the number of days, and only then do I write the call.")
ANSWER = "Sure: the forecast for Paris follows."
QUESTION = [{"role": "user", "content": "What will the weather be in Paris?"}]
N_CTX, N_PARALLEL = 4096, 2
MODEL = "agent-model"
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.fixture(scope="module")
def server():
    model = fixed_reply_model(ANSWER, reasoning=REASONING)
    with live_server(chat_factory(model, N_CTX // N_PARALLEL), model_id=MODEL, n_ctx_slot=N_CTX // N_PARALLEL,
                     n_parallel=N_PARALLEL) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


def _ask(client, max_tokens=96, **extra):
    res = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=max_tokens, temperature=0,
                                         extra_body=extra or None)
    return res.choices[0], res.usage


def _reasoning(choice):
    return (choice.message.model_extra or {}).get("reasoning_content")


def test_models_advertise_the_context_a_request_can_use(server, client):
    (entry,) = client.models.list().data
    assert entry.model_extra["max_model_len"] == N_CTX // N_PARALLEL
    meta = entry.model_extra["meta"]
    assert next(iter(meta)) == "n_ctx" and meta["n_ctx"] == N_CTX // N_PARALLEL
    assert meta["n_ctx_train"] > meta["n_ctx"]  # the file's context is not what a request gets


def test_thinking_on_by_default_and_off_by_every_client_switch(client):
    on, _ = _ask(client)
    assert _reasoning(on) == REASONING and on.message.content == ANSWER
    for extra in ({"reasoning_effort": "none"}, {"think": False}, {"thinking_budget": 0},
                  {"chat_template_kwargs": {"enable_thinking": False}}):
        off, usage = _ask(client, **extra)
        assert not _reasoning(off), extra
        assert off.message.content == ANSWER and off.finish_reason == "stop", extra
    # the most specific switch wins: the template kwarg over Ollama's think over the effort
    assert _reasoning(_ask(client, think=False, chat_template_kwargs={"enable_thinking": True})[0]) == REASONING
    assert _reasoning(_ask(client, think=True, reasoning_effort="none")[0]) == REASONING
    assert not _reasoning(_ask(client, think=False, reasoning_effort="high")[0])


def test_a_budget_larger_than_the_reasoning_changes_nothing(client):
    free, free_usage = _ask(client)
    for extra in ({"reasoning_effort": "low"}, {"think": "high"}, {"thinking_budget": 200}):
        got, usage = _ask(client, **extra)
        assert (_reasoning(got), got.message.content) == (_reasoning(free), free.message.content), extra
        assert usage.completion_tokens == free_usage.completion_tokens


@pytest.mark.parametrize("budget", [0, 1, 9])
def test_the_budget_cuts_thinking_and_closes_think(server, client, budget):
    tokenizer = server.state.backend.tokenizer
    thought, close = tokenizer.encode(REASONING), len(tokenizer.encode("\n</think>\n\n"))
    assert len(thought) > 9
    choice, usage = _ask(client, chat_template_kwargs={"enable_thinking": True}, thinking_budget=budget)
    cut = tokenizer.decode(thought[:budget])
    assert (_reasoning(choice) or "") == cut
    # Independent check: the same prompt with the cut reasoning and `</think>` written by hand,
    # as a raw completion, continues with the same answer the budgeted chat gave.
    with server.client() as c:
        prompt = c.post("/apply-template", json={"messages": QUESTION}).json()["prompt"]
        assert prompt.endswith("<think>\n")
        raw = c.post("/v1/completions", json={"prompt": prompt + cut + "\n</think>\n\n", "temperature": 0,
                                              "max_tokens": 96 - budget - close}).json()
    assert choice.message.content == raw["choices"][0]["text"]
    assert choice.message.content  # the answer went on after the forced `</think>`
    assert usage.completion_tokens == budget + close + raw["usage"]["completion_tokens"]


def test_streamed_budget_gives_the_same_reply(client):
    whole, _ = _ask(client, thinking_budget=5)
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=96, temperature=0,
                                            stream=True, extra_body={"thinking_budget": 5})
    reasoning, content = "", ""
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert (reasoning, content) == (_reasoning(whole), whole.message.content)


def test_bad_thinking_fields_are_400_naming_them(server):
    with server.client() as c:
        for body, field in (({"reasoning_effort": "extreme"}, "reasoning_effort"),
                            ({"think": "sometimes"}, "think"), ({"thinking_budget": -1}, "thinking_budget")):
            r = c.post("/v1/chat/completions", json={"messages": QUESTION, **body})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == field and err["message"].startswith(f"{field}: "), err
            if field == "reasoning_effort":
                assert "must be one of none, minimal, low, medium, high, xhigh" in err["message"]


def test_context_exceeded_in_openai_words_and_llama_cpp_fields(server, client):
    n_ctx = N_CTX // N_PARALLEL
    long = [{"role": "user", "content": "weather " * n_ctx}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=long, max_tokens=4)
    err = info.value
    assert err.status_code == 400 and err.code == "context_length_exceeded" and err.param == "messages"
    body = err.body
    n_prompt = body["n_prompt_tokens"]
    assert n_prompt > n_ctx and body["n_ctx"] == n_ctx and body["type"] == "exceed_context_size_error"
    assert body["message"].startswith(f"This model's maximum context length is {n_ctx} tokens. However, "
                                      f"your messages resulted in {n_prompt} tokens.")
    with server.client() as c:  # the count is the rendered prompt's, as /tokenize counts it
        prompt = c.post("/apply-template", json={"messages": long}).json()["prompt"]
        assert len(c.post("/tokenize", json={"content": prompt}).json()["tokens"]) == n_prompt
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="weather " * n_ctx, max_tokens=4)
    assert info.value.code == "context_length_exceeded" and "your prompt resulted in" in info.value.message


def test_serve_prints_the_settings_an_openai_client_needs(tmp_path):
    """`clover serve` prints one line with base_url, model, api_key and context_length; pasted into
    the SDK as printed, it reaches the server (0.0.0.0 becomes an address a client can dial). A
    model that allows 64K served with less gets a note that agent clients need -c 65536."""
    model = tiny_model_path(context_length=131072)
    log = tmp_path / "stderr.txt"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOVER_")}
    env.update(CLOVER_HOME=str(tmp_path / "home"), NO_COLOR="1", PYTHONIOENCODING="utf-8", COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "-m", "clover_cli", "serve", str(model), "--host", "0.0.0.0",
                             "--port", str(port), "-c", "1024", "-np", "2", "--alias", "pasted"],
                            cwd=ROOT, env=env, text=True, encoding="utf-8", stdout=subprocess.PIPE,
                            stderr=log.open("w", encoding="utf-8"))
    try:
        assert proc.stdout.readline().startswith(f"listening on http://0.0.0.0:{port}")
        line = proc.stdout.readline().strip()
        assert line.startswith("for OpenAI-compatible clients: "), line
        fields = dict(item.split("=", 1) for item in line.split(": ", 1)[1].split())
        assert fields == {"base_url": f"http://127.0.0.1:{port}/v1", "model": "pasted", "api_key": "none",
                          "context_length": "1024"}  # -c is per sequence
        client = openai.OpenAI(base_url=fields["base_url"], api_key=fields["api_key"], max_retries=0, timeout=60)
        deadline = time.monotonic() + 120
        while True:
            try:
                (entry,) = client.models.list().data
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.2)
        assert entry.id == fields["model"] and entry.model_extra["max_model_len"] == int(fields["context_length"])
    finally:
        proc.terminate()
        proc.wait(30)
    assert "agent clients such as Hermes Agent need 65536 tokens per request: -c 65536" in log.read_text("utf-8")
