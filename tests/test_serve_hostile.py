"""`clover serve` against hostile requests: DNS rebinding (Host and Origin), inputs that used to
be 500s, client disconnects, slow clients, and the small OpenAI-compatibility gaps."""

from __future__ import annotations

import pytest
from serve_helpers import chat_factory, live_server, tiny_model

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve-hostile"))


@pytest.fixture(scope="module")
def live(model_path):
    with live_server(chat_factory(model_path, 256), n_ctx_slot=256) as server:
        yield server


def assert_openai_error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == status
    assert isinstance(body["error"]["message"], str) and body["error"]["type"]
    return body["error"]


# ---- DNS rebinding -----------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["evil.example:{port}", "evil.example", "localhost.evil.example:{port}",
                                  "127.0.0.1.nip.io:{port}", "localhost:1", "[::2]:{port}", "localhost:x"])
def test_foreign_host_is_refused(live, host):
    host = host.format(port=live.port)
    with live.client() as c:
        for method, path, body in (("GET", "/props", None), ("GET", "/health", None),
                                   ("POST", "/v1/chat/completions", CHAT)):
            r = c.request(method, path, json=body, headers={"Host": host})
            err = assert_openai_error(r, 403)
            assert "--allowed-hosts" in err["message"] and err["type"] == "permission_error"


def test_rebound_page_with_matching_origin_is_refused(live):
    host = f"evil.example:{live.port}"
    with live.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Host": host, "Origin": f"http://{host}"})
        assert_openai_error(r, 403)
        assert "model_path" not in r.text


@pytest.mark.parametrize("host", ["localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "LOCALHOST:{port}"])
def test_local_hosts_and_same_origin_are_served(live, host):
    host = host.format(port=live.port)
    with live.client() as c:
        assert c.get("/props", headers={"Host": host}).status_code == 200
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Host": host, "Origin": f"http://{host}"})
        assert r.status_code == 200, r.text


def test_allowed_hosts_widen_and_star_disables(model_path):
    with live_server(chat_factory(model_path, 256), n_ctx_slot=256, allowed_hosts=("box.lan",)) as server, \
            server.client() as c:
        assert c.get("/props", headers={"Host": f"box.lan:{server.port}"}).status_code == 200
        assert c.get("/props", headers={"Host": f"other.lan:{server.port}"}).status_code == 403
    with live_server(chat_factory(model_path, 256), n_ctx_slot=256, allowed_hosts=("*",)) as server, \
            server.client() as c:
        assert c.get("/props", headers={"Host": "anything.example"}).status_code == 200


def test_network_bind_does_not_check_host(model_path):
    """0.0.0.0 is reached under names we cannot know (the CLI warns when it has no API key)."""
    with live_server(chat_factory(model_path, 256), n_ctx_slot=256, host="0.0.0.0") as server, server.client() as c:
        assert c.get("/props", headers={"Host": f"192.168.1.9:{server.port}"}).status_code == 200


# ---- inputs that used to be 500s -----------------------------------------------------------------

def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize", "/apply-template"])
@pytest.mark.parametrize("depth", [65, 5000, 100_000])
def test_deep_json_is_a_400(live, path, depth):
    body = '{"messages": [{"role": "user", "content": "hi"}], "prompt": "x", "content": "x", "extra": ' \
           + _deep(depth) + "}"
    with live.client() as c:
        r = c.post(path, content=body, headers={"Content-Type": "application/json"})
        assert "nested more than 64 levels" in assert_openai_error(r, 400)["message"]
        assert c.get("/health").status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/apply-template"])
@pytest.mark.parametrize("key", ["add_generation_prompt", "tools", "messages"])
def test_reserved_chat_template_kwargs_are_a_400(live, path, key):
    body = {**CHAT, "chat_template_kwargs": {key: False, "enable_thinking": False}}
    with live.client() as c:
        err = assert_openai_error(c.post(path, json=body), 400)
    assert err["param"] == "chat_template_kwargs" and f"'{key}' is set by the server" in err["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "a\ud800b"}]}, "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text",
                                                                                 "text": "\udfff"}]}]},
     "messages.0.content.0.text"),
    ("/v1/completions", {"prompt": "x\udc00", "max_tokens": 1}, "prompt"),
    ("/tokenize", {"content": "\ud83d"}, "content"),
    ("/apply-template", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
])
def test_lone_surrogates_are_a_400(live, path, body, param):
    import json

    raw = json.dumps(body)  # ensure_ascii: the surrogate travels as the JSON escape \\udXXX
    with live.client() as c:
        err = assert_openai_error(c.post(path, content=raw, headers={"Content-Type": "application/json"}), 400)
    assert err["param"] == param and "lone UTF-16 surrogate" in err["message"]


