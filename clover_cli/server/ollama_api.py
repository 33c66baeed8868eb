"""The Ollama API (`/api/*`) for Ollama-only apps (the `ollama` client, Open WebUI, Continue).

Chat and generate requests become our chat (or raw completion) request and run through the shared
generation path; replies stream as NDJSON lines, Ollama's format, and streaming is the default as in
Ollama. Every model name (`name`, `name:tag`, `name:latest`) means the one loaded model. `format`
("json" or a JSON schema) goes through the constrained decoder, as `response_format` does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any, Literal

from clover_runtime.text.reply import ContentDelta, ReasoningDelta, Reply
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from . import relay
from .errors import APIError, bad_request
from .generation import PING
from .schemas import ChatRequest, CompletionRequest, _Model, parse_body
from .sse import EventStreamResponse, ndjson_line
from .state import ServerState

router = APIRouter()
OLLAMA_VERSION = "0.12.0"  # the Ollama API level these routes follow (clients gate features on it)
NDJSON = "application/x-ndjson"


class Options(_Model):
    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    num_predict: int | None = None
    num_ctx: int | None = Field(default=None, ge=1)  # accepted; the context is the server's -c
    seed: int | None = None
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stop: list[str] | None = None
    repeat_penalty: float | None = Field(default=None, ge=1e-3, le=100.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)


class OllamaToolCall(_Model):
    function: dict[str, Any]


class OllamaMessage(_Model):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None


class _Base(_Model):
    model: str = Field(min_length=1)
    stream: bool | None = True  # Ollama streams unless told not to
    think: bool | Literal["low", "medium", "high"] | None = None
    format: str | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: Any = None


class OllamaChat(_Base):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class OllamaGenerate(_Base):
    prompt: str | None = ""
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    images: list[Any] | None = None


class ModelName(_Model):
    model: str | None = None
    name: str | None = None  # older clients' field


def ollama_name(model_id: str) -> str:
    """The served model as Ollama lists it: always with a tag (`demo` is `demo:latest`)."""
    return model_id if ":" in model_id.rsplit("/", 1)[-1] else f"{model_id}:latest"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _sampling(req: _Base) -> dict[str, Any]:
    o = req.options or Options()
    limit = o.num_predict if o.num_predict is not None and o.num_predict >= 0 else None  # -1, -2: no limit
    return relay.drop_none(
        max_tokens=limit or None, temperature=o.temperature, seed=o.seed, top_k=o.top_k, top_p=o.top_p,
        min_p=o.min_p, stop=o.stop or None, repetition_penalty=o.repeat_penalty,
        presence_penalty=o.presence_penalty, frequency_penalty=o.frequency_penalty, think=req.think,
        response_format=_response_format(req.format))


def _response_format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """Ollama's `format` as OpenAI's `response_format`: "json" any JSON object, a dict its schema."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt, "strict": True}}
    raise bad_request(f'format: {fmt!r} is neither "json" nor a JSON schema', "format")


def _messages(req: OllamaChat) -> list[dict[str, Any]]:
    out = []
    for i, msg in enumerate(req.messages):
        if msg.images:
            raise bad_request(f"messages.{i}.images: images are not supported by this model (text only)",
                              f"messages.{i}.images")
        item: dict[str, Any] = relay.drop_none(role=msg.role, content=msg.content or "",
                                               reasoning_content=msg.thinking or None, name=msg.tool_name)
        if msg.tool_calls:
            item["tool_calls"] = [{"type": "function", "function": {
                "name": c.function.get("name"), "arguments": c.function.get("arguments") or {}}}
                for c in msg.tool_calls]
        out.append(item)
    return out


def _stats(reply: Reply) -> dict[str, Any]:
    """Ollama's counters (durations in nanoseconds) from the reply's usage and timings."""
    t, u = reply.timings, reply.usage
    prompt_ns, eval_ns = int(t.prompt_ms * 1e6), int(t.predicted_ms * 1e6)
    return {"done_reason": "length" if reply.finish_reason == "length" else "stop",
            "total_duration": prompt_ns + eval_ns, "load_duration": 0,
            "prompt_eval_count": u.prompt_tokens, "prompt_eval_duration": prompt_ns,
            "eval_count": u.completion_tokens, "eval_duration": eval_ns}


def _calls(reply: Reply) -> list[dict[str, Any]]:
    calls = []
    for call in reply.calls:
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            args = {}
        calls.append({"function": {"name": call.name, "arguments": args if isinstance(args, dict) else {}}})
    return calls


def _chat_message(reply: Reply) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning:
        msg["thinking"] = reply.reasoning
    if reply.calls:
        msg["tool_calls"] = _calls(reply)
    return msg


def _loaded(model: str, chat: bool) -> dict[str, Any]:
    """Ollama's answer to a request with nothing to generate: the model is loaded (clients preload so)."""
    body: dict[str, Any] = {"model": model, "created_at": _now(), "done": True, "done_reason": "load"}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return body


async def _stream(run: relay.Running, model: str, chat: bool) -> AsyncIterator[str]:
    reply = Reply()

    def line(content: str = "", thinking: str | None = None, **extra: Any) -> str:
        if chat:
            msg = relay.drop_none(role="assistant", content=content, thinking=thinking, **extra)
            return ndjson_line({"model": model, "created_at": _now(), "message": msg, "done": False})
        return ndjson_line(relay.drop_none(model=model, created_at=_now(), response=content, thinking=thinking,
                                           done=False))

    try:
        async for event in relay.events(run):
            if event is PING:
                continue
            reply.add(event)
            if isinstance(event, ContentDelta) and event.text:
                yield line(event.text)
            elif isinstance(event, ReasoningDelta) and event.text:
                yield line(thinking=event.text)
    except APIError as exc:
        yield ndjson_line({"error": exc.message})
        return
    if reply.calls:  # Ollama sends each call whole, once its arguments are complete
        yield line(tool_calls=_calls(reply))
    last: dict[str, Any] = {"model": model, "created_at": _now()}
    last.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    yield ndjson_line({**last, "done": True, **_stats(reply)})


