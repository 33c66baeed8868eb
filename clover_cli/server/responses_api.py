"""OpenAI's Responses API: `POST /v1/responses` (and `/responses`), stateless.

`input` (text or items: messages, function_call, function_call_output, reasoning) and `instructions`
become a chat request run through the shared generation path; the reply comes back as output items
(reasoning, message, function_call) and, streamed, as Responses' typed events. Nothing is stored, so
`previous_response_id` is a 400 that says to send the whole conversation as `input`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from clover_runtime.text.reply import ContentDelta, ReasoningDelta, Reply, ToolCallArgs, ToolCallStart
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from . import relay
from .errors import APIError, bad_request
from .generation import PING
from .schemas import ChatRequest, _Model, parse_body
from .shapes import new_id
from .sse import PING_FRAME, EventStreamResponse, event_frame

router = APIRouter()
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class ResponsesTool(_Model):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ReasoningConfig(_Model):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(_Model):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            what = f"{kind} content is not supported by this model (text only)" if kind else "expected a text part"
            raise bad_request(f"{where}.{j}: {what}", f"{where}.{j}")
        texts.append(part["text"])
    return "".join(texts)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    parts = item.get("content") or item.get("summary") or []
    return _text(parts, where)


def chat_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """Input items as chat messages: function calls join the assistant turn before them, a reasoning
    item goes with the assistant turn after it."""
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    reasoning: str | None = None

    def assistant() -> dict[str, Any]:
        nonlocal reasoning
        last = out[-1] if out else None
        if last is None or last["role"] != "assistant" or reasoning is not None:
            last = {"role": "assistant", "content": ""}
            out.append(last)
        if reasoning is not None:
            last["reasoning_content"], reasoning = reasoning, None
        return last

    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}.role: must be user, system, developer or assistant", f"{where}.role")
            text = _text(item.get("content", ""), f"{where}.content")
            if role == "assistant":
                turn = assistant()
                turn["content"] += text
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}: a function_call needs name and call_id", where)
            turn = assistant()
            turn.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": item.get("arguments") or "{}"}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}.call_id: required (the call_id of the function_call)", f"{where}.call_id")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _text(item.get("output", ""), f"{where}.output")})
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, f"{where}.content")
        elif kind == "item_reference":
            raise bad_request(f"{where}: item_reference needs stored responses; this server keeps none, so send "
                              "the items themselves", where)
        else:
            raise bad_request(f"{where}.type: {kind!r} items are not supported", f"{where}.type")
    return out


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function" or not tool.name:
            raise bad_request(f"tools.{i}: only function tools (with a name) are supported, not {tool.type!r}",
                              f"tools.{i}")
        tools.append({"type": "function", "function": relay.drop_none(
            name=tool.name, description=tool.description, parameters=tool.parameters)})
    return tools


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request("tool_choice: use auto, none, required or {\"type\": \"function\", \"name\": ...}",
                      "tool_choice")


def chat_request(req: ResponsesRequest) -> ChatRequest:
    for name in ("previous_response_id", "conversation"):
        if getattr(req, name) is not None:
            raise bad_request(f"{name}: this server is stateless and stores no responses; send the whole "
                              "conversation as input items", name)
    if req.background:
        raise bad_request("background: not supported; this server answers in the request", "background")
    fmt = (req.text or {}).get("format") or {}
    if fmt.get("type") not in (None, "text", "json_object", "json_schema"):
        raise bad_request(f"text.format: {fmt.get('type')!r} is not supported; use text, json_object or json_schema",
                          "text.format.type")
    body = relay.drop_none(
        messages=chat_messages(req), tools=_tools(req), tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls, max_tokens=req.max_output_tokens,
        temperature=req.temperature, top_p=req.top_p,
        reasoning_effort=req.reasoning.effort if req.reasoning else None,
        response_format=_response_format(fmt))
    return relay.as_request(body, ChatRequest)


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    """Responses' flat `text.format` as chat's `response_format` (the constrained decoder's input)."""
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "response", "schema":
                fmt.get("schema"), "strict": fmt.get("strict", True)}}
    return None


