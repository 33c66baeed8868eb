"""`clover serve` security: API keys, CORS and foreign origins, body-size cap, web UI switch."""

from __future__ import annotations

import openai
import pytest
from serve_helpers import chat_factory, live_server, tiny_model

KEYS = ("key-one", "key-two")
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve-sec"))


@pytest.fixture(scope="module")
def keyed(model_path):
    with live_server(chat_factory(model_path, 256), n_ctx_slot=256, api_keys=KEYS,
                     max_body_bytes=64 * 1024) as live:
        yield live


@pytest.mark.parametrize("path", ["/", "/health", "/v1/health", "/v1/models", "/models"])
def test_public_paths_need_no_key(keyed, path):
    with keyed.client() as c:
        assert c.get(path).status_code == 200


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": "Bearer key-one-and-more"}, 401),
    ({"Authorization": "Basic key-one"}, 401),
    ({"X-Api-Key": "nope"}, 401),
    ({"Authorization": "Bearer key-one"}, 200),
    ({"Authorization": "bearer key-two"}, 200),
    ({"X-Api-Key": "key-two"}, 200),
])
def test_api_key_matrix(keyed, headers, status):
    with keyed.client() as c:
        for method, path, body in (("GET", "/props", None), ("GET", "/metrics", None),
                                   ("POST", "/tokenize", {"content": "x"}),
                                   ("POST", "/v1/chat/completions", CHAT)):
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == status, (method, path, r.text)
            if status == 401:
                assert r.json() == {"error": {"code": 401, "message": "Invalid API Key",
                                              "type": "authentication_error"}}
                assert r.headers["www-authenticate"] == "Bearer"


def test_sdk_surfaces_auth_errors(keyed):
    with pytest.raises(openai.AuthenticationError) as info:
        keyed.openai(api_key="wrong").chat.completions.create(model="m", messages=CHAT["messages"],
                                                              max_tokens=2)
    assert info.value.status_code == 401
    ok = keyed.openai(api_key="key-one").chat.completions.create(model="m", messages=CHAT["messages"],
                                                                 max_tokens=2, temperature=0)
    assert ok.choices[0].message.role == "assistant"


def test_cors_preflight_is_not_authenticated_and_localhost_only(keyed):
    pre = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization,content-type"}
    with keyed.client() as c:
        for origin in ("http://localhost:5173", "http://127.0.0.1:8085", "http://[::1]:3000"):
            r = c.options("/v1/chat/completions", headers={"Origin": origin, **pre})
            assert r.status_code == 200, origin
            assert r.headers["access-control-allow-origin"] == origin
            allowed = r.headers["access-control-allow-headers"].lower()
            assert "authorization" in allowed and "content-type" in allowed
            assert "POST" in r.headers["access-control-allow-methods"]
        evil = c.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **pre})
        assert evil.status_code == 400 and "access-control-allow-origin" not in evil.headers
        # A foreign page's simple POST (no preflight) is refused before it can use the model.
        post = c.post("/v1/chat/completions", json=CHAT,
                      headers={"Origin": "https://evil.example", "Authorization": "Bearer key-one"})
        assert post.status_code == 403 and post.json()["error"]["type"] == "permission_error"
        # 401s still carry CORS headers so the page can read the error.
        denied = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://localhost:5173"})
        assert denied.status_code == 401
        assert denied.headers["access-control-allow-origin"] == "http://localhost:5173"


def test_cors_origins_widen_the_list(model_path):
    widened = live_server(chat_factory(model_path, 256), n_ctx_slot=256, cors_origins=("https://app.example",))
    with widened as live, live.client() as c:
        pre = {"Access-Control-Request-Method": "POST"}
        ok = c.options("/v1/chat/completions", headers={"Origin": "https://app.example", **pre})
        other = c.options("/v1/chat/completions", headers={"Origin": "https://app.example.evil", **pre})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        assert other.status_code == 400
        r = c.get("/v1/models", headers={"Origin": "https://app.example"})
        assert r.headers["access-control-allow-origin"] == "https://app.example"


