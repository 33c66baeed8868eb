"""Slots, the bounded queue, client disconnects, request timeouts and failure isolation.

The model here never stops by itself ("tick tock, " forever), so a generation keeps its slot
until max_tokens, the timeout or a disconnect ends it: the tests decide when a slot frees.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from serve_helpers import chat_factory, fixed_reply_model, live_server, sse_events

N_CTX = 16384
FOREVER = N_CTX - 64  # max_tokens no test waits for: minutes of generation on any machine
CHAT = {"messages": [{"role": "user", "content": "Talk to me."}], "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def model():
    return fixed_reply_model("tick tock, ", endless=True)


@pytest.fixture(scope="module")
def server(model):
    with live_server(chat_factory(model, N_CTX), n_ctx_slot=N_CTX, n_parallel=1, max_queue=1) as live:
        yield live


def _metrics(c: httpx.Client) -> dict[str, float]:
    rows = (line.split() for line in c.get("/metrics").text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in rows}


def _wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> float:
    """Seconds until predicate() held; fails the test after `timeout`."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - t0


def test_queue_full_is_503_and_a_disconnect_frees_the_slot(server):
    c = server.client()
    before = _metrics(c)
    streamer = server.client()
    with streamer.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": FOREVER, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while '"content":"' not in next(lines):  # generating: the only slot is taken
            pass
        waiting: dict = {}
        queued = threading.Thread(target=lambda: waiting.update(
            r=c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})))
        queued.start()
        _wait_for(lambda: _metrics(c)["clover:requests_deferred"] == 1, what="the second request to queue")
        assert _metrics(c)["clover:requests_processing"] == 1

        full = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
        assert full.status_code == 503
        assert int(full.headers["retry-after"]) > 0
        assert full.json()["error"]["type"] == "unavailable_error" and "busy" in full.json()["error"]["message"]
        with pytest.raises(openai.InternalServerError) as info:
            server.openai().chat.completions.create(model="m", messages=CHAT["messages"], max_tokens=4)
        assert info.value.status_code == 503
    streamer.close()  # the client goes away mid-stream: its generation must stop, the queued one runs

    queued.join(30)
    assert waiting["r"].status_code == 200
    assert waiting["r"].json()["choices"][0]["message"]["content"] == "tick tock"
    _wait_for(lambda: _metrics(c)["clover:requests_processing"] == 0, timeout=10, what="the slot to free")
    after = _metrics(c)
    assert after["clover:requests_cancelled_total"] == before["clover:requests_cancelled_total"] + 1
    assert after["clover:requests_rejected_total"] == before["clover:requests_rejected_total"] + 2
    c.close()


def test_non_streaming_client_that_leaves_is_cancelled(server):
    with server.client() as c:
        before = _metrics(c)["clover:requests_cancelled_total"]
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/chat/completions", json={**CHAT, "max_tokens": FOREVER}, timeout=1.0)
        _wait_for(lambda: _metrics(c)["clover:requests_processing"] == 0, timeout=10, what="the slot to free")
        assert _metrics(c)["clover:requests_cancelled_total"] == before + 1
        ok = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


def test_failures_do_not_take_the_server_down(server):
    """Bad JSON, bad fields, an oversize prompt, a broken-off stream and a normal request, at once."""
    huge = "word " * N_CTX
    bodies = [b"{oops", json.dumps({**CHAT, "temperature": "warm"}).encode(),
              json.dumps({**CHAT, "messages": [{"role": "user", "content": huge}]}).encode(),
              json.dumps({"prompt": "", "max_tokens": 2}).encode()]
    statuses: list[int] = []

    def bad(body: bytes) -> None:
        with server.client() as c:
            url = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
            statuses.append(c.post(url, content=body, headers={"content-type": "application/json"}).status_code)

    def broken_stream() -> None:
        with server.client() as c, c.stream("POST", "/v1/chat/completions",
                                            json={**CHAT, "max_tokens": FOREVER, "stream": True}) as r:
            next(r.iter_lines())

    threads = [threading.Thread(target=bad, args=(b,)) for b in bodies] + [threading.Thread(target=broken_stream)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == [400, 400, 400, 400]
    with server.client() as c:
        _wait_for(lambda: _metrics(c)["clover:requests_processing"] == 0, timeout=10, what="the slot to free")
        assert c.get("/health").json() == {"status": "ok"}
        ok = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "tick tock,"


def test_request_timeout(model):
    with live_server(chat_factory(model, 4096), n_ctx_slot=4096, timeout_s=1.0) as live, live.client() as c:
        t0 = time.monotonic()
        r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4000})
        assert r.status_code == 504 and time.monotonic() - t0 < 10
        assert r.json()["error"]["type"] == "timeout_error" and "timed out" in r.json()["error"]["message"]
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 4000, "stream": True}) as s:
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
        assert json.loads(events[-1])["error"]["code"] == 504 and "[DONE]" not in events
        _wait_for(lambda: _metrics(c)["clover:requests_processing"] == 0, timeout=10, what="the slot to free")
        ok = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
    assert ok.status_code == 200