def test_nul_and_valid_pairs_are_text(live):
    with live.client() as c:
        r = c.post("/tokenize", content='{"content": "a\\u0000b \\ud83d\\ude00"}',
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 200 and r.json()["tokens"]


def test_client_disconnect_during_upload_is_one_info_line(live, caplog):
    import logging
    import socket
    import time

    caplog.set_level(logging.INFO, logger="clover.server")
    with socket.create_connection(("127.0.0.1", live.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n{\"messages\": [" % live.port)
        time.sleep(0.3)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("client disconnected" in r.message for r in caplog.records):
        time.sleep(0.05)
    ours = [r for r in caplog.records if r.name.startswith("clover")]
    assert [r.levelname for r in ours] == ["INFO"], [r.getMessage() for r in ours]
    assert "client disconnected during POST /v1/chat/completions" in ours[0].getMessage()
    assert not ours[0].exc_info
    with live.client() as c:
        assert c.get("/health").status_code == 200


# ---- small OpenAI-compatibility gaps --------------------------------------------------------------

def test_stream_null_and_token_id_prompts(live):
    with live.client() as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "stream": None})
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        ids = c.post("/tokenize", json={"content": "hello there"}).json()["tokens"]
        for prompt in (ids, [ids]):
            r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0,
                                                "stream": None, "echo": True})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"].startswith("hello there")
        err = assert_openai_error(c.post("/v1/completions", json={"prompt": [ids[0], 10**9]}), 400)
        assert err["param"] == "prompt.1" and "outside the vocabulary" in err["message"]
        assert_openai_error(c.post("/v1/completions", json={"prompt": []}), 400)
    sdk = live.openai().completions.create(model="m", prompt=ids, max_tokens=2, temperature=0)
    assert sdk.choices[0].text is not None


def test_logit_bias_is_refused_naming_the_field(live):
    with live.client() as c:
        err = assert_openai_error(c.post("/v1/chat/completions", json={**CHAT, "logit_bias": {"5": 10}}), 400)
        assert err["param"] == "logit_bias" and "not supported" in err["message"]
        assert c.post("/v1/chat/completions", json={**CHAT, "logit_bias": {}}).status_code == 200
        assert c.post("/v1/chat/completions", json={**CHAT, "logit_bias": None}).status_code == 200


@pytest.mark.parametrize("path", ["/", "/index.html", "/health"])
def test_head_is_answered(live, path):
    with live.client() as c:
        r = c.head(path)
        assert r.status_code == 200 and r.content == b""


def test_server_record_is_created_private(tmp_path, monkeypatch):
    import os
    import stat

    from clover_cli import service

    if os.name != "posix":
        pytest.skip("POSIX file modes")
    monkeypatch.setenv("CLOVER_HOME", str(tmp_path))
    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)  # no fixing the mode after the fact
    old = os.umask(0)
    try:
        path = service.write_record(service.ServerRecord(pid=1, port=1234, host="127.0.0.1", model="m",
                                                         started=0.0, token="secret"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert '"token": "secret"' in path.read_text(encoding="utf-8")


# ---- slow clients ----------------------------------------------------------------------------------

def _read_response(sock, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except OSError:
        pass
    return data


def test_slow_headers_time_out_and_health_answers_meanwhile(model_path):
    import socket
    import time

    with live_server(chat_factory(model_path, 256), n_ctx_slot=256, header_timeout_s=1.5) as server:
        slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
        try:
            for s in slow:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
            t0 = time.monotonic()
            with server.client() as c:
                assert c.get("/health").status_code == 200
            assert time.monotonic() - t0 < 1.0
            for s in slow[:10]:
                s.sendall(b"b")  # still trickling: the deadline counts from the request's first byte
            answers = [_read_response(s, 5.0) for s in slow]
            assert time.monotonic() - t0 < 8
        finally:
            for s in slow:
                s.close()
        for data in answers:
            assert data.startswith(b"HTTP/1.1 408 "), data[:80]
            assert b'"type": "timeout_error"' in data and b"request headers not received" in data
        with server.client() as c:
            assert c.get("/health").status_code == 200


def test_connection_cap(model_path):
    import socket
    import time

    with live_server(chat_factory(model_path, 256), n_ctx_slot=256, header_timeout_s=1.5, max_connections=8) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
        try:
            time.sleep(0.2)
            with socket.create_connection(("127.0.0.1", server.port)) as extra:
                data = _read_response(extra, 5.0)
            assert data.startswith(b"HTTP/1.1 503 ") and b"too many open connections" in data
            for s in idle:
                _read_response(s, 5.0)  # closed by the header deadline
        finally:
            for s in idle:
                s.close()
        time.sleep(0.2)
        with server.client() as c:
            assert c.get("/health").status_code == 200


def test_slow_body_times_out(model_path):
    import socket
    import time

    with live_server(chat_factory(model_path, 256), n_ctx_slot=256, body_timeout_s=1.0) as server, \
            socket.create_connection(("127.0.0.1", server.port)) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"mess" % server.port)
        data = _read_response(s, 5.0)
        assert time.monotonic() - t0 < 4
        assert data.startswith(b"HTTP/1.1 408 ") and b"request body not received within 1 s" in data
        with server.client() as c:
            assert c.get("/health").status_code == 200


@pytest.mark.parametrize(("field", "value", "status"), [
    ("temperature", "1e-320", 200),  # found by the fuzz suite: logits / T overflowed to NaN, a 500
    ("temperature", "NaN", 400), ("top_p", "Infinity", 400), ("repetition_penalty", "Infinity", 400),
    ("repetition_penalty", "1e-320", 400), ("presence_penalty", "-Infinity", 400), ("threshold", "NaN", 400),
])
def test_non_finite_and_tiny_sampling_values(live, field, value, status):
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "' + field + '": ' + value + "}"
    with live.client() as c:
        r = c.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        assert assert_openai_error(r, 400)["param"] == field

