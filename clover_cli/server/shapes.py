"""OpenAI response objects built from the reply contract (`clover_runtime.text.reply`).

Streaming and non-streaming answers are built from the same events folded into the same `Reply`,
so a client sees the same text, reasoning, tool calls and finish reason either way.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from clover_runtime.text.reply import Reply, ToolCallArgs, ToolCallStart


def new_id(prefix: str, n_hex: int = 32) -> str:
    return prefix + secrets.token_hex(n_hex // 2)


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


def tool_call_chunk(event: ToolCallStart | ToolCallArgs) -> dict[str, Any]:
    """One tool-call event in OpenAI's streaming form (`delta.tool_calls[i]`): the first carries
    id, type and name, the later ones argument fragments."""
    if isinstance(event, ToolCallStart):
        return {"index": event.index, "id": event.id, "type": "function",
                "function": {"name": event.name, "arguments": ""}}
    return {"index": event.index, "function": {"arguments": event.fragment}}


def chat_message(reply: Reply) -> dict[str, Any]:
    """The assistant message as OpenAI returns it: content null when the reply only calls tools."""
    msg = reply.message()
    if reply.calls:
        msg["content"] = reply.content or None
    return msg


@dataclass
class Envelope:
    """The fields every object of one response shares."""

    id: str
    model: str
    fingerprint: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chat(self, result: Reply, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "message": chat_message(result), "logprobs": logprobs,
                         "finish_reason": result.finish_reason}],
            "usage": usage_body(result.usage), "timings": timings_body(result.timings),
        }

    def chat_chunk(self, delta: dict[str, Any], finish_reason: str | None = None,
                   logprobs: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        body = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        }
        body.update(extra)
        return body

    def usage_chunk(self, obj: str, usage: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [],
                "usage": usage_body(usage), "timings": timings_body(timings)}

    def text(self, text: str, finish_reason: str | None, usage: dict[str, Any] | None = None,
             timings: dict[str, Any] | None = None, chunk: bool = False,
             logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        }
        if not chunk or usage is not None:
            body["usage"] = usage_body(usage)
        if timings is not None:
            body["timings"] = timings_body(timings)
        return body

