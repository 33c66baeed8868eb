"""`clover serve` API: OpenAI shapes through the official SDK and raw HTTP, native routes, errors."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from serve_helpers import chat_factory, live_server, sse_events, tiny_model

N_CTX = 1024
N_PARALLEL = 2
GREEDY = {"temperature": 0.0, "seed": 7}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve-api"))


@pytest.fixture(scope="module")
def server(model_path):
    with live_server(chat_factory(model_path, N_CTX // N_PARALLEL), model_id="tiny-test",
                     n_ctx_slot=N_CTX // N_PARALLEL, n_parallel=N_PARALLEL, model_path=str(model_path)) as live:
        yield live


def _messages(text="Tell me a story."):
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


def test_health_models_props(server):
    with server.client() as c:
        for path in ("/health", "/v1/health"):
            r = c.get(path)
            assert r.status_code == 200 and r.json() == {"status": "ok"}
        models = c.get("/v1/models").json()
        assert c.get("/models").json()["data"][0]["id"] == "tiny-test"
        props = c.get("/props").json()
    assert models["object"] == "list" and len(models["data"]) == 1
    entry = models["data"][0]
    assert entry["id"] == "tiny-test" and entry["object"] == "model" and entry["owned_by"] == "clover"
    assert entry["meta"]["n_ctx"] == N_CTX // N_PARALLEL
    assert entry["meta"]["n_vocab"] > 0
    assert props["total_slots"] == N_PARALLEL and props["n_ctx_slot"] == N_CTX // N_PARALLEL
    sdk = server.openai().models.list()
    assert [m.id for m in sdk.data] == ["tiny-test"]


def test_chat_non_streaming_matches_streaming(server):
    client = server.openai()
    full = client.chat.completions.create(model="tiny-test", messages=_messages(), max_tokens=24, **GREEDY)
    assert full.id.startswith("chatcmpl-") and full.object == "chat.completion"
    assert full.model == "tiny-test"
    choice = full.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert 0 < full.usage.completion_tokens <= 24
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    stream = client.chat.completions.create(model="tiny-test", messages=_messages(), max_tokens=24,
                                            stream=True, stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    assert text == (choice.message.content or "")
    assert reasoning == (getattr(choice.message, "reasoning_content", None) or "")


def test_prompt_tokens_agree_with_template_and_tokenizer(server):
    """usage.prompt_tokens equals /tokenize of /apply-template's prompt (three routes, one answer)."""
    with server.client() as c:
        prompt = c.post("/apply-template", json={"messages": _messages()}).json()["prompt"]
        n = len(c.post("/tokenize", json={"content": prompt, "parse_special": True}).json()["tokens"])
        r = c.post("/v1/chat/completions", json={"messages": _messages(), "max_tokens": 4, **GREEDY})
    assert "Tell me a story." in prompt and "You are terse." in prompt
    assert r.json()["usage"]["prompt_tokens"] == n


def test_raw_sse_framing_and_timings(server):
    body = {"messages": _messages(), "max_tokens": 16, "stream": True, **GREEDY}
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = "".join(r.iter_text())
    assert raw.endswith("data: [DONE]\n\n")
    events = list(sse_events(iter(raw.split("\n"))))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert len({ch["id"] for ch in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and last["choices"][0]["delta"] == {}
    assert not any("diffusion_progress" in ch for ch in chunks)  # only when asked for
    timings = last["timings"]
    for key in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second",
                "tokens_per_forward", "passes", "blocks"):
        assert key in timings
    assert timings["predicted_n"] >= 1


def test_stream_text_arrives_once_per_committed_block(server):
    """Progress frames show a block resolving; its text follows only once no position is masked."""
    body = {"messages": _messages(), "max_tokens": 40, "stream": True, "return_progress": True,
            "block_length": 8, "verify": False, **GREEDY}  # unchecked: no block is cut short
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(e) for e in sse_events(r.iter_lines()) if e != "[DONE]"]
    kinds, last_progress, runs = [], None, 0
    for ch in chunks[1:-1]:
        if "diffusion_progress" in ch:
            last_progress = ch["diffusion_progress"]
            assert last_progress["steps"] == 8 and 1 <= last_progress["step"] <= 8
            kinds.append("progress")
            continue
        delta = ch["choices"][0]["delta"]
        assert len(delta) == 1 and set(delta) <= {"content", "reasoning_content"} and next(iter(delta.values()))
        assert last_progress is not None and "·" not in last_progress["preview"], last_progress
        runs += kinds[-1:] == ["progress"]
        kinds.append("text")
    blocks = chunks[-1]["timings"]["blocks"]
    assert blocks == 5 and runs == blocks  # 40 tokens in blocks of 8, each block's text in one delta
    assert last_progress["block"] == blocks - 1


