"""The OpenAI-compatible routes: chat completions, completions, models, embeddings (501)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from clover_runtime.text.reply import (
    ContentDelta,
    Logprobs,
    Progress,
    ReasoningDelta,
    Reply,
    ToolCallArgs,
    ToolCallStart,
)
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from .errors import APIError, context_exceeded, template_error
from .generation import PING, Failed, Generation, shutting_down_error
from .logprobs import Words, text_length
from .schemas import ChatRequest, CompletionRequest, parse_body
from .shapes import Envelope, new_id, tool_call_chunk
from .sse import DONE_FRAME, PING_FRAME, EventStreamResponse, frame
from .state import ServerState

log = logging.getLogger("clover.server")
router = APIRouter()


def _state(request: Request) -> ServerState:
    return request.app.state.clover


def _failure(exc: BaseException) -> APIError:
    """A worker-thread exception as the error the client gets (never a traceback)."""
    from clover_runtime.errors import CloverError, ContextLengthError, TemplateError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthError):
        return context_exceeded(exc.n_tokens, exc.n_ctx)
    if isinstance(exc, TemplateError):
        return template_error(exc)
    if isinstance(exc, CloverError):
        return APIError(500, exc.message)
    log.error("generation failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return APIError(500, f"internal error during generation: {type(exc).__name__}")


def _timeout_error(state: ServerState) -> APIError:
    return APIError(504, f"generation timed out after {state.settings.timeout_s:g} s (-to/--timeout)")


def _unfinished(state: ServerState, gen: Generation, result: Reply) -> APIError | None:
    """Why a reply did not really finish (None when it did): `stop`, `length` and `tool_calls` are
    reported only when true, never for a reply that was cut."""
    if result.finish_reason not in (None, "cancelled"):
        return None
    state.metrics.count("requests_errors_total")
    if gen.timed_out:
        return _timeout_error(state)
    if gen.cut_by_shutdown or state.runner.stopping:
        return shutting_down_error(cut=True)
    log.error("a generation ended without finishing its reply (%s)", result.finish_reason or "no end event")
    return APIError(500, "internal error: the generation stopped before the reply was finished")


async def _start(request: Request, state: ServerState, job: Any) -> Generation:
    """A running generation for `job`; a client that leaves while waiting for a slot leaves the line."""
    state.metrics.count("requests_total")
    starting = asyncio.ensure_future(state.runner.start(job, state.settings.timeout_s))
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({starting, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not starting.done():
            starting.cancel()
    (outcome,) = await asyncio.gather(starting, return_exceptions=True)
    if isinstance(outcome, Generation):
        return outcome
    if isinstance(outcome, asyncio.CancelledError):
        state.metrics.count("requests_cancelled_total")
        raise APIError(499, "client closed the request")
    if isinstance(outcome, APIError) and outcome.status == 503:
        state.metrics.count("requests_rejected_total")
    raise outcome


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(request: Request, state: ServerState, gen: Generation) -> Reply:
    """Run a generation to its end for a non-streaming answer; a disconnect cancels it."""
    result = Reply()
    failure: BaseException | None = None

    async def consume() -> None:
        nonlocal failure
        async for event in gen.events():
            if isinstance(event, Failed):
                failure = event.exc
            else:
                result.add(event)

    watcher = asyncio.ensure_future(_until_disconnect(request))
    consumer = asyncio.ensure_future(consume())
    left = False
    try:
        await asyncio.wait({watcher, consumer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not consumer.done():  # the client left (or this task was cancelled): nobody reads the reply
            left = True
            gen.cancel()
            state.metrics.count("requests_cancelled_total")
            consumer.cancel()
        watcher.cancel()
    if left:
        raise APIError(499, "client closed the request")
    if failure is not None:
        state.metrics.count("requests_errors_total")
        raise _failure(failure)
    error = _unfinished(state, gen, result)
    if error is not None:
        raise error
    state.metrics.record(result.usage, result.timings)
    return result


def _envelope(state: ServerState, prefix: str) -> Envelope:
    return Envelope(id=new_id(prefix), model=state.settings.model_id, fingerprint=state.settings.build)


class _Pending:
    """Token scores waiting for the next chunk that carries text (they arrive just before it)."""

    def __init__(self, words: Words, wanted: bool) -> None:
        self.words = words
        self.wanted = wanted
        self.scores: list[Any] = []

    def add(self, event: Logprobs) -> None:
        if self.wanted:
            self.scores.extend(event.tokens)

    def take(self) -> list[Any]:
        out, self.scores = self.scores, []
        return out

    def chat(self) -> dict[str, Any] | None:
        scores = self.take()
        return self.words.chat(scores) if scores else None


async def _chat_stream(state: ServerState, gen: Generation, req: ChatRequest,
                       env: Envelope) -> AsyncIterator[str]:
    result = Reply()
    ping = state.settings.sse_ping_s or None
    pending = _Pending(Words(state.backend.tokenizer), req.logprob_count() is not None)
    try:
        yield frame(env.chat_chunk({"role": "assistant", "content": None}))
        async for event in gen.events(ping):
            if event is PING:
                yield PING_FRAME
                continue
            if isinstance(event, Failed):
                state.metrics.count("requests_errors_total")
                yield frame(state.public(_failure(event.exc)).body())
                return
            result.add(event)
            if isinstance(event, Logprobs):
                pending.add(event)
            elif isinstance(event, ContentDelta) and event.text:
                yield frame(env.chat_chunk({"content": event.text}, logprobs=pending.chat()))
            elif isinstance(event, ReasoningDelta) and event.text:
                yield frame(env.chat_chunk({"reasoning_content": event.text}, logprobs=pending.chat()))
            elif isinstance(event, (ToolCallStart, ToolCallArgs)):
                yield frame(env.chat_chunk({"tool_calls": [tool_call_chunk(event)]}))
            elif isinstance(event, Progress) and req.return_progress:
                yield frame(env.chat_chunk({}, diffusion_progress=state.backend.progress_body(event)))
        error = _unfinished(state, gen, result)
        if error is not None:
            yield frame(error.body())
            return
        if pending.scores:
            yield frame(env.chat_chunk({}, logprobs=pending.chat()))
        state.metrics.record(result.usage, result.timings)
        last = env.chat_chunk({}, result.finish_reason)
        if req.include_usage:
            yield frame(last)
            yield frame(env.usage_chunk("chat.completion.chunk", result.usage, result.timings))
        else:
            last["timings"] = env.usage_chunk("", result.usage, result.timings)["timings"]
            yield frame(last)
        yield DONE_FRAME
    finally:
        if not gen.finished.is_set() and not gen.cut_by_shutdown:
            gen.cancel()
            state.metrics.count("requests_cancelled_total")


def _text_chunk(env: Envelope, req: CompletionRequest, words: Words, text: str, scores: list[Any],
                offset: int) -> dict[str, Any]:
    """One streamed completion chunk with its tokens' scores in the shapes the request asked for."""
    body = env.text(text, None, chunk=True,
                    logprobs=words.completion(scores, offset) if req.logprobs is not None else None)
    if req.n_probs is not None:
        body["completion_probabilities"] = words.llama(scores)
    return body


