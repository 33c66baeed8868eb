"""Running the app under uvicorn on a socket we bind ourselves.

Binding first turns "port in use" into one clear error instead of uvicorn's exit; the server
subclass announces when it listens and when the model is ready, drains on Ctrl-C, SIGTERM or
`clover stop` (queued and new requests get 503 at once, running replies get --shutdown-timeout
seconds to finish, then are cut with an error that says so), and stops with an error if the model
fails to load.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from clover_runtime.errors import CloverError

from .errors import TYPES
from .state import ServerState


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port, or a CloverError that says what to do."""
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CloverError(f"cannot bind to host {host!r}: {exc.strerror}",
                          "use an IP address such as 127.0.0.1 or 0.0.0.0") from None
    family, _, _, _, address = infos[0]
    try:
        return socket.create_server(address, family=family, backlog=128)
    except OSError as exc:
        if port:
            hint = f"another program uses port {port}; pick one with --port, or see `clover ps`"
        else:
            hint = None
        raise CloverError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint) from None


class CloverServer(uvicorn.Server):
    """uvicorn with start-up announcements, load-failure exit and cancel-on-exit."""

    def __init__(self, config: uvicorn.Config, state: ServerState, *,
                 on_listening: Callable[[], None], on_loaded: Callable[[], None],
                 on_exit: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.state = state
        self.on_listening = on_listening
        self.on_loaded = on_loaded
        self.on_exit = on_exit
        self.announced_load = False
        self.load_failed: str | None = None
        state.request_exit = self.request_exit

    def request_exit(self) -> None:
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self.on_listening()

    async def on_tick(self, counter: int) -> bool:
        if not self.announced_load and self.state.loaded.is_set():
            self.announced_load = True
            if self.state.load_error is not None:
                self.load_failed = self.state.load_error
                self.should_exit = True
            else:
                self.on_loaded()
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain while still listening (so new requests are answered 503, not refused), then let
        uvicorn close the connections; a second Ctrl-C (force_exit) cuts at once."""
        try:
            await self.state.runner.drain(self.state.settings.shutdown_timeout_s, lambda: self.force_exit)
            await super().shutdown(sockets)
        finally:
            if self.on_exit is not None:
                self.on_exit()


def guarded_protocol(header_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol with a header deadline and a connection cap.

    uvicorn times out idle keep-alive connections but not a client that trickles its request
    headers one byte at a time; such clients would hold sockets (and memory) forever. Each request's
    headers must now arrive within `header_timeout_s` of its first byte (or of the connection), and
    past `max_connections` open connections a new one is answered 503 and closed, so /health and
    real clients keep being served while slow ones time out.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self._refuse(503, "Service Unavailable", "too many open connections; try again shortly")
                return
            self._watch_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_watch()
            super().connection_lost(exc)

        def _waiting_for_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _watch_headers(self) -> None:
            if self.transport.is_closing() or not self._waiting_for_headers():
                self._stop_watch()
            elif self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _stop_watch(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._waiting_for_headers() and not self.transport.is_closing():
                self._refuse(408, "Request Timeout", f"request headers not received within {header_timeout_s:g} s")

        def _refuse(self, status: int, reason: str, message: str) -> None:
            body = json.dumps({"error": {"code": status, "message": message, "type": TYPES[status]}}).encode()
            head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
            self.transport.write(head + body)
            self.transport.close()

    return GuardedH11Protocol


def uvicorn_config(app: Any, *, log_level: str = "warning", access_log: bool = False,
                   timeout_graceful_shutdown: int = 10) -> uvicorn.Config:
    """The one uvicorn configuration `clover serve` (and its tests) run the app with."""
    settings = app.state.clover.settings
    return uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on", ws="none",
                          timeout_graceful_shutdown=timeout_graceful_shutdown,
                          http=guarded_protocol(settings.header_timeout_s, settings.max_connections))


def serve(app: Any, sock: socket.socket, *, on_listening: Callable[[], None],
          on_loaded: Callable[[], None], on_exit: Callable[[], None] | None = None,
          verbose: bool = False) -> None:
    """Serve until stopped; raises CloverError when the model could not be loaded. Requests are
    logged by the app's own line (server/access_log.py), so uvicorn's access log stays off."""
    config = uvicorn_config(app, log_level="info" if verbose else "warning")
    server = CloverServer(config, app.state.clover, on_listening=on_listening, on_loaded=on_loaded,
                          on_exit=on_exit)
    server.run(sockets=[sock])
    if server.load_failed is not None:
        raise CloverError(f"the model failed to load: {server.load_failed}")
