"""Helpers for the `clover serve` tests: a real uvicorn server on a free loopback port.

The server runs in a thread of the test process (the same code path as `clover serve`, minus the
CLI), with the real chat session over a tiny synthetic model, so requests go through sockets,
middleware, worker threads and the engine exactly as in production. `serve_process` starts the real
`clover serve` command instead, for what needs a process of its own (signals, `clover stop`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from clover_cli.server import ServerSettings, create_app
from clover_cli.server.launch import bind, uvicorn_config

LOAD_TIMEOUT_S = 120.0
ROOT = Path(__file__).resolve().parent.parent


class LiveServer:
    """A running server: `url(path)`, `client()` for httpx, `openai()` for the SDK."""

    def __init__(self, app: Any, server: uvicorn.Server, thread: threading.Thread, port: int) -> None:
        self.app = app
        self.server = server
        self.thread = thread
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"

    @property
    def state(self) -> Any:
        return self.app.state.clover

    def url(self, path: str) -> str:
        return self.base_url + path

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=kw.pop("timeout", 60.0), **kw)

    def openai(self, api_key: str = "none", **kw: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url("/v1"), api_key=api_key, max_retries=0,
                             timeout=kw.pop("timeout", 60.0), **kw)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until no slot is busy and nobody waits (a freed slot is returned by its worker thread)."""
        deadline = time.monotonic() + timeout
        slots = self.state.runner.slots
        while time.monotonic() < deadline:
            if slots.busy == 0 and slots.waiting == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"server still busy: {slots.busy} busy, {slots.waiting} waiting")


@contextmanager
def live_server(session_factory: Callable[[], Any], wait_loaded: bool = True,
                **settings: Any) -> Iterator[LiveServer]:
    """Start `create_app(session_factory, ServerSettings(**settings))` on 127.0.0.1:<free port>."""
    app = create_app(session_factory, ServerSettings(**settings))
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn_config(app, timeout_graceful_shutdown=5)  # the same protocol guards as `clover serve`
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"uvicorn-{port}")
    thread.start()
    live = LiveServer(app, server, thread, port)
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        if wait_loaded:
            if not live.state.loaded.wait(LOAD_TIMEOUT_S):
                raise RuntimeError("the model did not load in time")
            if live.state.load_error:
                raise RuntimeError(f"the model failed to load: {live.state.load_error}")
        yield live
    finally:
        live.state.runner.cancel_all()
        server.should_exit = True
        thread.join(15)


def clover_env(home: Path) -> dict[str, str]:
    """The environment a `clover` subprocess runs with: no CLOVER_* from the caller, its own home."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOVER_")}
    return {**clean, "CLOVER_HOME": str(home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "COLUMNS": "200"}


@contextmanager
def serve_process(model: Path, *args: str, home: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """`clover serve MODEL --port 0 ARGS` as a user starts it; yields (process, port) once /health is
    ok, and kills the process if it is still running at the end. Its stderr goes to home/serve.log."""
    home.mkdir(parents=True, exist_ok=True)
    log = (home / "serve.log").open("w", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "clover_cli", "serve", str(model), "--port", "0", *args],
                            cwd=ROOT, env=clover_env(home), text=True, encoding="utf-8", stdout=subprocess.PIPE,
                            stderr=log)
    try:
        line = proc.stdout.readline()  # blocks until the server listens (or dies)
        found = re.match(r"listening on http://127\.0\.0\.1:(\d+) ", line)
        if found is None:
            raise RuntimeError(f"clover serve did not start: {line!r}")
        port = int(found.group(1))
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code != 200:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the model did not load in time")
            time.sleep(0.1)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        proc.stdout.close()
        log.close()


@contextmanager
def clover_serve(args: list[str], env: dict[str, str]) -> Iterator[tuple[str, list[str]]]:
    """`clover serve ARGS` started as a user starts it, in the foreground on a free loopback port: yields
    its base URL once it listens, and the stderr lines (a reader thread keeps adding them)."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "clover_cli", "serve", *args, "--port", str(port)], cwd=ROOT,
                            env=env, text=True, encoding="utf-8", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        line = proc.stdout.readline()  # blocks until the server listens (or dies)
        assert line.startswith(f"listening on http://127.0.0.1:{port}"), (line, "".join(err))
        yield f"http://127.0.0.1:{port}", err
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        reader.join(10)