async def _answer(request: Request, req: _Base, body: ChatRequest | CompletionRequest, chat: bool) -> Any:
    run = await relay.start(request, body)
    if req.stream is not False:
        return EventStreamResponse(_stream(run, req.model, chat), media_type=NDJSON)
    reply = await relay.reply(request, run)
    out: dict[str, Any] = {"model": req.model, "created_at": _now()}
    if chat:
        out["message"] = _chat_message(reply)
    else:
        out["response"] = reply.content
        if reply.reasoning:
            out["thinking"] = reply.reasoning
    return JSONResponse({**out, "done": True, **_stats(reply)})


@router.post("/api/chat")
async def chat(request: Request) -> Any:
    req = parse_body(await request.body(), OllamaChat)
    if not req.messages:
        return _loaded(req.model, chat=True)
    body = relay.as_request({"messages": _messages(req), "tools": req.tools or None, **_sampling(req)},
                            ChatRequest)
    return await _answer(request, req, body, chat=True)


@router.post("/api/generate")
async def generate(request: Request) -> Any:
    req = parse_body(await request.body(), OllamaGenerate)
    if req.images:
        raise bad_request("images: images are not supported by this model (text only)", "images")
    if req.suffix:
        raise APIError(501, "suffix: fill-in-the-middle is not supported by this model", param="suffix")
    if not req.prompt:
        return _loaded(req.model, chat=False)
    sampling = _sampling(req)
    if req.raw:  # the prompt as it is: no template, no reasoning or tool parsing
        sampling = {k: v for k, v in sampling.items() if k not in ("think", "response_format")}
        if isinstance(req.format, dict):  # llama-server's field on completions
            sampling["json_schema"] = req.format
        return await _answer(request, req, relay.as_request({"prompt": req.prompt, **sampling}, CompletionRequest),
                             chat=False)
    messages = ([{"role": "system", "content": req.system}] if req.system else []) + [
        {"role": "user", "content": req.prompt}]
    return await _answer(request, req, relay.as_request({"messages": messages, **sampling}, ChatRequest), chat=False)


def _details(state: ServerState) -> dict[str, Any]:
    backend = state.backend
    meta = backend.meta() if backend is not None else {}
    n_params = int(meta.get("n_params") or 0)
    size = f"{n_params / 1e9:.1f}B" if n_params >= 1e8 else f"{n_params / 1e6:.1f}M"
    quant = None
    if backend is not None:
        from clover_runtime.model_summary import _file_type_name

        quant = _file_type_name(backend.model.file.metadata.get("general.file_type"))
    return {"parent_model": "", "format": "gguf", "family": "clover", "families": ["clover"],
            "parameter_size": size, "quantization_level": quant or "unknown"}


def _entry(state: ServerState) -> dict[str, Any]:
    name = ollama_name(state.settings.model_id)
    backend = state.backend
    size = int(backend.meta()["size"]) if backend is not None else 0
    modified = datetime.fromtimestamp(state.created, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"name": name, "model": name, "modified_at": modified, "size": size,
            "digest": hashlib.sha256(f"{state.settings.model_path}:{name}".encode()).hexdigest(),
            "details": _details(state)}


@router.get("/api/tags")
async def tags(request: Request) -> Any:
    return {"models": [_entry(relay.state_of(request))]}


@router.get("/api/ps")
async def ps(request: Request) -> Any:
    state = relay.state_of(request)
    if state.backend is None:
        return {"models": []}
    entry = _entry(state)
    del entry["modified_at"]
    return {"models": [{**entry, "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0,
                        "context_length": state.backend.n_ctx}]}


@router.get("/api/version")
async def version() -> Any:
    return {"version": OLLAMA_VERSION}


@router.post("/api/show")
async def show(request: Request) -> Any:
    state = relay.state_of(request)
    req = parse_body(await request.body(), ModelName)
    if not (req.model or req.name):
        raise bad_request("model: required", "model")
    backend = state.require_backend()
    meta = backend.meta()
    template = backend.chat_template_text() or ""
    capabilities = ["completion"] + (["tools"] if backend.template.supports_tools else []) + (
        ["thinking"] if "<think>" in template else [])
    sampling = backend.default_sampling()
    parameters = "\n".join(f"{k:<15} {v}" for k, v in (("temperature", sampling.temperature),
                                                        ("top_k", sampling.top_k), ("top_p", sampling.top_p))
                           if v is not None)
    return {"license": "", "modelfile": f"FROM {state.settings.model_path or state.settings.model_id}\n",
            "parameters": parameters, "template": template, "details": _details(state),
            "model_info": {"general.architecture": "clover", "general.parameter_count": meta["n_params"],
                           "clover.context_length": meta["n_ctx"], "clover.embedding_length": meta["n_embd"]},
            "capabilities": capabilities, "modified_at": _entry(state)["modified_at"]}


@router.post("/api/embed")
@router.post("/api/embeddings")
async def embed() -> Any:
    raise APIError(501, "embeddings are not supported by this server (Clover models are generative)")


@router.post("/api/pull")
@router.post("/api/push")
@router.post("/api/create")
@router.post("/api/copy")
@router.delete("/api/delete")
async def manage(request: Request) -> Any:
    raise APIError(501, f"{request.url.path}: models are managed with the clover CLI (clover pull, clover rm); "
                        "this server serves the one model it was started with")
