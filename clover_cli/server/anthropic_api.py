"""Anthropic's Messages API: `POST /v1/messages` (streamed or not) and `/v1/messages/count_tokens`.

Requests are translated into OpenAI chat requests (system, content blocks, tool_use / tool_result,
tools, thinking) and run through the shared generation path; the reply comes back as Anthropic's
content blocks (thinking, text, tool_use) and, streamed, as its exact event sequence. Thinking
follows Anthropic's default: off unless the request enables it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from clover_runtime.text.reply import ContentDelta, ReasoningDelta, Reply, ToolCallArgs, ToolCallStart
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from . import relay
from .errors import APIError, anthropic_body, bad_request
from .generation import PING
from .schemas import ChatRequest, _Model, parse_body
from .shapes import new_id
from .sse import EventStreamResponse, event_frame

router = APIRouter()
UNSUPPORTED_BLOCKS = ("image", "document", "search_result", "container_upload")


class AnthropicTool(_Model):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" (or absent); server tools (web_search_..., bash_...) are refused


class AnthropicToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Model):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class AnthropicMessage(_Model):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Model):
    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # required by Anthropic: a missing one is a 400
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool | None = False


def _text_of(blocks: Any, where: str) -> str:
    """Text blocks (or a string) as one text; anything but text is a 400 naming the block."""
    if isinstance(blocks, str):
        return blocks
    texts = []
    for j, block in enumerate(blocks or []):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            what = f"{kind} content is not supported by this model (text only)" if kind in UNSUPPORTED_BLOCKS \
                else "expected a text block"
            raise bad_request(f"{where}.{j}: {what}", f"{where}.{j}")
        texts.append(block["text"])
    return "\n\n".join(texts)


def _user_turns(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user message's blocks: each tool_result becomes a tool message, the text one user message."""
    out: list[dict[str, Any]] = []
    texts = []
    for j, block in enumerate(blocks):
        kind, field = block.get("type"), f"{where}.{j}"
        if kind == "text":
            texts.append(_text_of([block], where))
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad_request(f"{field}.tool_use_id: required (the id of the tool_use it answers)",
                                  f"{field}.tool_use_id")
            text = _text_of(block.get("content") or "", f"{field}.content")
            if block.get("is_error"):
                text = f"Error: {text}"
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind in UNSUPPORTED_BLOCKS:
            raise bad_request(f"{field}: {kind} content is not supported by this model (text only)", field)
        else:
            raise bad_request(f"{field}.type: {kind!r} is not a block a user message can hold", f"{field}.type")
    if texts:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _assistant_turn(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """An assistant message's blocks: text as content, thinking as reasoning, tool_use as calls."""
    texts, thoughts, calls = [], [], []
    for j, block in enumerate(blocks):
        kind, field = block.get("type"), f"{where}.{j}"
        if kind == "text":
            texts.append(_text_of([block], where))
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking") or ""))
        elif kind == "redacted_thinking":
            continue  # encrypted by another server: nothing this model can read
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise bad_request(f"{field}: a tool_use block needs a name and an input object", field)
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input") or {}}})
        else:
            raise bad_request(f"{field}.type: {kind!r} is not a block an assistant message can hold",
                              f"{field}.type")
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        turn["reasoning_content"] = "\n".join(thoughts)
    if calls:
        turn["tool_calls"] = calls
    return turn


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _text_of(req.system, "system")})
    for i, msg in enumerate(req.messages):
        blocks = [{"type": "text", "text": msg.content}] if isinstance(msg.content, str) else msg.content
        where = f"messages.{i}.content"
        out.extend(_user_turns(blocks, where) if msg.role == "user" else [_assistant_turn(blocks, where)])
    return out


