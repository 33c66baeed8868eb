"""What one server process holds: settings, the model once it has loaded, slots and counters."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .backend import Backend
from .errors import APIError, redact_paths
from .generation import Runner
from .metrics import Metrics
from .settings import ServerSettings

log = logging.getLogger("clover.server")


class ServerState:
    def __init__(self, session_factory: Callable[[], Any], settings: ServerSettings) -> None:
        self.settings = settings
        self.session_factory = session_factory
        self.runner = Runner(settings.n_parallel, settings.max_queue)
        self.metrics = Metrics()
        self.backend: Backend | None = None
        self.load_error: str | None = None
        self.loaded = threading.Event()
        self.created = int(time.time())
        self.request_exit: Callable[[], None] | None = None
        self.private_folders = settings.private_folders()

    def public(self, error: APIError) -> APIError:
        """`error` as a client may see it: no folder of this machine in its message."""
        message = redact_paths(error.message, self.private_folders)
        if message == error.message:
            return error
        return APIError(error.status, message, type_=error.type, param=error.param, headers=error.headers,
                        extra=error.extra)

    def load(self) -> None:
        """Build the chat session (slow: reads and maps the model); run in a background thread."""
        try:
            self.backend = Backend(self.session_factory(), self.settings)
        except Exception as exc:  # noqa: BLE001 - reported by /health and the CLI, never raised
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            self.load_error = message
            log.error("model failed to load: %s", message)
        finally:
            self.loaded.set()

    def start_loading(self) -> threading.Thread:
        thread = threading.Thread(target=self.load, name="clover-load", daemon=True)
        thread.start()
        return thread

    def n_ctx_slot(self) -> int:
        """Each slot's context: the loaded model's, or before it has loaded what the CLI settled (0
        when nothing is known yet)."""
        if self.backend is not None:
            return self.backend.n_ctx
        return self.settings.n_ctx_slot or 0

    def require_backend(self) -> Backend:
        if self.backend is not None:
            return self.backend
        if self.load_error is not None:
            raise APIError(500, f"model failed to load: {self.load_error}")
        raise APIError(503, "Loading model", headers={"Retry-After": "2"})