def test_greedy_diffusion_answers_what_ar_answers_unless_verify_is_false(server):
    """Random weights: the preview's blocks are mostly wrong; the checked commit makes the text AR's,
    and `"verify": false` (a clover field, through the SDK's extra_body) keeps the blocks as revealed."""
    client = server.openai()

    def ask(**extra: object) -> str | None:
        res = client.chat.completions.create(model="tiny-test", messages=_messages(), max_tokens=24,
                                             extra_body=extra, **GREEDY)
        return res.choices[0].message.content

    ar = ask(decode="ar")
    assert ask(decode="diffusion") == ar
    assert ask(decode="diffusion", verify=False) != ar
    with server.client() as c:
        assert c.get("/props").json()["default_generation_settings"]["params"]["verify"] is None


def test_template_errors_are_400(server):
    with server.client() as c:
        only_system = c.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "x"}]})
        late_system = c.post("/apply-template", json={"messages": [{"role": "user", "content": "a"},
                                                                   {"role": "system", "content": "b"}]})
    for r, needle in ((only_system, "No user query"), (late_system, "System message must be at the beginning")):
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == "messages"
        assert err["message"].startswith("chat template") and needle in err["message"]


def test_completions_endpoint(server):
    client = server.openai()
    res = client.completions.create(model="tiny-test", prompt="Once upon a time", max_tokens=8, **GREEDY)
    assert res.object == "text_completion"
    assert res.choices[0].finish_reason in ("stop", "length")
    assert 0 < res.usage.completion_tokens <= 8
    streamed = client.completions.create(model="tiny-test", prompt="Once upon a time", max_tokens=8,
                                         stream=True, **GREEDY)
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text == res.choices[0].text


def test_tokenize_detokenize_round_trip(server):
    text = "Hello world, 123 héllo!"
    with server.client() as c:
        ids = c.post("/tokenize", json={"content": text}).json()["tokens"]
        pieces = c.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
        back = c.post("/detokenize", json={"tokens": ids}).json()["content"]
        bad = c.post("/detokenize", json={"tokens": [10**9]})
    assert ids and all(isinstance(i, int) for i in ids)
    assert [p["id"] for p in pieces] == ids
    assert back == text
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens.0"


def test_vllm_tokenizer_endpoints_as_lm_eval_reads_them(server):
    """lm-eval's remote tokenizer: /tokenizer_info's `eos_token` through /tokenize is the model's EOS,
    and /detokenize answers vLLM's `prompt`."""
    tok = server.state.backend.tokenizer
    with server.client() as c:
        info = c.get("/tokenizer_info").json()
        eos = c.post("/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False}).json()["tokens"]
        back = c.post("/detokenize", json={"tokens": tok.encode("Hello world")}).json()
    assert eos == [tok.eos_id] and info["model_max_length"] == server.state.backend.n_ctx
    assert info["bos_token"] is None and info["chat_template"] == server.state.backend.chat_template_text()
    assert back["prompt"] == back["content"] == "Hello world"


def test_errors_are_openai_shaped(server):
    with server.client() as c:
        cases = [
            (c.post("/v1/chat/completions", content=b"{not json",
                    headers={"content-type": "application/json"}), 400, "invalid JSON"),
            (c.post("/v1/chat/completions", json={"model": "x"}), 400, "messages"),
            (c.post("/v1/chat/completions", json={"messages": _messages(), "temperature": "hot"}),
             400, "temperature"),
            (c.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]}),
             400, "messages.0.role"),
            (c.post("/v1/chat/completions", json={"messages": _messages(), "tool_choice": "required"}),
             400, "tool_choice"),
            (c.get("/v1/no-such-route"), 404, "no route /v1/no-such-route"),
            (c.post("/v1/embeddings", json={"input": "x"}), 501, "embeddings"),
        ]
    for r, status, needle in cases:
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) >= {"code", "message", "type"} and err["code"] == status
        assert needle in err["message"]
        assert "Traceback" not in r.text
    assert cases[0][0].json()["error"]["type"] == "invalid_request_error"
    assert cases[5][0].json()["error"]["type"] == "not_found_error"
    assert cases[6][0].json()["error"]["type"] == "not_supported_error"

    with pytest.raises(openai.BadRequestError) as info:
        server.openai().chat.completions.create(model="tiny-test", messages=[], max_tokens=4)
    assert info.value.status_code == 400


