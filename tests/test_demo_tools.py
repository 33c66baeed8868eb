"""The shipped demo model's tool calls through `clover serve`'s real HTTP server and the `openai`
SDK, for the held-out weather questions (cities never in its training data, and cut out of its
vocabulary's text): exactly one get_weather call with the asked city, then, given the tool's
report, the answer with the temperature and sky copied, and the city but for the counted misses.
Issue 15 asks for 9 of 10 whole round trips; the shipped file makes 10 of 10 calls and round trips
(`training/eval.py`), and the floors asserted are the issue's, so that a worse file cannot be
shipped unnoticed."""

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
CALLS, WHOLE = 9, 9  # issue 15's target; 10 and 10 measured on the shipped file


@pytest.fixture(scope="module")
def live():  # noqa: ANN201
    with live_server(chat_factory(Path("demo"), 2048), model_id="demo", n_ctx_slot=2048) as server:
        yield server


def test_held_out_weather_questions_round_trip_through_the_server(live) -> None:  # noqa: ANN001
    client = live.openai()
    cities = demo_corpus.make_corpus(SEED, arithmetic_pairs=1, repeats=1).held_out_cities
    assert len(cities) == 10
    called, whole, seen = 0, 0, []
    for city in cities:
        question, result, answer = demo_eval.weather_turns(city, SEED)
        first = client.chat.completions.create(model="demo", messages=question, tools=demo_corpus.TOOLS,
                                               max_tokens=128, extra_body=NO_THINK)
        msg = first.choices[0].message
        calls = msg.tool_calls or []
        seen.append([(c.function.name, c.function.arguments) for c in calls] or msg.content)
        if not (first.choices[0].finish_reason == "tool_calls" and len(calls) == 1
                and calls[0].function.name == "get_weather"
                and json.loads(calls[0].function.arguments) == {"city": city}):
            continue
        called += 1
        turn = {"role": "assistant", "content": msg.content or "",
                "tool_calls": [c.model_dump(exclude_none=True) for c in calls]}
        tool = {"role": "tool", "tool_call_id": calls[0].id, "content": result["content"]}
        second = client.chat.completions.create(model="demo", messages=[*question, turn, tool],
                                                tools=demo_corpus.TOOLS, max_tokens=128, extra_body=NO_THINK)
        text = second.choices[0].message.content.strip()
        seen[-1] = text
        assert second.choices[0].finish_reason == "stop", (city, text)
        report = demo_corpus.weather_report(city, SEED)
        assert re.fullmatch(rf"It is {report['temperature']} °C and {report['condition']} in [A-Za-z]+\.", text), \
            (city, text)
        whole += text == answer
    assert called >= CALLS, f"{called} of 10 exact calls: {seen}"
    assert whole >= WHOLE, f"{whole} of 10 whole round trips: {seen}"
