"""The shipped demo model's tool calls through `clover serve`'s real HTTP server and the `openai`
SDK, for the held-out weather questions (cities never in its training data). Issue 15 asks for 9 of
10 exact round trips; this file does not copy an unseen city yet (README, "The demo model"), so what
is asserted is what it does: one well-formed get_weather call whose city starts like the asked one,
and, given the tool's result, a final answer in the trained shape."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "training"))

import corpus as demo_corpus  # noqa: E402
import eval as demo_eval  # noqa: E402
from serve_helpers import chat_factory, live_server  # noqa: E402

SEED = 0  # the shipped file's training seed: it picks the held-out cities
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def live():  # noqa: ANN201
    with live_server(chat_factory(Path("demo"), 2048), model_id="demo", n_ctx=2048) as server:
        yield server


def test_held_out_weather_questions_get_a_tool_call_and_an_answer(live) -> None:  # noqa: ANN001
    client = live.openai()
    cities = demo_corpus.make_corpus(SEED, arithmetic_pairs=1, repeats=1).held_out_cities
    assert len(cities) == 10
    for city in cities:
        question, result, _ = demo_eval.weather_turns(city, SEED)
        first = client.chat.completions.create(model="demo", messages=question, tools=demo_corpus.TOOLS,
                                               max_tokens=96, extra_body=NO_THINK)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls", (city, choice)
        (call,) = choice.message.tool_calls
        args = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and list(args) == ["city"], (city, call)
        assert args["city"][:1] == city[:1], (city, args)
        turn = {"role": "assistant", "content": choice.message.content or "",
                "tool_calls": [call.model_dump(exclude_none=True)]}
        tool = {"role": "tool", "tool_call_id": call.id, "content": result["content"]}
        second = client.chat.completions.create(model="demo", messages=[*question, turn, tool],
                                                tools=demo_corpus.TOOLS, max_tokens=96, extra_body=NO_THINK)
        report = json.loads(result["content"])
        text = second.choices[0].message.content.strip()
        assert second.choices[0].finish_reason == "stop", (city, text)
        assert re.fullmatch(rf"It is {report['temperature']} °C and {report['condition']} in \S+\.", text), (city, text)