def sse_events(lines: Iterator[str]) -> Iterator[str]:
    """The `data:` payloads of an SSE stream, checking the framing on the way (blank-line separated)."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        assert line.startswith("data: "), f"unexpected SSE line {line!r}"
        data.append(line[len("data: "):])
    assert not data, "stream ended inside an event (no blank line after it)"


def tiny_model(folder: Path) -> Path:
    """The smallest synthetic Clover model, written once per folder."""
    from clover_runtime.synth import SynthSpec, write_model

    path = folder / "tiny.gguf"
    if not path.exists():
        write_model(path, SynthSpec.tiny())
    return path


def chat_factory(model_path: Path, n_ctx: int, **kw: Any) -> Callable[[], Any]:
    """What `clover serve` passes to create_app: a loader for the real chat session."""

    def load() -> Any:
        from clover_runtime.chat import load_chat

        return load_chat(str(model_path), n_ctx=n_ctx, **kw)

    return load


# ---- a model whose reply is known --------------------------------------------------------------
#
# Every mixer and expert output is zero except two Gated DeltaNet layers that copy earlier tokens
# into spare residual dimensions: their causal conv reads rows 1-3 back and their recurrent state
# is forgotten at every step, so a row's final hidden state depends only on the last few tokens
# (layer 1 reads layer 0's copies, reaching about six back). One head of layer 0 never forgets and
# is written only by `</tool_response>`: a "tool result seen" flag. The LM head is then solved by
# least squares so each context of the wanted replies predicts its next token with a wide margin.
# The start contexts are the real generation prompts' last tokens, so any conversation gets the
# same reply. Decoding is autoregressive (the file has no Clover preview tensors).

REPLY_HIDDEN = 256
_CUR_DIMS = 126  # dims 0..125: the token's own random direction
_COPY_LAYERS = {0: (126, (1, 2, None, 3)), 1: (190, (1, 2, 3, 1))}  # layer: (first dim, lag per value head)
_MARK_DIM, _ONE_DIM = 254, 255  # the `</tool_response>` marker and a constant 1 (feeds q, k and z)
_LOGIT_MARGIN = 30.0


def _reply_spec() -> Any:
    from clover_runtime.synth import SynthSpec

    return SynthSpec.tiny(quant="F32", hidden=REPLY_HIDDEN, clover_tensors=False, name="clover-synth-reply")


def _reply_overrides(spec: Any, head: Any = None, seed: int = 11) -> dict[str, Any]:
    """Every tensor that differs from the random synthetic weights; `head` is output.weight
    (None: identity on the first REPLY_HIDDEN rows, which exposes the final hidden state)."""
    import numpy as np
    from clover_runtime.synth.writer import plan_model
    from clover_runtime.text.vocab import small_vocab

    plans = {p.name: p for p in plan_model(spec)}
    n_vocab, hidden = plans["token_embd.weight"].shape
    vocab = small_vocab()
    rng = np.random.default_rng(seed)
    emb = np.zeros((n_vocab, hidden), dtype=np.float32)
    cur = rng.standard_normal((n_vocab, _CUR_DIMS)).astype(np.float32)
    emb[:, :_CUR_DIMS] = cur / np.linalg.norm(cur, axis=1, keepdims=True)
    emb[:, _ONE_DIM] = 1.0
    emb[vocab.tokens.index("</tool_response>"), _MARK_DIM] = 1.0
    emb[vocab.special["mask"]] = 0.0
    out: dict[str, Any] = {"token_embd.weight": emb}
    for name, plan in plans.items():
        if name.endswith(("attn_output.weight", "ssm_out.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")):
            out[name] = np.zeros(plan.shape, dtype=np.float32)
        elif name.endswith(("attn_norm.weight", "output_norm.weight", "ssm_norm.weight")):
            out[name] = np.ones(plan.shape, dtype=np.float32)
    for layer, (first_dim, lags) in _COPY_LAYERS.items():
        out.update(_copy_layer(spec, rng, layer, first_dim, lags))
    if head is None:
        head = np.zeros((n_vocab, hidden), dtype=np.float32)
        head[:hidden] = np.eye(hidden, dtype=np.float32)
    out["output.weight"] = head
    return out


def _copy_layer(spec: Any, rng: Any, layer: int, first_dim: int, lags: tuple[int | None, ...]) -> dict[str, Any]:
    """A Gated DeltaNet layer whose value head h copies (a random view of) the row lags[h] back
    into 16 residual dims from `first_dim`; a None lag makes that head the tool-result flag."""
    import numpy as np

    nk, dk, nv, dv = spec.ssm_k_heads, spec.ssm_state, spec.ssm_v_heads, spec.gdn_v_dim
    hidden, kernel = spec.hidden, spec.conv_kernel
    qk = 2 * nk * dk
    qkv = np.zeros((qk + nv * dv, hidden), dtype=np.float32)
    qkv[:qk, _ONE_DIM] = 1.0  # q and k: one constant direction, so q·k is the same for every row
    taps = np.zeros((qk + nv * dv, kernel), dtype=np.float32)
    taps[:qk, -1] = 1.0
    beta = np.zeros((nv, hidden), dtype=np.float32)
    ssm_a = np.full(nv, -50.0, dtype=np.float32)  # decay exp(-50 * softplus(20)): forget everything
    ssm_out = np.zeros((hidden, nv * dv), dtype=np.float32)
    for h, lag in enumerate(lags):
        rows = slice(qk + h * dv, qk + (h + 1) * dv)
        if lag is None:
            qkv[rows, _MARK_DIM] = 1.0
            taps[rows, -1] = 1.0
            beta[h, _MARK_DIM], beta[h, _ONE_DIM] = 4.0, -2.0  # written at the marker only...
            ssm_a[h] = 0.0  # ... and never forgotten
        else:
            qkv[rows, :first_dim] = rng.standard_normal((dv, first_dim)) * 0.25
            taps[rows, kernel - 1 - lag] = 1.0
        d0 = first_dim + h * dv
        ssm_out[d0:d0 + dv, h * dv:(h + 1) * dv] = np.eye(dv, dtype=np.float32) / 16.0
    gate = np.zeros((nv * dv, hidden), dtype=np.float32)
    gate[:, _ONE_DIM] = 0.5
    p = f"blk.{layer}."
    return {p + "attn_qkv.weight": qkv, p + "ssm_conv1d.weight": taps, p + "ssm_beta.weight": beta,
            p + "ssm_alpha.weight": np.zeros((nv, hidden), dtype=np.float32),
            p + "ssm_dt.bias": np.full(nv, 20.0, dtype=np.float32), p + "ssm_a": ssm_a,
            p + "attn_gate.weight": gate, p + "ssm_out.weight": ssm_out}


def _reply_paths(session: Any, reply: str, reasoning: str, after_tool: str | None,
                 endless: bool) -> list[tuple[list[int], int]]:
    """(token ids, index of the last prompt token) for each conversation the model must answer."""
    tok = session.tokenizer
    eos = tok.im_end_id if tok.im_end_id is not None else tok.eos_id
    user = [{"role": "user", "content": "probe"}]
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "probe", "arguments": {}}}]}
    tool = {"role": "tool", "tool_call_id": "call_0", "content": "probe"}
    cases = [(user, False, ""), (user, True, f"{reasoning}\n</think>\n\n")]
    if after_tool is not None:
        cases.append(([*user, call, tool], False, ""))
    paths = []
    for messages, thinking, lead in cases:
        prompt = tok.encode(session.render(messages, chat_template_kwargs={"enable_thinking": thinking}))
        answer = tok.encode(after_tool if len(messages) > 1 else reply)
        # endless: three rounds and no end, so the last context is the first round's and it cycles
        ids = [*tok.encode(lead), *(answer * 3 if endless else [*answer, eos])]
        paths.append(([*prompt, *ids], len(prompt) - 1))
    return paths


def _solve_head(session: Any, paths: list[tuple[list[int], int]]) -> Any:
    """output.weight such that every context on `paths` predicts its next token by _LOGIT_MARGIN."""
    import numpy as np

    hidden = REPLY_HIDDEN
    feats, targets = [], []
    for ids, first in paths:
        rows = session.model.forward(ids)[:, :hidden]
        feats.append(rows[first:-1])
        targets += ids[first + 1:]
    x = np.concatenate(feats).astype(np.float64)
    y = np.asarray(targets)
    labels = sorted(set(targets))
    want = np.zeros((len(y), len(labels)))
    want[np.arange(len(y)), np.searchsorted(labels, y)] = _LOGIT_MARGIN
    w = np.linalg.lstsq(x, want, rcond=None)[0]  # (hidden, labels)
    got = x @ w
    right = got[np.arange(len(y)), np.searchsorted(labels, y)]
    got[np.arange(len(y)), np.searchsorted(labels, y)] = 0.0
    worst = float(np.min(right - np.maximum(got.max(axis=1), 0.0)))
    if worst < _LOGIT_MARGIN / 2:
        raise ValueError(f"the reply cannot be learned (margin {worst:.2f}): it is too long (about 200 "
                         "contexts fit) or a short context repeats with different continuations")
    head = np.zeros((session.model.n_vocab, hidden), dtype=np.float32)
    head[labels] = w.T
    return head


def fixed_reply_model(reply: str, *, reasoning: str = "The user wants a reply; here it is.",
                      after_tool: str | None = None, endless: bool = False) -> Path:
    """A tiny model that answers any chat with `reply` (after `reasoning` in thinking mode), and a
    turn that follows a tool result with `after_tool` (all together at most about 200 tokens).
    `endless` repeats `reply` until max_tokens or the context runs out, for tests that need a
    generation to keep its slot. Files are shared per test session (the synth_models cache)."""
    from clover_runtime.chat import load_chat
    from synth_models import model_path

    spec = _reply_spec()
    probe = load_chat(str(model_path(spec, tensors_override=_reply_overrides(spec))), n_ctx=4096)
    head = _solve_head(probe, _reply_paths(probe, reply, reasoning, after_tool, endless))
    return model_path(spec, tensors_override=_reply_overrides(spec, head))
