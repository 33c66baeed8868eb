"""One line per request on stderr, as llama-server and Ollama print them: method, route, status
and time, and for a generation its prompt tokens (how many came from the prompt cache), the
tokens generated, their speed and the decode mode that wrote them.

The generation runs in a worker thread that knows nothing of HTTP, so the request's facts travel
in a context variable: the middleware sets an empty record, `Runner.start` (called in the
request's context) hands it to the worker, which adds each `Finished` it passes on.
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import IO, Any

from clover_runtime.text.reply import Timings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..console import safe

log = logging.getLogger("clover.requests")


@dataclass
class RequestFacts:
    """What the request's generations reported when they finished (one per choice)."""

    finished: list[Any] = field(default_factory=list)


_current: ContextVar[RequestFacts | None] = ContextVar("clover_request_facts", default=None)


def current() -> RequestFacts | None:
    """The record of the request being served in this context (None outside a request)."""
    return _current.get()


def enable(stream: IO[str] | None = None) -> None:
    """Print the lines (`clover serve` does, at every verbosity); without this they go nowhere."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def _mode(timings: Timings, stats: Any) -> str:
    """Which decoder wrote the tokens, from the counts (auto may write a reply in both)."""
    ar, diffusion = timings.ar_n, timings.diffusion_n
    if ar and diffusion:
        return f"AR {ar} + diffusion {diffusion}"
    if ar or diffusion:
        return "AR" if ar else f"diffusion, {timings.tokens_per_forward:.2f} tokens per forward"
    return str(getattr(stats, "decode_mode", "") or "")


def line(method: str, path: str, status: int, ms: float, facts: RequestFacts) -> str:
    """`POST /v1/chat/completions 200 1234 ms · prompt 21 tokens (16 cached) · 11 generated at
    20.1 t/s · AR`; a request that generated nothing stops after the time."""
    head = f"{safe(method)} {safe(path)} {status} {ms:.0f} ms"
    if not facts.finished:
        return head
    first = facts.finished[0]
    usage = first.usage
    generated = sum(f.usage.completion_tokens for f in facts.finished)
    gen_ms = sum(f.timings.predicted_ms for f in facts.finished)
    speed = generated / gen_ms * 1e3 if gen_ms > 0 else 0.0
    parts = [head, f"prompt {usage.prompt_tokens} tokens ({usage.cached_tokens} cached)",
             f"{generated} generated at {speed:.1f} t/s"]
    mode = _mode(first.timings, first.stats)
    if mode:
        parts.append(mode)
    reasons = sorted({f.finish_reason for f in facts.finished} - {"stop"})
    if reasons:
        parts.append(", ".join(reasons))
    return " · ".join(parts)


class RequestLog:
    """Pure-ASGI middleware (outermost, so it sees every status, 401 and 413 included) that logs
    each HTTP request once its response has been sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        facts = RequestFacts()
        token = _current.set(facts)
        started = time.perf_counter()
        status = 500  # an exception before the response started is answered 500 by Starlette

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            _current.reset(token)
            if log.isEnabledFor(logging.INFO):
                log.info(line(scope.get("method", ""), scope.get("path", ""), status,
                              (time.perf_counter() - started) * 1e3, facts))