def test_prompt_longer_than_context_is_refused_not_truncated(server):
    long_text = "word " * (N_CTX * 2)
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": _messages(long_text), "max_tokens": 4})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == N_CTX // N_PARALLEL
    assert err["n_prompt_tokens"] > err["n_ctx"]
    assert f"({err['n_prompt_tokens']} tokens)" in err["message"]
    with pytest.raises(openai.BadRequestError):
        server.openai().chat.completions.create(model="tiny-test", messages=_messages(long_text),
                                                max_tokens=4)


def test_metrics_count_requests_and_tokens(server):
    with server.client() as c:
        before = _metrics(c.get("/metrics").text)
        c.post("/v1/chat/completions", json={"messages": _messages(), "max_tokens": 6, **GREEDY})
        r = c.get("/metrics")
    after = _metrics(r.text)
    assert r.headers["content-type"].startswith("text/plain")
    assert after["clover:requests_total"] == before["clover:requests_total"] + 1
    assert after["clover:tokens_predicted_total"] > before["clover:tokens_predicted_total"]
    assert after["clover:prompt_tokens_total"] > before["clover:prompt_tokens_total"]
    assert after["clover:tokens_per_forward"] > 0
    assert after["clover:requests_deferred"] == 0 and after["clover:n_slots"] == N_PARALLEL


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.split()
        out[name] = float(value)
    return out


def test_health_is_503_while_loading(model_path):
    gate = threading.Event()
    load = chat_factory(model_path, 256)

    def slow_load():
        gate.wait(30)
        return load()

    with live_server(slow_load, wait_loaded=False, n_ctx_slot=256) as live, live.client() as c:
        r = c.get("/health")
        assert r.status_code == 503
        assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        busy = c.post("/v1/chat/completions", json={"messages": _messages(), "max_tokens": 2})
        assert busy.status_code == 503 and "Retry-After" in busy.headers
        assert c.get("/v1/models").json()["data"][0]["meta"] is None
        gate.set()
        assert live.state.loaded.wait(60)
        assert c.get("/health").status_code == 200


def test_concurrent_requests_all_answered(server):
    """More simultaneous requests than -np: all succeed (the extra ones wait for a slot)."""
    client = server.openai()
    results: list = [None] * 5

    def ask(i: int) -> None:
        results[i] = client.chat.completions.create(model="tiny-test", messages=_messages(f"Question {i}"),
                                                    max_tokens=6, **GREEDY)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None and r.choices[0].finish_reason in ("stop", "length") for r in results)
    server.wait_idle()


def test_json_body_must_be_object(server):
    with server.client() as c:
        r = c.post("/tokenize", content=b"[1, 2]", headers={"content-type": "application/json"})
        empty = c.post("/tokenize", content=b"")
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    assert empty.status_code == 400


def test_httpx_reads_error_body_of_unknown_method(server):
    r = httpx.delete(server.url("/v1/chat/completions"))
    assert r.status_code == 405 and r.json()["error"]["code"] == 405
