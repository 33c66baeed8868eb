"""Seeded fuzzing of the HTTP API of a real `clover serve` app (uvicorn on 127.0.0.1, tiny model).

Every request must end as a normal answer or an OpenAI-shaped 4xx (never a 5xx), within a time
limit, and the server must still answer /health and a real chat afterwards. Categories: malformed
JSON, every field with wrong types and ranges, deep nesting, lone surrogates and NUL, wrong methods,
foreign Host and Origin headers, and clients that disconnect mid-request.
"""

from __future__ import annotations

import json
import random
import socket
import time

import pytest
from serve_helpers import chat_factory, live_server, tiny_model

SEED = 1605
REQUEST_LIMIT_S = 30.0
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
COMPLETION = {"prompt": "hello", "max_tokens": 2, "temperature": 0}
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "n_predict", "temperature", "top_p",
               "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop",
               "stream", "stream_options", "n", "logprobs", "threshold", "block_length", "decode",
               "return_progress", "tools", "tool_choice", "parallel_tool_calls", "response_format",
               "chat_template_kwargs", "reasoning_format", "logit_bias"]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"]
COMPLETION_FIELDS = ["prompt", "echo", "suffix", "max_tokens", "temperature", "stop", "stream", "seed"]
# JSON texts (so NaN and Infinity, which Python's json accepts, can be sent too)
WRONG = ["null", "true", "false", "-1", "0", "1", "3", "9223372036854775808", "-9223372036854775809", "1e308",
         "-1e308", "1e-320", "NaN", "Infinity", "-Infinity", "0.5", '"x"', '""', '"auto"', "[]", "{}", "[1]", '["a"]',
         '{"a": 1}', '[{"type": "text"}]', '[{"role": "user"}]', '"\\u0000"', '"\\ud800"',
         '{"type": "function", "function": {"name": "f"}}', "[" * 70 + "]" * 70]
TRIED: dict[str, int] = {}
MAX_TOKENS_SAFE = {"max_tokens", "max_completion_tokens", "n_predict"}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = tiny_model(tmp_path_factory.mktemp("fuzz-api"))
    with live_server(chat_factory(path, 256), n_ctx_slot=256, header_timeout_s=2.0, body_timeout_s=2.0) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    with live.client(timeout=REQUEST_LIMIT_S) as c:
        yield c


def check(client, category: str, method: str, path: str, content: bytes | str | None = None,
          headers: dict | None = None, ok: tuple[int, ...] = (200,)) -> int:
    """One request: an answer in `ok` or an OpenAI-shaped 4xx, in time; returns the status."""
    TRIED[category] = TRIED.get(category, 0) + 1
    t0 = time.monotonic()
    r = client.request(method, path, content=content,
                       headers={"Content-Type": "application/json", **(headers or {})})
    what = f"{category}: {method} {path} {str(content)[:160]!r}"
    assert time.monotonic() - t0 < REQUEST_LIMIT_S, what
    assert r.status_code < 500 or r.status_code in ok, f"{what} -> {r.status_code} {r.text[:300]}"
    if r.status_code in ok and r.status_code < 400:
        return r.status_code
    assert 400 <= r.status_code < 500 or r.status_code in ok, f"{what} -> {r.status_code}"
    if method == "HEAD":
        return r.status_code
    body = r.json()
    assert set(body) == {"error"}, f"{what} -> {r.text[:300]}"
    err = body["error"]
    # llama-server's numeric code, or OpenAI's string one (e.g. context_length_exceeded)
    assert err["code"] == r.status_code or (isinstance(err["code"], str) and err["code"].isidentifier()), what
    assert isinstance(err["message"], str) and err["message"], what
    assert isinstance(err["type"], str) and err["type"], what
    return r.status_code


def with_field(base: dict, field: str, json_value: str) -> str:
    """`base` as JSON text with `field` set to the raw JSON `json_value`."""
    body = {k: v for k, v in base.items() if k != field}
    text = json.dumps(body)
    return text[:-1] + f', "{field}": {json_value}}}'


def test_every_field_with_wrong_types_and_ranges(client):
    rng = random.Random(SEED)
    for field in CHAT_FIELDS:
        values = rng.sample(WRONG, 6)
        for value in values:
            if field in MAX_TOKENS_SAFE and value in ("9223372036854775808", "1e308", "Infinity"):
                value = "3"  # a valid huge limit would only run to the context end: slow, not hostile
            base = {**CHAT, "max_tokens": 2} if field not in MAX_TOKENS_SAFE else {**CHAT}
            if field in MAX_TOKENS_SAFE:
                base.pop("max_tokens")
            check(client, "field types/ranges", "POST", "/v1/chat/completions", with_field(base, field, value))
    for field in MESSAGE_FIELDS:
        for value in rng.sample(WRONG, 6):
            msg = with_field({"role": "user", "content": "hi"}, field, value)
            body = json.dumps({"max_tokens": 2})[:-1] + f', "messages": [{msg}]}}'
            check(client, "field types/ranges", "POST", "/v1/chat/completions", body)
    for field in COMPLETION_FIELDS:
        for value in rng.sample(WRONG, 6):
            if field == "max_tokens" and value in ("9223372036854775808", "1e308", "Infinity"):
                value = "2"
            check(client, "field types/ranges", "POST", "/v1/completions", with_field(COMPLETION, field, value))
    for path, field in (("/tokenize", "content"), ("/tokenize", "with_pieces"), ("/detokenize", "tokens"),
                        ("/apply-template", "messages"), ("/apply-template", "add_generation_prompt")):
        base = {"/tokenize": {"content": "x"}, "/detokenize": {"tokens": [1]},
                "/apply-template": {"messages": CHAT["messages"]}}[path]
        for value in rng.sample(WRONG, 5) + ["[-1]", "[99999999999999999999]"]:
            check(client, "field types/ranges", "POST", path, with_field(base, field, value))


