"""What the tests of the other API shapes (Anthropic, Responses, Ollama) share: the tool model of
test_serve_tools (it answers any question with one get_weather call, after its reasoning in thinking
mode, and a tool result with a sentence), served with an API key, and the shipped demo model."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from serve_helpers import LiveServer, chat_factory, fixed_reply_model, live_server
from test_serve_tools import ANSWER, ARGS, CALL, REASONING

ROOT = Path(__file__).resolve().parent.parent
KEY = "test-key"
QUESTION = "What will the weather be in Paris?"
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                  "required": ["city"]}

__all__ = ["ANSWER", "ARGS", "CALL", "KEY", "QUESTION", "REASONING", "WEATHER_SCHEMA", "demo_server", "demo_tools",
           "tool_server"]


@contextmanager
def tool_server() -> Iterator[LiveServer]:
    model = fixed_reply_model(CALL, reasoning=REASONING, after_tool=ANSWER)
    with live_server(chat_factory(model, 2048), model_id="tool-model", n_ctx_slot=2048, api_keys=(KEY,)) as live:
        yield live


@contextmanager
def demo_server() -> Iterator[LiveServer]:
    """`clover serve demo`'s app over the shipped demo model (what test_demo_tools serves)."""
    with live_server(chat_factory(Path("demo"), 2048), model_id="demo", n_ctx_slot=2048) as live:
        yield live


def demo_tools() -> tuple[str, list[dict]]:
    """The demo model's system prompt and tools (training/corpus.py), in OpenAI's shape."""
    sys.path.insert(0, str(ROOT / "training"))
    import corpus

    return corpus.SYSTEM, corpus.TOOLS