class _Output:
    """Output items with stable ids, so the streamed items and the final response agree."""

    def __init__(self) -> None:
        self.reasoning_id = new_id("rs_", 32)
        self.message_id = new_id("msg_", 32)

    def items(self, reply: Reply) -> list[dict[str, Any]]:
        out = []
        if reply.reasoning:
            out.append(self.reasoning(reply.reasoning))
        if reply.content or not reply.calls:
            out.append(self.message(reply.content))
        out.extend(self.call(c.id, c.name, c.arguments or "{}") for c in reply.calls)
        return out

    def reasoning(self, text: str, status: str = "completed") -> dict[str, Any]:
        return {"type": "reasoning", "id": self.reasoning_id, "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}] if text else []}

    def message(self, text: str | None, status: str = "completed") -> dict[str, Any]:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    @staticmethod
    def call(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
        return {"type": "function_call", "id": "fc_" + call_id.removeprefix("call_"), "call_id": call_id,
                "name": name, "arguments": arguments, "status": status}


def response_body(resp_id: str, created: int, model: str, req: ResponsesRequest, output: list[dict[str, Any]],
                  reply: Reply | None) -> dict[str, Any]:
    """The response object; `reply` None: still in progress (the stream's first events)."""
    status, incomplete = "in_progress", None
    usage = None
    if reply is not None:
        status = "incomplete" if reply.finish_reason == "length" else "completed"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        u = reply.usage
        usage = {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
                 "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": u.total_tokens}
    return {
        "id": resp_id, "object": "response", "created_at": created, "status": status, "model": model,
        "output": output, "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else False,
        "previous_response_id": None, "reasoning": relay.dump(req.reasoning) or {"effort": None, "summary": None},
        "store": False, "temperature": req.temperature, "top_p": req.top_p,
        "text": req.text or {"format": {"type": "text"}}, "tool_choice": req.tool_choice or "auto",
        "tools": [relay.dump(t) for t in req.tools or []], "truncation": "disabled", "usage": usage,
    }


class _Events:
    """Responses' typed events with their sequence numbers, and the item being streamed."""

    def __init__(self, out: _Output) -> None:
        self.seq = 0
        self.out = out
        self.index = -1
        self.open: dict[str, Any] | None = None  # the streamed item so far
        self.text = ""

    def emit(self, kind: str, **body: Any) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **body}
        self.seq += 1
        return event_frame(kind, payload)

    def start(self, item: dict[str, Any]) -> list[str]:
        frames = self.finish()
        self.index += 1
        self.open, self.text = item, ""
        frames.append(self.emit("response.output_item.added", output_index=self.index, item=item))
        if item["type"] == "message":
            frames.append(self.emit("response.content_part.added", item_id=item["id"], output_index=self.index,
                                    content_index=0, part=self._part("")))
        return frames

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def delta(self, text: str) -> str:
        item = self.open
        assert item is not None
        self.text += text
        ids = {"item_id": item["id"], "output_index": self.index}
        if item["type"] == "reasoning":
            return self.emit("response.reasoning_text.delta", **ids, content_index=0, delta=text)
        if item["type"] == "message":
            return self.emit("response.output_text.delta", **ids, content_index=0, delta=text, logprobs=[])
        return self.emit("response.function_call_arguments.delta", **ids, delta=text)

    def finish(self) -> list[str]:
        item, text = self.open, self.text
        if item is None:
            return []
        self.open = None
        ids = {"item_id": item["id"], "output_index": self.index}
        frames = []
        if item["type"] == "reasoning":
            frames.append(self.emit("response.reasoning_text.done", **ids, content_index=0, text=text))
            done = self.out.reasoning(text)
        elif item["type"] == "message":
            frames.append(self.emit("response.output_text.done", **ids, content_index=0, text=text, logprobs=[]))
            frames.append(self.emit("response.content_part.done", **ids, content_index=0, part=self._part(text)))
            done = self.out.message(text)
        else:
            arguments = text or "{}"
            frames.append(self.emit("response.function_call_arguments.done", **ids, name=item["name"],
                                    arguments=arguments))
            done = self.out.call(item["call_id"], item["name"], arguments)
        frames.append(self.emit("response.output_item.done", output_index=self.index, item=done))
        return frames

    def frames(self, event: Any) -> list[str]:
        kind = self.open["type"] if self.open else None
        if isinstance(event, ReasoningDelta) and event.text:
            head = self.start({**self.out.reasoning("", "in_progress"), "content": []}) if kind != "reasoning" else []
            return [*head, self.delta(event.text)]
        if isinstance(event, ContentDelta) and event.text:
            head = self.start(self.out.message(None, "in_progress")) if kind != "message" else []
            return [*head, self.delta(event.text)]
        if isinstance(event, ToolCallStart):
            return self.start(self.out.call(event.id, event.name, "", "in_progress"))
        if isinstance(event, ToolCallArgs) and event.fragment:
            return [self.delta(event.fragment)]
        return []


async def _stream(run: relay.Running, req: ResponsesRequest, resp_id: str, created: int,
                  model: str) -> AsyncIterator[str]:
    out = _Output()
    events = _Events(out)
    reply = Reply()
    first = response_body(resp_id, created, model, req, [], None)
    yield events.emit("response.created", response=first)
    yield events.emit("response.in_progress", response=first)
    try:
        async for event in relay.events(run):
            if event is PING:
                yield PING_FRAME
                continue
            reply.add(event)
            for chunk in events.frames(event):
                yield chunk
    except APIError as exc:
        yield events.emit("error", code=exc.type, message=exc.message, param=exc.param)
        return
    for chunk in events.finish():
        yield chunk
    final = response_body(resp_id, created, model, req, out.items(reply), reply)
    yield events.emit("response.completed" if final["status"] == "completed" else "response.incomplete",
                      response=final)


@router.post("/v1/responses")
@router.post("/responses")
async def responses(request: Request) -> Any:
    req = parse_body(await request.body(), ResponsesRequest)
    chat = chat_request(req)
    run = await relay.start(request, chat)
    resp_id, created, model = new_id("resp_", 32), int(time.time()), req.model or run.state.settings.model_id
    if req.stream:
        return EventStreamResponse(_stream(run, req, resp_id, created, model))
    reply = await relay.reply(request, run)
    return JSONResponse(response_body(resp_id, created, model, req, _Output().items(reply), reply))
