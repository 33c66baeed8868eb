"""OpenAI-shaped errors: every failure leaves the server as `{"error": {"code", "message", "type"}}`.

The type names follow llama-server's table so clients written for it (and the `openai` SDK, which
maps the status code to an exception class) see what they expect.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("clover.server")

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
    504: "timeout_error",
}


class APIError(Exception):
    """An error answered to the client with the given status and OpenAI error body."""

    def __init__(self, status: int, message: str, *, type_: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or TYPES.get(status, "server_error")
        self.param = param
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.status, "message": self.message, "type": self.type}
        if self.param is not None:
            err["param"] = self.param
        err.update(self.extra)
        return {"error": err}

    def response(self, path: str = "") -> JSONResponse:
        return JSONResponse(body_for(path, self), status_code=self.status, headers=self.headers)


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors); others are api_error.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                   503: "overloaded_error", 504: "timeout_error"}


def anthropic_body(error: APIError) -> dict[str, Any]:
    """The error as the Anthropic SDK reads it: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(error.status, "api_error"),
                                       "message": error.message}}


def body_for(path: str, error: APIError) -> dict[str, Any]:
    """The error body in the shape of the API the path belongs to: Anthropic's for /v1/messages,
    Ollama's `{"error": "message"}` for /api/*, OpenAI's (with llama-server's types) elsewhere."""
    if path.startswith(("/v1/messages", "/messages")):
        return anthropic_body(error)
    if path.startswith("/api/"):
        return {"error": error.message}
    return error.body()


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def template_error(exc: Exception) -> APIError:
    """A chat-template failure (bad role order, missing user turn) is the client's to fix: 400."""
    message = getattr(exc, "message", None) or str(exc)
    if not message.lower().startswith("chat template"):
        message = f"chat template: {message}"
    return APIError(400, message, param="messages")


def context_exceeded(n_prompt: int, n_ctx: int, what: str = "messages") -> APIError:
    """OpenAI's wording and code (agent frameworks match them to compress their history) plus
    llama-server's type and fields, so clients written for either recognise it."""
    return APIError(
        400,
        f"This model's maximum context length is {n_ctx} tokens. However, your {what} resulted in "
        f"{n_prompt} tokens. Please reduce the length of the {what}. (request ({n_prompt} tokens) exceeds "
        f"the available context size ({n_ctx} tokens), try increasing it)",
        type_="exceed_context_size_error",
        param=what,
        extra={"code": "context_length_exceeded", "n_prompt_tokens": n_prompt, "n_ctx": n_ctx},
    )


def redact_paths(message: str, folders: Iterable[str]) -> str:
    """`message` without this machine's folders (a client has no business knowing them): a file
    inside one keeps only its path below it, the folder itself reads `<server folder>`.
    `folders` should come longest first, so a nested folder is cut before its parent."""
    for folder in folders:
        for form in dict.fromkeys((folder, folder.replace("\\", "\\\\"))):
            message = re.sub(re.escape(form) + r"[/\\]+", "", message)
            message = re.sub(re.escape(form) + r"(?![\w.-])", "<server folder>", message)
    return message


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return APIError(status, message, headers=headers).response()


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """First pydantic error as `field.path: what is wrong`, naming the field the client must fix."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
    # pydantic puts the union member's name in the path (e.g. `str`, `list[...]`); the client
    # never wrote those, so they are dropped from the field name.
    loc = [p for p in loc if not (p[:1].islower() and ("[" in p or p in ("str", "int", "float", "bool",
                                                                           "dict", "list")))]
    field = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return (f"{field}: {msg}" if field else msg), field


def install_handlers(app: FastAPI) -> None:
    """Map every exception the app can raise onto an OpenAI-shaped body; no traceback ever leaves."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return request.app.state.clover.public(exc).response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_message(list(exc.errors()))
        return bad_request(message, field).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = request.url.path
        if exc.status_code == 404:
            message = f"File Not Found: no route {path}" + nearest_route(path, _route_paths(app))
        elif exc.status_code == 405:
            message = f"Method Not Allowed: {request.method} {path}"
        else:
            message = str(exc.detail)
        return APIError(exc.status_code, message, headers=dict(exc.headers or {})).response(path)


def _route_paths(app: FastAPI) -> list[str]:
    """Every route's path, through included routers (newer FastAPI keeps those as routers)."""
    paths: set[str] = set()
    stack = list(app.routes)
    while stack:
        route = stack.pop()
        if isinstance(path := getattr(route, "path", None), str):
            paths.add(path)
        inner = getattr(route, "original_router", None)
        if inner is not None:
            stack.extend(inner.routes)
    return sorted(paths)


def nearest_route(path: str, routes: list[str]) -> str:
    """"; did you mean /v1/chat/completions?" for the route most like `path` (difflib), else a pointer
    to /v1: a typo or a missing prefix gets the route the client meant."""
    import difflib

    plain = [r for r in routes if "{" not in r]
    shapes = {r.split("{", 1)[0].rstrip("/"): r for r in routes if "{" in r}
    match = difflib.get_close_matches(path.rstrip("/") or "/", plain + list(shapes), n=1, cutoff=0.6)
    if match:
        return f"; did you mean {shapes.get(match[0], match[0])}?"
    return " (the OpenAI API is under /v1, Ollama's under /api)"