async def _completion_stream(state: ServerState, gen: Generation, req: CompletionRequest,
                             env: Envelope) -> AsyncIterator[str]:
    result = Reply()
    ping = state.settings.sse_ping_s or None
    words = Words(state.backend.tokenizer)
    pending = _Pending(words, req.logprob_count() is not None)
    offset = 0
    try:
        if req.echo and req.logprob_count() is None:  # scored prompts are echoed with their scores
            yield frame(env.text(str(req.prompt), None, chunk=True))
            offset = len(str(req.prompt))
        async for event in gen.events(ping):
            if event is PING:
                yield PING_FRAME
                continue
            if isinstance(event, Failed):
                state.metrics.count("requests_errors_total")
                yield frame(state.public(_failure(event.exc)).body())
                return
            result.add(event)
            if isinstance(event, Logprobs) and event.prompt:
                yield frame(_text_chunk(env, req, words, req.prompt, list(event.tokens), 0))
                offset = len(req.prompt)
            elif isinstance(event, Logprobs):
                pending.add(event)
            elif isinstance(event, ContentDelta) and event.text:
                scores = pending.take()
                yield frame(_text_chunk(env, req, words, event.text, scores, offset))
                offset += text_length(words.tokenizer, scores)
        if pending.scores:
            yield frame(_text_chunk(env, req, words, "", pending.take(), offset))
        error = _unfinished(state, gen, result)
        if error is not None:
            yield frame(error.body())
            return
        state.metrics.record(result.usage, result.timings)
        reason = result.finish_reason
        if req.include_usage:
            yield frame(env.text("", reason, chunk=True))
            usage = env.usage_chunk("text_completion", result.usage, result.timings)
            yield frame(usage)
        else:
            yield frame(env.text("", reason, None, result.timings, chunk=True))
        yield DONE_FRAME
    finally:
        if not gen.finished.is_set() and not gen.cut_by_shutdown:
            gen.cancel()
            state.metrics.count("requests_cancelled_total")


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def chat_completions(request: Request) -> Any:
    state = _state(request)
    req = parse_body(await request.body(), ChatRequest)
    if req.n > 1:
        from .llama_api import chat_choices

        return await chat_choices(request, req)
    backend = state.require_backend()
    job = await run_in_threadpool(backend.chat_job, req)
    gen = await _start(request, state, job)
    env = _envelope(state, "chatcmpl-")
    if req.stream:
        return EventStreamResponse(_chat_stream(state, gen, req, env))
    result = await _collect(request, state, gen)
    scores = Words(backend.tokenizer).chat(result.logprobs) if req.logprob_count() is not None else None
    return JSONResponse(env.chat(result, scores))


