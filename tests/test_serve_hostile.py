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
    with live_server(chat_factory(model_path, 256), n_ctx=256) as server:
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
    with live_server(chat_factory(model_path, 256), n_ctx=256, allowed_hosts=("box.lan",)) as server, \
            server.client() as c:
        assert c.get("/props", headers={"Host": f"box.lan:{server.port}"}).status_code == 200
        assert c.get("/props", headers={"Host": f"other.lan:{server.port}"}).status_code == 403
    with live_server(chat_factory(model_path, 256), n_ctx=256, allowed_hosts=("*",)) as server, \
            server.client() as c:
        assert c.get("/props", headers={"Host": "anything.example"}).status_code == 200


def test_network_bind_does_not_check_host(model_path):
    """0.0.0.0 is reached under names we cannot know (the CLI warns when it has no API key)."""
    with live_server(chat_factory(model_path, 256), n_ctx=256, host="0.0.0.0") as server, server.client() as c:
        assert c.get("/props", headers={"Host": f"192.168.1.9:{server.port}"}).status_code == 200
