"""The one generation path behind every API shape that is not OpenAI chat itself.

Anthropic Messages, OpenAI Responses, Ollama and llama-server's `/completion` each turn their request
into a `ChatRequest` (or a `CompletionRequest`) and run it here, through the same backend job, queue,
slots, prompt cache, timeout and metrics as `/v1/chat/completions`; only the answer's shape differs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from clover_runtime.text.reply import Reply
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from .errors import bad_request, validation_message
from .generation import PING, Failed, Generation
from .openai_api import _collect, _failure, _start, _unfinished
from .schemas import ChatRequest, CompletionRequest
from .state import ServerState


@dataclass
class Running:
    """A started generation, with the prompt's length in tokens (known before the first event)."""

    state: ServerState
    gen: Generation
    n_prompt: int


def state_of(request: Request) -> ServerState:
    return request.app.state.clover


def as_request(body: dict[str, Any], model: type[ChatRequest] | type[CompletionRequest]) -> Any:
    """A translated body validated as our OpenAI request; what still fails is the client's 400."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, field = validation_message(list(exc.errors(include_url=False)))
        raise bad_request(message, field) from None


async def start(request: Request, req: ChatRequest | CompletionRequest) -> Running:
    """Check the request against the model (400s), wait for a slot (503) and start generating."""
    state = state_of(request)
    backend = state.require_backend()
    make = backend.chat_job if isinstance(req, ChatRequest) else backend.completion_job
    job = await run_in_threadpool(make, req)
    gen = await _start(request, state, job)
    return Running(state, gen, job.n_prompt)


async def reply(request: Request, run: Running) -> Reply:
    """The whole reply for a non-streaming answer (a disconnect cancels it; failures are APIErrors)."""
    return await _collect(request, run.state, run.gen)


async def events(run: Running) -> AsyncIterator[Any]:
    """The reply events of a streamed answer, and `PING` when the model is silent for the server's
    ping interval. A worker failure or the timeout is raised as the APIError to send; the usage is
    recorded at the end; a consumer that stops early (client gone) cancels the generation."""
    state, gen = run.state, run.gen
    result = Reply()
    try:
        async for event in gen.events(state.settings.sse_ping_s or None):
            if isinstance(event, Failed):
                state.metrics.count("requests_errors_total")
                raise _failure(event.exc)
            if event is not PING:
                result.add(event)
            yield event
        error = _unfinished(state, gen, result)  # timed out, cut by shutdown, or never finished
        if error is not None:
            raise error
        state.metrics.record(result.usage, result.timings)
    finally:
        if not gen.finished.is_set() and not gen.cut_by_shutdown:
            gen.cancel()
            state.metrics.count("requests_cancelled_total")


def drop_none(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def dump(model: BaseModel | None) -> Any:
    return None if model is None else model.model_dump(exclude_none=True)
