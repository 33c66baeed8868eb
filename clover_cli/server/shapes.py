"""OpenAI response objects built from chat-session events (`ContentDelta`, `ToolCallDelta`, ...).

Events are matched by class name, so this module depends on the event contract, not on where the
classes live. Streaming and non-streaming answers are built from the same events, so a client sees
the same text, reasoning and tool calls either way.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any


def new_id(prefix: str, n_hex: int = 32) -> str:
    return prefix + secrets.token_hex(n_hex // 2)


def kind(event: Any) -> str:
    return type(event).__name__


def usage_body(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens", 0) or 0)
    completion = int(usage.get("completion_tokens", 0) or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": int(usage.get("cached_tokens", 0) or 0)}}


def timings_body(timings: dict[str, Any] | None) -> dict[str, Any]:
    """llama-server's timings object plus clover's tokens per forward, passes and blocks."""
    t = dict(timings or {})
    out: dict[str, Any] = {"cache_n": int(t.pop("cache_n", 0) or 0)}
    for key in ("prompt_n", "predicted_n"):
        out[key] = int(t.pop(key, 0) or 0)
    for key in ("prompt_ms", "predicted_ms", "prompt_per_second", "predicted_per_second"):
        out[key] = float(t.pop(key, 0.0) or 0.0)
    out["prompt_per_token_ms"] = out["prompt_ms"] / out["prompt_n"] if out["prompt_n"] else 0.0
    out["predicted_per_token_ms"] = out["predicted_ms"] / out["predicted_n"] if out["predicted_n"] else 0.0
    out["tokens_per_forward"] = float(t.pop("tokens_per_forward", 0.0) or 0.0)
    out["passes"] = int(t.pop("passes", 0) or 0)
    out["blocks"] = int(t.pop("blocks", 0) or 0)
    out.update(t)
    return out


@dataclass
class ToolCallState:
    id: str
    name: str = ""
    arguments: str = ""


@dataclass
class ChatResult:
    """A whole answer, accumulated from events; also tracks tool-call ids for streaming."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, ToolCallState] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)

    def tool_delta(self, event: Any) -> dict[str, Any]:
        """Fold one ToolCallDelta in and return its OpenAI streaming form (`delta.tool_calls[i]`)."""
        index = int(event.index)
        first = index not in self.calls
        if first:
            self.calls[index] = ToolCallState(id=getattr(event, "id", None) or new_id("call_", 24))
        call = self.calls[index]
        name = getattr(event, "name", None)
        fragment = getattr(event, "arguments_fragment", None) or ""
        if name:
            call.name = name
        call.arguments += fragment
        out: dict[str, Any] = {"index": index}
        fn: dict[str, Any] = {}
        if first:
            out["id"] = call.id
            out["type"] = "function"
        if name:
            fn["name"] = name
        fn["arguments"] = fragment
        out["function"] = fn
        return out

    def add(self, event: Any) -> None:
        k = kind(event)
        if k == "ContentDelta":
            self.content += event.text
        elif k == "ReasoningDelta":
            self.reasoning += event.text
        elif k == "ToolCallDelta":
            self.tool_delta(event)
        elif k == "Finished":
            self.finish(event)

    def finish(self, event: Any) -> None:
        reason = event.finish_reason
        if self.calls and reason == "stop":
            reason = "tool_calls"
        self.finish_reason = reason
        self.usage = dict(event.usage or {})
        self.timings = dict(event.timings or {})

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["content"] = self.content or None
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                for _, c in sorted(self.calls.items())
            ]
        return msg


@dataclass
class Envelope:
    """The fields every object of one response shares."""

    id: str
    model: str
    fingerprint: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chat(self, result: ChatResult) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "message": result.message(), "logprobs": None,
                         "finish_reason": public_reason(result.finish_reason)}],
            "usage": usage_body(result.usage), "timings": timings_body(result.timings),
        }

    def chat_chunk(self, delta: dict[str, Any], finish_reason: str | None = None,
                   **extra: Any) -> dict[str, Any]:
        body = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        body.update(extra)
        return body

    def usage_chunk(self, obj: str, usage: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [],
                "usage": usage_body(usage), "timings": timings_body(timings)}

    def text(self, text: str, finish_reason: str | None, usage: dict[str, Any] | None = None,
             timings: dict[str, Any] | None = None, chunk: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        }
        if not chunk or usage is not None:
            body["usage"] = usage_body(usage)
        if timings is not None:
            body["timings"] = timings_body(timings)
        return body


def public_reason(reason: str | None) -> str | None:
    """OpenAI knows no "cancelled": a stopped generation reports where it stopped."""
    if reason == "cancelled":
        return "stop"
    return reason