@router.post("/v1/completions")
@router.post("/completions")
async def completions(request: Request) -> Any:
    state = _state(request)
    req = parse_body(await request.body(), CompletionRequest)
    if req.n > 1 or len(req.prompts) > 1:
        from .llama_api import completion_choices

        return await completion_choices(request, req)
    backend = state.require_backend()
    job = await run_in_threadpool(backend.completion_job, req)
    gen = await _start(request, state, job)
    env = _envelope(state, "cmpl-")
    if req.stream:
        return EventStreamResponse(_completion_stream(state, gen, req, env))
    result = await _collect(request, state, gen)
    text = result.content
    if req.echo:
        text = req.prompt + text
    words = Words(backend.tokenizer)
    body = env.text(text, result.finish_reason, result.usage, result.timings,
                    logprobs=words.completion_reply(result, req.prompt if req.echo else None)
                    if req.logprobs is not None else None)
    if req.n_probs is not None:
        body["completion_probabilities"] = words.llama(result.prompt_logprobs + result.logprobs)
    return JSONResponse(body)


@router.get("/v1/models")
@router.get("/models")
async def models(request: Request) -> Any:
    state = _state(request)
    backend = state.backend
    meta = backend.meta() if backend is not None else None
    # max_model_len (vLLM's name): the context one request can use, so agent clients size prompts by it
    max_len = state.n_ctx_slot()
    return {"object": "list", "data": [{"id": state.settings.model_id, "object": "model",
                                        "created": state.created, "owned_by": "clover",
                                        "max_model_len": max_len, "meta": meta}]}


@router.post("/v1/embeddings")
@router.post("/embeddings")
async def embeddings(_: Request) -> Any:
    raise APIError(501, "embeddings are not supported by this server (Clover models are generative)")