def test_clients_that_left_the_queue_free_their_places(model):
    """A request whose client disconnected while it waited for a slot leaves the line at once, so live
    requests within --max-queue are admitted instead of 503."""
    with live_server(chat_factory(model, N_CTX), n_ctx_slot=N_CTX, n_parallel=1, max_queue=2) as live, \
            live.client() as c, live.client() as streamer, \
            streamer.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": FOREVER, "stream": True}) as r:
        lines = r.iter_lines()
        while '"content":"' not in next(lines):  # generating: the only slot is taken
            pass
        before = _metrics(c)["clover:requests_cancelled_total"]

        def leave() -> None:
            with live.client() as gone, pytest.raises(httpx.ReadTimeout):
                gone.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4}, timeout=1.0)

        leavers = [threading.Thread(target=leave) for _ in range(2)]
        for t in leavers:
            t.start()
        for t in leavers:
            t.join(30)
        # the queue's gauge drops as a leaver's job is withdrawn, its cancellation is counted just after
        _wait_for(lambda: (_metrics(c)["clover:requests_deferred"] == 0
                           and _metrics(c)["clover:requests_cancelled_total"] == before + 2),
                  timeout=10, what="the queue to empty and both leavers to be counted")
        after = _metrics(c)
        assert after["clover:requests_processing"] == 1  # left while the slot was still taken: never ran
        assert after["clover:requests_cancelled_total"] == before + 2

        answers: list[httpx.Response] = []
        live_ones = [threading.Thread(target=lambda: answers.append(
            c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4}))) for _ in range(2)]
        for t in live_ones:
            t.start()
        _wait_for(lambda: _metrics(c)["clover:requests_deferred"] == 2, what="both live requests to queue")
        streamer.close()  # the slot frees: both run in turn
        for t in live_ones:
            t.join(60)
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert all(a.json()["choices"][0]["finish_reason"] == "length" for a in answers)


def test_a_reply_cut_short_never_says_it_finished(server):
    """A generation the server stops for no reason the client knows (here: the runner cancelling
    everything, as on an internal failure) ends with an error, never `finish_reason: "stop"`."""
    with server.client() as c, c.stream("POST", "/v1/chat/completions",
                                        json={**CHAT, "max_tokens": FOREVER, "stream": True}) as r:
        events = sse_events(r.iter_lines())
        seen = []
        for event in events:
            seen.append(event)
            if '"content":"' in event:
                break
        server.state.runner.cancel_all()
        seen += list(events)
    assert "[DONE]" not in seen
    chunks = [json.loads(e) for e in seen]
    assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])
    assert chunks[-1]["error"]["code"] == 500 and chunks[-1]["error"]["type"] == "server_error"
    server.wait_idle()

    answer: dict = {}

    def ask() -> None:
        with server.client() as c:
            answer["r"] = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": FOREVER})

    plain = threading.Thread(target=ask)
    plain.start()
    with server.client() as c:
        _wait_for(lambda: _metrics(c)["clover:requests_processing"] == 1, what="the reply to run")
    server.state.runner.cancel_all()
    plain.join(30)
    assert answer["r"].status_code == 500 and "choices" not in answer["r"].json()
