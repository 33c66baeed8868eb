"""llama-server-style native routes: health, props, metrics, slots, tokenizer and template tools,
the web page, and the shutdown hook `clover stop` uses."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from .errors import APIError
from .generation import shutting_down_error
from .schemas import ApplyTemplateRequest, DetokenizeRequest, SlotFileRequest, TokenizeRequest, parse_body
from .state import ServerState

router = APIRouter()
PAGE = Path(__file__).resolve().parent / "static" / "index.html"


def _state(request: Request) -> ServerState:
    return request.app.state.clover


@router.api_route("/health", methods=["GET", "HEAD"])
@router.api_route("/v1/health", methods=["GET", "HEAD"])
async def health(request: Request) -> Any:
    state = _state(request)
    if state.runner.stopping:
        raise shutting_down_error()
    state.require_backend()
    return {"status": "ok"}


@router.api_route("/", methods=["GET", "HEAD"])
@router.api_route("/index.html", methods=["GET", "HEAD"])
async def index(request: Request) -> Any:
    state = _state(request)
    if not state.settings.webui:
        raise APIError(404, "the web UI is disabled (--no-webui); the API is at /v1")
    return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers={"Cache-Control": "no-cache"})


@router.get("/favicon.ico")
async def favicon() -> Response:
    return Response(status_code=204)


@router.get("/props")
async def props(request: Request) -> Any:
    state = _state(request)
    s = state.settings
    backend = state.backend
    body: dict[str, Any] = {
        "model_alias": s.model_id,
        "model_path": s.model_path,
        "total_slots": s.n_parallel,
        "n_ctx": state.n_ctx_slot() * s.n_parallel,
        "n_ctx_slot": state.n_ctx_slot(),
        "build_info": s.build,
        "loaded": backend is not None,
        "api_key_required": bool(s.api_keys),
        "default_generation_settings": {
            "n_ctx": state.n_ctx_slot(),
            "params": {"decode": s.decode or "auto", "threshold": s.threshold,
                       "block_length": s.block_length, "verify": s.verify,
                       "reasoning_budget": s.reasoning_budget},
        },
        "modalities": {"vision": False, "audio": False},
    }
    if backend is not None:
        sampling = backend.default_sampling()  # what a request without sampling fields gets
        body["default_generation_settings"]["params"].update(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
            repeat_penalty=sampling.repetition_penalty)
        body["chat_template"] = backend.chat_template_text()
        body["meta"] = backend.meta()
    body.update(s.extra_props)
    return body


@router.get("/slots")
async def slots(request: Request) -> Any:
    state = _state(request)
    pool = state.runner.slots
    backend = state.backend
    if backend is None:
        return [{"id": i, "n_ctx": state.n_ctx_slot(), "is_processing": False} for i in range(pool.n_slots)]
    return [backend.slot_info(i, i in pool.processing) for i in range(pool.n_slots)]


_NOT_IN_NAMES = frozenset('/\\:') | {chr(c) for c in range(32)} | {chr(127)}


def slot_file(folder: Path, name: str) -> Path:
    """The file a slot save or restore names: a plain file name (no separator, no `..`, no drive)
    in the --slot-save-path folder; a symlink there must lead to a file in that folder. Else 400."""
    bad = APIError(400, "filename must be a plain file name inside --slot-save-path", param="filename")
    if (name in ("", ".", "..") or any(ch in _NOT_IN_NAMES for ch in name) or Path(name).name != name
            or len(name.encode("utf-8", "surrogatepass")) > 255):
        raise bad
    try:
        root = folder.resolve()
        path = root / name
        if path.is_symlink():
            real = path.resolve()
            if real.parent != root or not real.is_file():
                raise bad
    except (OSError, RuntimeError):  # a symlink loop, an unreadable folder
        raise bad from None
    return path


@router.post("/slots/{slot_id}")
async def slot_action(request: Request, slot_id: str, action: str | None = None) -> Any:
    """llama-server's slot persistence: save / restore a slot's prompt state to a file in
    --slot-save-path, or erase it. The slot must be idle; it is held while the file is read or written."""
    state = _state(request)
    pool = state.runner.slots
    if action not in ("save", "restore", "erase"):
        raise APIError(400, "action must be save, restore or erase (?action=...)", param="action")
    if not slot_id.isdigit() or int(slot_id) >= pool.n_slots:
        raise APIError(404, f"no slot {slot_id!r}: this server has slots 0..{pool.n_slots - 1}")
    slot = int(slot_id)
    path = None
    if action != "erase":
        folder = state.settings.slot_save_path
        if not folder:
            raise APIError(501, "slot save and restore are off: start the server with --slot-save-path DIR")
        name = parse_body(await request.body(), SlotFileRequest).filename
        path = slot_file(Path(folder), name)
        if action == "restore" and not path.is_file():
            raise APIError(404, f"no saved slot file {name!r}", param="filename")
    backend = state.require_backend()
    if not pool.take(slot):
        raise APIError(503, f"slot {slot} is busy; retry when it is idle", headers={"Retry-After": "1"})
    try:
        return await run_in_threadpool(backend.slot_action, slot, action, path)
    finally:
        pool.release(slot)


@router.get("/metrics")
async def metrics(request: Request) -> Any:
    state = _state(request)
    pool = state.runner.slots
    text = state.metrics.render(processing=pool.busy, deferred=pool.waiting, n_slots=pool.n_slots,
                                n_ctx=state.n_ctx_slot() * state.settings.n_parallel)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def _backend_call(request: Request, schema: Any, method: str) -> Any:
    """Parse the body as `schema` and run the loaded backend's `method` on it off the event loop."""
    state = _state(request)
    req = parse_body(await request.body(), schema)
    return await run_in_threadpool(getattr(state.require_backend(), method), req)


@router.post("/tokenize")
async def tokenize(request: Request) -> Any:
    state = _state(request)
    req = parse_body(await request.body(), TokenizeRequest)
    backend = state.require_backend()
    body = await run_in_threadpool(backend.tokenize, req)
    if req.prompt is not None:  # asked as vLLM asks: vLLM's fields too
        body.update(count=len(body["tokens"]), max_model_len=backend.n_ctx)
    return body


@router.post("/detokenize")
async def detokenize(request: Request) -> Any:
    return await _backend_call(request, DetokenizeRequest, "detokenize")


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> Any:
    return await run_in_threadpool(_state(request).require_backend().tokenizer_info)


@router.post("/apply-template")
async def apply_template(request: Request) -> Any:
    return await _backend_call(request, ApplyTemplateRequest, "apply_template")


@router.post("/_clover/shutdown")
async def shutdown(request: Request) -> Any:
    """Stop this server cleanly (used by `clover stop`; the token is in the user's state file)."""
    state = _state(request)
    token = state.settings.shutdown_token
    given = request.headers.get("x-clover-shutdown-token", "")
    if not token or state.request_exit is None:
        raise APIError(404, "File Not Found")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise APIError(403, "wrong shutdown token")
    state.request_exit()  # the server drains: see CloverServer.shutdown
    return JSONResponse({"status": "stopping"}, status_code=202)
