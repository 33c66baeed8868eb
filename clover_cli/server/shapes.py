"""OpenAI response objects built from the reply contract (`clover_runtime.text.reply`).

Streaming and non-streaming answers are built from the same events folded into the same `Reply`,
so a client sees the same text, reasoning, tool calls and finish reason either way.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from clover_runtime.text.reply import Reply, Timings, ToolCallArgs, ToolCallStart, Usage


def new_id(prefix: str, n_hex: int = 32) -> str:
    return prefix + secrets.token_hex(n_hex // 2)


def usage_body(usage: Usage | None) -> dict[str, Any]:
    """OpenAI's usage object (cached prompt tokens under `prompt_tokens_details`)."""
    u = usage or Usage()
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def timings_body(timings: Timings | None) -> dict[str, Any]:
    """llama-server's timings object plus clover's forwards, passes, blocks and tokens per mode."""
    return (timings or Timings()).to_json()


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

    def usage_chunk(self, obj: str, usage: Usage, timings: Timings) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [],
                "usage": usage_body(usage), "timings": timings_body(timings)}

    def text(self, text: str, finish_reason: str | None, usage: Usage | None = None,
             timings: Timings | None = None, chunk: bool = False,
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

