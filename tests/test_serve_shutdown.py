"""Shutting `clover serve` down (SIGTERM, Ctrl-C, `clover stop`) never passes a cut reply off as
finished: a streamed reply ends with a `server_shutting_down` error event and no `[DONE]`, a
non-streamed one gets 503, queued and new requests get 503 at once, and with `--shutdown-timeout`
long enough a running reply completes with its true finish reason.

The server is the real `clover serve` process; the model never stops by itself ("tick tock, "
forever), so a reply runs until max_tokens or the shutdown ends it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import LOAD_TIMEOUT_S, ROOT, clover_env, fixed_reply_model, serve_process, sse_events

N_CTX = 4096  # the model's whole context
FOREVER = N_CTX - 64  # a reply no test waits for (seconds of generation)
CHAT = {"messages": [{"role": "user", "content": "Talk to me."}], "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}}
POSIX_SIGNALS = pytest.mark.skipif(os.name == "nt", reason="POSIX signals: Windows has no SIGTERM/SIGINT to send "
                                                           "to a process (clover stop covers Windows)")


@pytest.fixture(scope="module")
def model() -> Path:
    return fixed_reply_model("tick tock, ", endless=True)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shutdown-home")  # shared: the kernels compile once for the module


def _metrics(c: httpx.Client) -> dict[str, float]:
    rows = (line.split() for line in c.get("/metrics").text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in rows}


def _wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Stream(threading.Thread):
    """A streamed chat reply read to its end in the background: its `data:` payloads, in order."""

    def __init__(self, port: int, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.port, self.max_tokens = port, max_tokens
        self.events: list[str] = []
        self.generating = threading.Event()
        self.ended_at: float | None = None

    def run(self) -> None:
        body = {**CHAT, "max_tokens": self.max_tokens, "stream": True}
        with httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=120) as c, \
                c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for event in sse_events(r.iter_lines()):
                self.events.append(event)
                if '"content":"' in event:
                    self.generating.set()
        self.ended_at = time.monotonic()


class Post(threading.Thread):
    """A non-streamed request in the background: its response and when it came."""

    def __init__(self, port: int, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.port, self.max_tokens = port, max_tokens
        self.response: httpx.Response | None = None
        self.ended_at: float | None = None

    def run(self) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=120) as c:
            self.response = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": self.max_tokens})
        self.ended_at = time.monotonic()


def _stop(how: str, proc: subprocess.Popen, port: int, home: Path) -> None:
    if how == "clover stop":
        stopped = subprocess.run([sys.executable, "-m", "clover_cli", "stop", str(port)], cwd=ROOT,
                                 env=clover_env(home), capture_output=True, text=True, encoding="utf-8", timeout=120)
        assert stopped.returncode == 0, stopped.stderr
    else:
        proc.send_signal(getattr(signal, how))


def _shutting_down(error: dict) -> None:
    assert error["code"] == "server_shutting_down" and error["type"] == "server_error", error
    assert "shutting down" in error["message"]


@pytest.mark.parametrize("how", [pytest.param("SIGTERM", marks=POSIX_SIGNALS),
                                 pytest.param("SIGINT", marks=POSIX_SIGNALS), "clover stop"])
def test_shutdown_cuts_running_replies_with_an_error(model, home, how):
    with serve_process(model, "-c", str(N_CTX), "-np", "2", "--max-queue", "1", "--shutdown-timeout", "0.5",
                       home=home) as (proc, port):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            streamed = Stream(port, FOREVER)
            streamed.start()
            assert streamed.generating.wait(LOAD_TIMEOUT_S), streamed.events
            plain = Post(port, FOREVER)
            plain.start()
            _wait_for(lambda: _metrics(c)["clover:requests_processing"] == 2, what="both replies to run")
            queued = Post(port, 4)
            queued.start()
            _wait_for(lambda: _metrics(c)["clover:requests_deferred"] == 1, what="the third request to queue")
        _stop(how, proc, port, home)
        for t in (streamed, plain, queued):
            t.join(60)
            assert not t.is_alive()
        proc.wait(60)
    log = (home / "serve.log").read_text("utf-8")
    assert "Traceback" not in log

    assert "[DONE]" not in streamed.events
    chunks = [json.loads(e) for e in streamed.events]
    assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])
    assert chunks[-1].keys() == {"error"} and "cut" in chunks[-1]["error"]["message"]
    _shutting_down(chunks[-1]["error"])

    assert plain.response.status_code == 503, plain.response.text
    assert "choices" not in plain.response.json() and "cut" in plain.response.json()["error"]["message"]
    _shutting_down(plain.response.json()["error"])

    assert queued.response.status_code == 503, queued.response.text  # refused, never started and cut
    assert int(queued.response.headers["retry-after"]) > 0
    assert "no new requests" in queued.response.json()["error"]["message"]
    _shutting_down(queued.response.json()["error"])


@POSIX_SIGNALS
def test_shutdown_timeout_lets_a_running_reply_finish(model, home):
    with serve_process(model, "-c", str(N_CTX), "-np", "1", "--max-queue", "1", "--shutdown-timeout", "300",
                       home=home) as (proc, port):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            # the first reply in a fresh home compiles the kernels (a minute on 2 cores): not the timing probe
            c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 64}, timeout=LOAD_TIMEOUT_S).raise_for_status()
            probe = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 64}).json()
            per_token_s = probe["timings"]["predicted_per_token_ms"] / 1e3
            max_tokens = min(FOREVER, max(200, int(3.0 / per_token_s)))  # about 3 s on this machine, now
            streamed = Stream(port, max_tokens)
            streamed.start()
            assert streamed.generating.wait(LOAD_TIMEOUT_S), streamed.events
            queued = Post(port, 4)
            queued.start()
            _wait_for(lambda: _metrics(c)["clover:requests_deferred"] == 1, what="the second request to queue")
            proc.send_signal(signal.SIGTERM)
            queued.join(60)
            assert streamed.ended_at is None, "the reply ended before the test could look at the drain"
            new = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
            health = c.get("/health")
        streamed.join(300)
        assert proc.wait(60) is not None

    assert queued.ended_at < streamed.ended_at  # answered at once, not after the running reply
    assert queued.response.status_code == 503 and int(queued.response.headers["retry-after"]) > 0
    _shutting_down(queued.response.json()["error"])
    for refused in (new, health):
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
        _shutting_down(refused.json()["error"])

    assert streamed.events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in streamed.events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["timings"]["predicted_n"] == max_tokens
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks)
    assert text.startswith("tick tock, tick tock") and text == ("tick tock, " * max_tokens)[:len(text)]
