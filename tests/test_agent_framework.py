"""A real agent framework from PyPI (pydantic-ai, through its OpenAI chat model) drives `clover
serve`: the model answers with a tool call, the framework runs the tool and sends its result, the
model gives the final answer; once with plain requests and once streamed. Thinking is turned off
the way agent clients do it, with `reasoning_effort: "none"`."""

from __future__ import annotations

import asyncio
import json

import httpx2
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIChatModelSettings
from pydantic_ai.providers.openai import OpenAIProvider
from serve_helpers import chat_factory, fixed_reply_model, live_server

CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
ANSWER = "It is 18 °C and sunny in Paris."
QUESTION = "What will the weather be in Paris?"
MODEL = "clover-agent"


@pytest.fixture(scope="module")
def server():
    model = fixed_reply_model(CALL, after_tool=ANSWER)
    with live_server(chat_factory(model, 2048), model_id=MODEL, n_ctx_slot=2048) as live:
        yield live


def _agent(server, sent):
    """An agent on our server that records every request body it sends, and its tool's calls."""
    calls = []

    async def record(request: httpx2.Request) -> None:
        sent.append(json.loads(request.content))

    http = httpx2.AsyncClient(event_hooks={"request": [record]}, timeout=60.0)
    provider = OpenAIProvider(base_url=server.url("/v1"), api_key="none", http_client=http)
    settings = OpenAIChatModelSettings(max_tokens=96, temperature=0, openai_reasoning_effort="none")
    agent = Agent(OpenAIChatModel(MODEL, provider=provider), model_settings=settings)

    @agent.tool_plain
    def get_weather(city: str, days: int = 1) -> dict:
        """Weather forecast for a city."""
        calls.append((city, days))
        return {"temp_c": 18, "sky": "sunny"}

    return agent, calls


def _check_round_trip(messages, sent, calls, *, stream):
    assert calls == [("Paris", 3)]  # the framework parsed the call and ran the tool with typed arguments
    responses = [m for m in messages if isinstance(m, ModelResponse)]
    (call,) = [p for p in responses[0].parts if isinstance(p, ToolCallPart)]
    assert call.tool_name == "get_weather" and call.args_as_dict() == {"city": "Paris", "days": 3}
    returns = [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
    assert [r.tool_call_id for r in returns] == [call.tool_call_id]
    assert len(sent) == 2 and all(bool(body.get("stream")) is stream for body in sent)
    assert all(body.get("reasoning_effort") == "none" for body in sent)
    tool_turn = sent[1]["messages"][-1]
    assert tool_turn["role"] == "tool" and tool_turn["tool_call_id"] == call.tool_call_id
    assert json.loads(tool_turn["content"]) == {"temp_c": 18, "sky": "sunny"}


def test_agent_tool_round_trip(server):
    sent = []
    agent, calls = _agent(server, sent)
    result = agent.run_sync(QUESTION)
    assert result.output == ANSWER
    _check_round_trip(result.all_messages(), sent, calls, stream=False)


def test_agent_tool_round_trip_streamed(server):
    sent = []
    agent, calls = _agent(server, sent)

    async def run():
        async with agent.run_stream(QUESTION) as result:
            pieces = [piece async for piece in result.stream_text(delta=True)]
            return pieces, await result.get_output(), result.all_messages()

    pieces, output, messages = asyncio.run(run())
    assert output == ANSWER and "".join(pieces) == ANSWER
    _check_round_trip(messages, sent, calls, stream=True)
