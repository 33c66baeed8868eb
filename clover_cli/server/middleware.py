"""Pure-ASGI guards in front of every route: request-size cap, API keys and the origin check.

Pure ASGI (not BaseHTTPMiddleware) so streamed responses pass through untouched.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import Iterable

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..console import safe
from .errors import APIError, body_for

log = logging.getLogger("clover.server")

PUBLIC_PATHS = frozenset({"/", "/index.html", "/favicon.ico", "/health", "/v1/health", "/models",
                          "/v1/models", "/_clover/shutdown"})


async def _send_error(scope: Scope, send: Send, error: APIError) -> None:
    body = json.dumps(body_for(scope.get("path", ""), error)).encode()  # in the shape of the path's API
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class _BodyRefused(Exception):
    """The body broke a limit (size, time): answered by BodyLimit with `error`, not a 500."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


class _StartTracking:
    """Wraps `send` and remembers whether the response has started: an error body can only be sent
    before that."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class BodyLimit:
    """413 for bodies over `max_bytes`, by Content-Length or while a chunked body streams in; 408 for
    a body that has not fully arrived `timeout_s` after the route started reading it (a client that
    trickles its upload cannot hold a connection and a request forever)."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 120.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    def _error(self, size: int | None = None) -> APIError:
        what = f"{size} bytes" if size is not None else "more"
        return APIError(413, f"request body too large ({what}; the limit is {self.max_bytes} bytes)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_error(scope, send, self._error(int(length)))
            return
        seen = 0
        complete = False
        deadline: float | None = None

        async def limited_receive() -> Message:
            nonlocal seen, complete, deadline
            if complete:  # the body is in: later receives wait for a disconnect, untimed
                return await receive()
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + self.timeout_s
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                late = APIError(408, f"request body not received within {self.timeout_s:g} s",
                                headers={"Connection": "close"})  # the rest of the body would follow
                raise _BodyRefused(late) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyRefused(self._error())
                complete = not message.get("more_body", False)
            return message

        tracked = _StartTracking(send)
        try:
            await self.app(scope, limited_receive, tracked.send)
        except _BodyRefused as refused:
            if not tracked.started:
                await _send_error(scope, send, refused.error)


def split_host(host: str) -> tuple[str, int | None]:
    """A Host header as (lower-case name, port or None); `[::1]:80` keeps its brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host.partition("]")
        name, port = name + "]", rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        name, _, port = host.partition(":")
    else:
        name, port = host, ""
    if port and not port.isdigit():
        return name.rstrip("."), -1
    return name.rstrip("."), int(port) if port else None


class Guard:
    """The Host check, API keys (Bearer or X-Api-Key, constant-time) and a same-machine origin check.

    A browser page from another site can still *send* a simple POST even though CORS hides the
    answer; refusing foreign `Origin`s outright stops such pages from using the model at all. A page
    whose name was rebound to 127.0.0.1 (DNS rebinding) is same-origin to itself, so a loopback server
    also refuses any Host that is not a local name: that page's requests carry its own name.
    """

    def __init__(self, app: ASGIApp, keys: Iterable[str], origin_regex: str, any_origin: bool,
                 host_names: frozenset[str] | None = None) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys if k]
        self.origin = re.compile(origin_regex)
        self.any_origin = any_origin
        self.host_names = host_names

    def _host_ok(self, scope: Scope) -> bool:
        host = _header(scope, b"host")
        if self.host_names is None or host is None:  # no Host at all: HTTP/1.0, never a browser
            return True
        name, port = split_host(host)
        server = scope.get("server") or (None, None)
        our_port = server[1] if len(server) > 1 else None
        port_ok = port == our_port or (port is None and our_port in (80, None))
        return port_ok and name in self.host_names

    def _key_ok(self, scope: Scope) -> bool:
        given = None
        auth = _header(scope, b"authorization")
        if auth and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if given is None:
            given = _header(scope, b"x-api-key")
        if given is None:
            return False
        candidate = given.encode()
        ok = False
        for key in self.keys:  # every key compared, so timing says nothing about which matched
            ok |= hmac.compare_digest(candidate, key)
        return ok

    def _origin_ok(self, scope: Scope) -> bool:
        origin = _header(scope, b"origin")
        if origin is None or self.any_origin or self.origin.fullmatch(origin):
            return True
        host = _header(scope, b"host")
        scheme = scope.get("scheme", "http")
        return host is not None and origin in (f"{scheme}://{host}",)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        if not self._host_ok(scope):
            await _send_error(scope, send, APIError(403, "requests for this host name are not allowed; this server "
                                                  "answers to localhost, 127.0.0.1 and [::1] (start it with "
                                                  "--allowed-hosts to allow another name)"))
            return
        if not self._origin_ok(scope):
            await _send_error(scope, send, APIError(403, "requests from this origin are not allowed; "
                                                  "start the server with --cors-origins to allow it"))
            return
        if self.keys and scope["path"] not in PUBLIC_PATHS and not self._key_ok(scope):
            await _send_error(scope, send, APIError(401, "Invalid API Key",
                                             headers={"WWW-Authenticate": "Bearer"}))
            return
        await self.app(scope, receive, send)


class CatchAll:
    """Last line of defence: an unexpected exception becomes a 500 body, logged once, no traceback out."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = _StartTracking(send)
        try:
            await self.app(scope, receive, tracked.send)
        except _BodyRefused:
            raise
        except ClientDisconnect:  # a normal event (the client gave up while sending): no answer, no traceback
            log.info("client disconnected during %s %s before the request body arrived", scope.get("method"),
                     safe(scope.get("path", "")))  # the path is the client's text: escaped for the terminal
        except Exception as exc:  # noqa: BLE001 - mapped to a 500, never re-raised to uvicorn
            log.error("internal error on %s %s: %s: %s", scope.get("method"), safe(scope.get("path", "")),
                      type(exc).__name__, safe(exc), exc_info=exc)
            if not tracked.started:
                await _send_error(scope, send, APIError(500, f"internal error: {type(exc).__name__}"))