def test_malformed_json(client):
    rng = random.Random(SEED + 1)
    text = json.dumps({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
    cases = ["", " ", "null", "[]", "1", '"x"', "{", "}", "{'a': 1}", '{"a":}', "\xff\xfe", "{\"a\": 1}\x00"]
    cases += [text[:rng.randrange(len(text))] for _ in range(20)]
    for _ in range(20):
        raw = bytearray(text.encode())
        for _ in range(rng.choice((1, 3))):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        cases.append(bytes(raw))
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
        for body in cases[:: 1 if path == "/v1/chat/completions" else 4]:
            check(client, "malformed JSON", "POST", path, body)


def test_deep_nesting(client):
    rng = random.Random(SEED + 2)
    for depth in [63, 64, 65, 66, 1000, 5000, 200_000] + [rng.randrange(60, 3000) for _ in range(5)]:
        for kind in ("[]", "{}"):
            inner = ("[" * depth + "]" * depth) if kind == "[]" else ('{"a":' * depth + "1" + "}" * depth)
            field = rng.choice(["chat_template_kwargs", "metadata", "tools", "messages", "stop"])
            check(client, "deep nesting", "POST", "/v1/chat/completions",
                  with_field(CHAT, field, inner if field != "chat_template_kwargs" else f'{{"x": {inner}}}'))


def test_surrogates_and_nul(client):
    rng = random.Random(SEED + 3)
    specials = ["\\ud800", "\\udfff", "\\udc00x", "\\u0000", "a\\u0000\\ud83d\\ude00", "\\ud83d"]
    places = [("/v1/chat/completions", '{"messages": [{"role": "user", "content": "%s"}], "max_tokens": 2}'),
              ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "%s"}]}],'
                                       ' "max_tokens": 2}'),
              ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "model": "%s",'
                                       ' "max_tokens": 2}'),
              ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "stop": ["%s"],'
                                       ' "max_tokens": 2}'),
              ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,'
                                       ' "chat_template_kwargs": {"%s": 1}}'),
              ("/v1/completions", '{"prompt": "%s", "max_tokens": 2}'),
              ("/tokenize", '{"content": "%s", "with_pieces": true}'),
              ("/apply-template", '{"messages": [{"role": "system", "content": "%s"}, {"role": "user",'
                                  ' "content": "x"}]}')]
    for path, template in places:
        for special in rng.sample(specials, 4):
            check(client, "surrogates/NUL", "POST", path, template % special)


def test_wrong_methods(client):
    routes = ["/v1/chat/completions", "/chat/completions", "/v1/completions", "/tokenize", "/detokenize",
              "/apply-template", "/v1/models", "/health", "/props", "/metrics", "/slots", "/v1/embeddings", "/",
              "/_clover/shutdown", "/nope", "/v1"]
    for path in routes:
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"):
            check(client, "wrong methods", method, path, "{}" if method in ("POST", "PUT", "PATCH") else None,
                  ok=(200, 204, 501) if path == "/v1/embeddings" else (200, 204))  # 501: llama-server's


def test_foreign_host_and_origin(live, client):
    rng = random.Random(SEED + 4)
    names = ["evil.example", "localhost.evil", "127.0.0.1.nip.io", "[::2]", "0.0.0.0", "example.com", "a" * 300]
    for _ in range(12):
        host = f"{rng.choice(names)}:{rng.choice([live.port, 80, 1])}"
        status = check(client, "foreign Host/Origin", "POST", "/v1/chat/completions", json.dumps(CHAT),
                       headers={"Host": host, "Origin": f"http://{host}"})
        assert status == 403
    for _ in range(8):
        origin = f"{rng.choice(['http', 'https', 'null', 'file'])}://{rng.choice(names)}"
        status = check(client, "foreign Host/Origin", "POST", "/v1/chat/completions", json.dumps(CHAT),
                       headers={"Origin": origin})
        assert status == 403


def test_disconnecting_and_slow_clients(live):
    rng = random.Random(SEED + 5)
    body = json.dumps({**CHAT, "max_tokens": 64}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % (live.port, len(body))) + body
    for cut in [5, 40, len(request) - len(body) - 1, len(request) - 5, len(request)] + \
               [rng.randrange(len(request)) for _ in range(5)]:
        TRIED["disconnect/slow"] = TRIED.get("disconnect/slow", 0) + 1
        with socket.create_connection(("127.0.0.1", live.port)) as s:
            s.sendall(request[:cut])
            time.sleep(0.05)
    for cut in (10, len(request) - 10):  # stalls: the header and body deadlines (2 s here) answer them
        TRIED["disconnect/slow"] = TRIED.get("disconnect/slow", 0) + 1
        with socket.create_connection(("127.0.0.1", live.port)) as s:
            s.sendall(request[:cut])
            s.settimeout(10)
            data = s.recv(4096)
            assert data.startswith(b"HTTP/1.1 408 "), data[:100]
    live.wait_idle()


def test_zz_server_still_answers(live, client):
    assert client.get("/health").status_code == 200
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    live.wait_idle()
    print("\nAPI fuzz inputs per category:", dict(sorted(TRIED.items())), "total", sum(TRIED.values()))
