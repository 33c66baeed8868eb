"""Server-sent events: the response class and the frame format.

Starlette only watches for a client disconnect on older ASGI spec versions; this response always
does, so a closed tab stops its generation at once instead of when the next block is ready.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def frame(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False,
                                                                separators=(",", ":"))
    return f"data: {data}\n\n"


def event_frame(event: str, payload: dict[str, Any]) -> str:
    """A named event (`event: NAME`), as Anthropic's and OpenAI Responses' streams send them."""
    return f"event: {event}\n" + frame(payload)


def ndjson_line(payload: dict[str, Any]) -> str:
    """One line of a newline-delimited JSON stream (Ollama's streaming format)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n"


PING_FRAME = ": ping\n\n"
DONE_FRAME = "data: [DONE]\n\n"


class EventStreamResponse(StreamingResponse):
    """`text/event-stream` that cancels its body iterator as soon as the client goes away."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], media_type: str | None = None) -> None:
        super().__init__(content, media_type=media_type or self.media_type, headers=SSE_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                try:
                    await self.stream_response(send)
                except OSError:
                    pass
                tg.cancel_scope.cancel()

            async def watch() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        break
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            tg.start_soon(watch)
        close = getattr(self.body_iterator, "aclose", None)
        if close is not None:
            await close()
