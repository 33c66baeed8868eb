"""Running the app under uvicorn on a socket we bind ourselves.

Binding first turns "port in use" into one clear error instead of uvicorn's exit; the server
subclass announces when it listens and when the model is ready, cancels generations on Ctrl-C or
SIGTERM, and stops with an error if the model fails to load.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from clover_runtime.errors import CloverError

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
        self.state.runner.cancel_all()
        self.should_exit = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.state.runner.cancel_all()
        super().handle_exit(sig, frame)

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
        self.state.runner.cancel_all()
        try:
            await super().shutdown(sockets)
        finally:
            if self.on_exit is not None:
                self.on_exit()


def serve(app: Any, sock: socket.socket, *, on_listening: Callable[[], None],
          on_loaded: Callable[[], None], on_exit: Callable[[], None] | None = None,
          access_log: bool = False) -> None:
    """Serve until stopped; raises CloverError when the model could not be loaded."""
    config = uvicorn.Config(app, log_level="info" if access_log else "warning", access_log=access_log,
                            timeout_graceful_shutdown=10, lifespan="on", ws="none")
    server = CloverServer(config, app.state.clover, on_listening=on_listening, on_loaded=on_loaded,
                          on_exit=on_exit)
    server.run(sockets=[sock])
    if server.load_failed is not None:
        raise CloverError(f"the model failed to load: {server.load_failed}")
