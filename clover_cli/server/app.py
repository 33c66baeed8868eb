"""`create_app`: the FastAPI application behind `clover serve`, independent of how it is launched."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from . import anthropic_api, llama_api, native_api, ollama_api, openai_api, responses_api
from .access_log import RequestLog
from .errors import install_handlers
from .middleware import BodyLimit, CatchAll, Guard
from .settings import ServerSettings
from .state import ServerState


def create_app(session_factory: Callable[[], Any], settings: ServerSettings) -> FastAPI:
    """An app that starts loading the model (via `session_factory()`, in a thread) when it starts.

    Until the session exists `/health` answers 503 "Loading model" and generation routes do too,
    so a process manager can start the server first and poll for readiness.
    """
    state = ServerState(session_factory, settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.start_loading()
        try:
            yield
        finally:
            state.runner.close()

    app = FastAPI(title="clover", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.clover = state
    install_handlers(app)
    app.include_router(native_api.router)
    app.include_router(openai_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(responses_api.router)
    app.include_router(ollama_api.router)
    app.include_router(llama_api.router)
    # Added innermost first: CatchAll < Guard (keys, origin) < BodyLimit < CORS < RequestLog, so even 401/413/500
    # carry CORS headers and preflights are answered before any key is asked for.
    app.add_middleware(CatchAll)
    app.add_middleware(Guard, keys=settings.api_keys, origin_regex=settings.origin_regex(),
                       any_origin=settings.allows_any_origin, host_names=settings.host_names())
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    cors: dict[str, Any] = {"allow_origins": ["*"]} if settings.allows_any_origin else {
        "allow_origin_regex": settings.origin_regex()}
    app.add_middleware(CORSMiddleware, allow_methods=["GET", "POST", "OPTIONS"],
                       allow_headers=["Authorization", "Content-Type", "X-Api-Key", "Anthropic-Version",
                                      "Anthropic-Beta"],
                       allow_credentials=False, max_age=600, **cors)
    app.add_middleware(RequestLog)  # outermost: one line per request, whatever answered it
    return app