def test_oversize_body_is_413(keyed):
    big = b'{"content": "' + b"a" * (65 * 1024) + b'"}'
    auth = {"Authorization": "Bearer key-one", "content-type": "application/json"}
    with keyed.client() as c:
        r = c.post("/tokenize", content=big, headers=auth)

        def chunks():
            for i in range(0, len(big), 8192):
                yield big[i:i + 8192]

        chunked = c.post("/tokenize", content=chunks(), headers=auth)
        small = c.post("/tokenize", json={"content": "a"}, headers=auth)
    for res in (r, chunked):
        assert res.status_code == 413
        assert res.json()["error"]["code"] == 413 and "too large" in res.json()["error"]["message"]
    assert small.status_code == 200


def test_no_webui(model_path):
    with live_server(chat_factory(model_path, 256), n_ctx_slot=256, webui=False) as live, live.client() as c:
        r = c.get("/")
        assert r.status_code == 404 and "--no-webui" in r.json()["error"]["message"]
        assert c.get("/health").status_code == 200


def test_web_page_is_self_contained(keyed):
    with keyed.client() as c:
        r = c.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    for forbidden in ("http://", "https://", "<link ", "src=\"//"):
        assert forbidden not in html.replace("https?:", ""), forbidden
    assert "<script" in html and "v1/chat/completions" in html


def test_error_bodies_show_no_server_folders(tmp_path):
    """Errors about files (slot save/restore with bad files, a model that failed to load) name the
    file, never the folders it sits in on the server."""
    folder = tmp_path / "srv-ünï"
    slots = folder / "slots"
    slots.mkdir(parents=True)
    (slots / "junk.bin").write_bytes(b"not a saved state")
    (slots / "taken").mkdir()  # saving to this name cannot write a file
    model = tiny_model(folder)
    answers = []
    with live_server(chat_factory(model, 256), n_ctx_slot=256, model_path=str(model),
                     slot_save_path=str(slots)) as live, live.client() as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert c.post("/slots/0?action=save", json={"filename": "good.bin"}).status_code == 200
        whole = (slots / "good.bin").read_bytes()
        (slots / "cut.bin").write_bytes(whole[:len(whole) // 2])
        for action, name in [("restore", "junk.bin"), ("restore", "cut.bin"), ("save", "taken")]:
            answers.append((name, c.post(f"/slots/0?action={action}", json={"filename": name})))
    broken = folder / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with live_server(chat_factory(broken, 256), wait_loaded=False, n_ctx_slot=256, model_path=str(broken)) as live, \
            live.client() as c:
        assert live.state.loaded.wait(60) and live.state.load_error
        answers.append(("broken.gguf", c.post("/v1/chat/completions", json=CHAT)))
    hidden = {str(folder), str(folder.resolve()), folder.as_posix(), str(tmp_path)}
    for name, r in answers:
        assert r.status_code >= 400, (name, r.text)
        message = r.json()["error"]["message"]
        assert not any(h in message for h in hidden), message
    for name, r in answers[:3]:
        assert 400 <= r.status_code < 500 and name in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(("message", "folders", "shown"), [
    ("cannot read C:\\Users\\me\\slots\\a.bin: denied", ["C:\\Users\\me\\slots"], "cannot read a.bin: denied"),
    ("'C:\\\\Users\\\\me\\\\m.gguf' is damaged", ["C:\\Users\\me"], "'m.gguf' is damaged"),
    ("/srv/models/sub/m.gguf and /srv/models", ["/srv/models/sub", "/srv/models"], "m.gguf and <server folder>"),
    ("/tmpfoo/x stays, /tmp/y goes", ["/tmp"], "/tmpfoo/x stays, y goes"),
])
def test_redact_paths(message, folders, shown):
    from clover_cli.server.errors import redact_paths

    assert redact_paths(message, folders) == shown
