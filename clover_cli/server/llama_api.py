"""llama-server's remaining routes and request forms: `POST /completion` in its native shape,
`GET /v1/models/{id}`, and several choices (`n > 1`, a list of prompts) on the OpenAI routes.

Several choices are generated one after another through the shared path, each as its own request
(a sampled one with the seed plus its index, so the choices differ but a seed still reproduces them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from clover_runtime.text.reply import ContentDelta, Reply, Usage
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from . import relay
from .errors import APIError, bad_request
from .generation import PING
from .logprobs import Words
from .schemas import ChatRequest, CompletionRequest, parse_body
from .shapes import Envelope, chat_message, new_id, timings_body, usage_body
from .sse import PING_FRAME, EventStreamResponse, frame

router = APIRouter()


def _nth(req: Any, i: int, **update: Any) -> Any:
    """The request for choice i: n=1, and the seed moved by i when one was given."""
    seed = None if req.seed is None or req.seed < 0 else req.seed + i
    return req.model_copy(update={"n": 1, "stream": False, "seed": seed, **update})


def _envelope(request: Request, prefix: str) -> Envelope:
    settings = relay.state_of(request).settings
    return Envelope(id=new_id(prefix), model=settings.model_id, fingerprint=settings.build)


def _words(request: Request) -> Words:
    return Words(relay.state_of(request).require_backend().tokenizer)


def _usage(replies: list[Reply], prompts: list[Reply]) -> Usage:
    """Prompt tokens once per prompt (OpenAI's count for n > 1), completion tokens of every choice."""
    return Usage(sum(r.usage.prompt_tokens for r in prompts), sum(r.usage.completion_tokens for r in replies),
                 sum(r.usage.cached_tokens for r in prompts))


async def chat_choices(request: Request, req: ChatRequest) -> Any:
    """`n` chat choices, generated one after another."""
    if req.stream:
        raise bad_request("n: several choices are not streamed; send stream: false or n: 1", "n")
    replies = [await relay.reply(request, await relay.start(request, _nth(req, i))) for i in range(req.n)]
    env = _envelope(request, "chatcmpl-")
    body = env.chat(replies[0])
    words = _words(request)
    body["choices"] = [{"index": i, "message": chat_message(r),
                        "logprobs": words.chat(r.logprobs) if req.logprob_count() is not None else None,
                        "finish_reason": r.finish_reason} for i, r in enumerate(replies)]
    body["usage"] = usage_body(_usage(replies, replies[:1]))
    return JSONResponse(body)


async def completion_choices(request: Request, req: CompletionRequest) -> Any:
    """`n` completions of each prompt: choice `p * n + i` is prompt p's i-th."""
    if req.stream:
        raise bad_request("several prompts or n > 1 are not streamed; send stream: false", "stream")
    prompts = req.prompts
    if len(prompts) * req.n > 16:
        raise bad_request("at most 16 choices (prompts x n) in one request", "n")
    replies, texts, echoed = [], [], []
    for p, prompt in enumerate(prompts):
        for i in range(req.n):
            one = _nth(req, p * req.n + i, prompt=prompt)
            run = await relay.start(request, one)  # the backend turns the prompt into text (echo uses it)
            replies.append(await relay.reply(request, run))
            echoed.append(one.prompt if req.echo else None)
            texts.append((echoed[-1] or "") + replies[-1].content)
    env = _envelope(request, "cmpl-")
    body = env.text(texts[0], replies[0].finish_reason, Usage(), replies[0].timings)
    words = _words(request)
    body["choices"] = [{"index": k, "text": t,
                        "logprobs": words.completion_reply(r, e) if req.logprobs is not None else None,
                        "finish_reason": r.finish_reason}
                       for k, (t, r, e) in enumerate(zip(texts, replies, echoed, strict=True))]
    body["usage"] = usage_body(_usage(replies, replies[::req.n]))
    return JSONResponse(body)


def _stop_type(reply: Reply) -> str:
    if reply.finish_reason == "length":
        return "limit"
    return "word" if reply.stop_word is not None else "eos"


def _native(reply: Reply, model: str, prompt: str) -> dict[str, Any]:
    """A finished /completion in llama-server's shape."""
    usage = reply.usage
    return {"index": 0, "content": reply.content, "tokens": [], "id_slot": -1, "stop": True, "model": model,
            "tokens_predicted": usage.completion_tokens, "tokens_evaluated": usage.prompt_tokens, "prompt": prompt,
            "has_new_line": "\n" in reply.content, "truncated": False, "stop_type": _stop_type(reply),
            "stopping_word": reply.stop_word or "", "tokens_cached": usage.cached_tokens,
            "timings": timings_body(reply.timings)}


async def _native_stream(run: relay.Running, model: str, prompt: str) -> AsyncIterator[str]:
    reply = Reply()
    try:
        async for event in relay.events(run):
            if event is PING:
                yield PING_FRAME
                continue
            reply.add(event)
            if isinstance(event, ContentDelta) and event.text:
                yield frame({"index": 0, "content": event.text, "tokens": [], "stop": False, "id_slot": -1,
                             "tokens_predicted": 0, "tokens_evaluated": run.n_prompt})
    except APIError as exc:
        yield frame(exc.body())
        return
    yield frame({**_native(reply, model, prompt), "content": ""})  # llama-server sends no [DONE] here


@router.post("/completion")
async def completion(request: Request) -> Any:
    """llama-server's native completion: `prompt`, `n_predict`, `stream`; answers `content`, `stop`,
    `tokens_predicted`, `stop_type`, `timings`..."""
    req = parse_body(await request.body(), CompletionRequest)
    if len(req.prompts) > 1:
        raise bad_request("prompt: /completion takes one prompt; send several to /v1/completions", "prompt")
    run = await relay.start(request, req)
    model = run.state.settings.model_id
    if req.stream:
        return EventStreamResponse(_native_stream(run, model, str(req.prompt)))
    return JSONResponse(_native(await relay.reply(request, run), model, str(req.prompt)))


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}")
async def model(request: Request, model_id: str) -> Any:
    """One model by id (OpenAI's retrieve); an id this server does not serve is a 404."""
    state = relay.state_of(request)
    if model_id != state.settings.model_id:
        raise APIError(404, f"The model '{model_id}' does not exist; this server serves "
                            f"'{state.settings.model_id}'", param="model")
    backend = state.backend
    return {"id": model_id, "object": "model", "created": state.created, "owned_by": "clover",
            "max_model_len": state.n_ctx_slot(),
            "meta": backend.meta() if backend is not None else None}