def _tools(req: CountTokensRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.type not in (None, "custom") or tool.input_schema is None:
            raise bad_request(f"tools.{i}: server tool {tool.type or tool.name!r} is not available here; "
                              "define a custom tool with an input_schema", f"tools.{i}")
        tools.append({"type": "function", "function": relay.drop_none(
            name=tool.name, description=tool.description, parameters=tool.input_schema)})
    return tools


def _tool_choice(choice: AnthropicToolChoice | None) -> Any:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise bad_request("tool_choice.name: required when type is 'tool'", "tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def chat_request(req: CountTokensRequest) -> ChatRequest:
    """The Messages request as an OpenAI chat request (what the shared generation path runs)."""
    thinking = req.thinking.type if req.thinking else "disabled"
    body: dict[str, Any] = {
        "messages": chat_messages(req), "tools": _tools(req), "tool_choice": _tool_choice(req.tool_choice),
        "chat_template_kwargs": {"enable_thinking": thinking != "disabled"},
    }
    if req.thinking and req.thinking.type == "enabled" and req.thinking.budget_tokens is not None:
        body["thinking_budget"] = req.thinking.budget_tokens
    if isinstance(req, MessagesRequest):
        body.update(relay.drop_none(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                                    top_k=req.top_k, stop=req.stop_sequences or None))
    return relay.as_request(relay.drop_none(**body), ChatRequest)


def tool_use_id(call_id: str) -> str:
    """Anthropic's id style for a call (the id goes back in tool_result and is matched as given)."""
    return "toolu_" + call_id.removeprefix("call_")


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(reply: Reply) -> tuple[str, str | None]:
    """Anthropic's stop_reason (and stop_sequence) for how the reply ended."""
    reason = reply.finish_reason
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if reply.stop_word is not None:
        return "stop_sequence", reply.stop_word
    return "end_turn", None


def usage(reply: Reply) -> dict[str, int]:
    """Input tokens not read from the prompt cache, the cached ones, and the output tokens."""
    u = reply.usage
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": u.cached_tokens, "output_tokens": u.completion_tokens}


def message_body(msg_id: str, model: str, reply: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.reasoning:
        content.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content:
        content.append({"type": "text", "text": reply.content})
    for call in reply.calls:
        content.append({"type": "tool_use", "id": tool_use_id(call.id), "name": call.name,
                        "input": _input(call.arguments)})
    reason, sequence = stop_reason(reply)
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(reply)}


class _Blocks:
    """The open content block of a stream: a new kind of output closes it and opens the next."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def open(self, kind: str, block: dict[str, Any]) -> list[str]:
        frames = self.close()
        self.index += 1
        self.kind = kind
        frames.append(event_frame("content_block_start", {"type": "content_block_start", "index": self.index,
                                                          "content_block": block}))
        return frames

    def delta(self, delta: dict[str, Any]) -> str:
        return event_frame("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                   "delta": delta})

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [event_frame("content_block_stop", {"type": "content_block_stop", "index": self.index})]


def _event_frames(event: Any, blocks: _Blocks) -> list[str]:
    if isinstance(event, ReasoningDelta) and event.text:
        frames = blocks.open("thinking", {"type": "thinking", "thinking": "", "signature": ""}) \
            if blocks.kind != "thinking" else []
        return [*frames, blocks.delta({"type": "thinking_delta", "thinking": event.text})]
    if isinstance(event, ContentDelta) and event.text:
        frames = blocks.open("text", {"type": "text", "text": ""}) if blocks.kind != "text" else []
        return [*frames, blocks.delta({"type": "text_delta", "text": event.text})]
    if isinstance(event, ToolCallStart):
        return blocks.open("tool_use", {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name,
                                        "input": {}})
    if isinstance(event, ToolCallArgs) and event.fragment:
        return [blocks.delta({"type": "input_json_delta", "partial_json": event.fragment})]
    return []


async def _stream(run: relay.Running, msg_id: str, model: str) -> AsyncIterator[str]:
    reply = Reply()
    start = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": run.n_prompt, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 0, "output_tokens": 0}}
    yield event_frame("message_start", {"type": "message_start", "message": start})
    blocks = _Blocks()
    try:
        async for event in relay.events(run):
            if event is PING:
                yield event_frame("ping", {"type": "ping"})
                continue
            reply.add(event)
            for chunk in _event_frames(event, blocks):
                yield chunk
    except APIError as exc:
        yield event_frame("error", anthropic_body(exc))
        return
    for chunk in blocks.close():
        yield chunk
    reason, sequence = stop_reason(reply)
    yield event_frame("message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                        "usage": usage(reply)})
    yield event_frame("message_stop", {"type": "message_stop"})


@router.post("/v1/messages")
async def messages(request: Request) -> Any:
    req = parse_body(await request.body(), MessagesRequest)
    chat = chat_request(req)
    run = await relay.start(request, chat)
    msg_id, model = new_id("msg_", 24), req.model or run.state.settings.model_id
    if req.stream:
        return EventStreamResponse(_stream(run, msg_id, model))
    return JSONResponse(message_body(msg_id, model, await relay.reply(request, run)))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Any:
    """The prompt's length in tokens as the model would see it (template, tools and all)."""
    req = parse_body(await request.body(), CountTokensRequest)
    chat = chat_request(req)
    backend = relay.state_of(request).require_backend()
    job = await run_in_threadpool(backend.chat_job, chat)
    return {"input_tokens": job.n_prompt}
