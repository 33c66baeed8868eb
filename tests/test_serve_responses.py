"""OpenAI's Responses API (`/v1/responses`) driven by the `openai` SDK's `client.responses` against the
real server: text and item input, instructions, a function-tool round trip with function_call_output,
reasoning items, the streamed event sequence (and the SDK's own accumulation), and the stateless 400s."""

from __future__ import annotations

import json

import api_helpers as h
import openai
import pytest
from api_helpers import ANSWER, ARGS, KEY, QUESTION, REASONING

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather forecast for a city",
          "parameters": h.WEATHER_SCHEMA}]
NO_THINKING = {"reasoning": {"effort": "none"}}


@pytest.fixture(scope="module")
def server():
    with h.tool_server() as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.openai(api_key=KEY)


def test_function_call_round_trip(client):
    first = client.responses.create(model="tool-model", input=QUESTION, instructions="Use tools.", tools=TOOLS,
                                    max_output_tokens=64, **NO_THINKING)
    assert first.object == "response" and first.status == "completed" and first.id.startswith("resp_")
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments) == ARGS
    assert call.call_id.startswith("call_") and first.usage.input_tokens > 0 and first.usage.output_tokens > 0

    history = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
               *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 18}'}]
    second = client.responses.create(model="tool-model", input=history, tools=TOOLS, max_output_tokens=64,
                                     **NO_THINKING)
    assert second.output_text == ANSWER
    assert [item.type for item in second.output] == ["message"]
    assert second.usage.input_tokens > first.usage.input_tokens


def test_reasoning_items_and_max_output_tokens(client):
    res = client.responses.create(model="tool-model", input=QUESTION, tools=TOOLS, max_output_tokens=64)
    assert [item.type for item in res.output] == ["reasoning", "function_call"]
    assert res.output[0].content[0].text == REASONING
    short = client.responses.create(model="tool-model", input=QUESTION, max_output_tokens=4, **NO_THINKING)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 4


def test_streamed_events(client):
    events = list(client.responses.create(model="tool-model", input=QUESTION, tools=TOOLS, max_output_tokens=64,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert added == ["reasoning", "function_call"] == [item.type for item in done]
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert reasoning == REASONING and json.loads(arguments) == ARGS
    (args_done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args_done.arguments == arguments == done[1].arguments
    assert events[-1].response.output[1].call_id == done[1].call_id

    with client.responses.stream(model="tool-model", input=QUESTION, max_output_tokens=64, tool_choice="none",
                                 tools=TOOLS, **NO_THINKING) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()  # the SDK's strict accumulation of the events
    assert final.output_text == deltas and deltas.startswith("<tool_call>")


def test_stateless_and_unsupported_input_are_400(client):
    for kw, field in (({"previous_response_id": "resp_x"}, "previous_response_id"),
                      ({"tools": [{"type": "web_search"}]}, "tools.0"),
                      ({"text": {"format": {"type": "xml"}}}, "text.format.type")):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="tool-model", input=QUESTION, **kw)
        assert info.value.body["param"] == field, info.value.body
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tool-model", input=[{"type": "item_reference", "id": "msg_1"}])
    assert "stores no responses" in info.value.body["message"] or "keeps none" in info.value.body["message"]


def test_demo_model_weather_round_trip():
    """The shipped demo model through the Responses API: it calls get_weather, then reports."""
    system, tools = h.demo_tools()
    tools = [{"type": "function", **t["function"]} for t in tools]
    with h.demo_server() as live:
        client = live.openai(timeout=120)
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        first = client.responses.create(model="demo", instructions=system, input=ask, tools=tools,
                                        max_output_tokens=64, **NO_THINKING)
        call = first.output[-1]
        assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_weather", {"city": "Paris"})
        history = [*ask, *[i.model_dump(exclude_none=True) for i in first.output],
                   {"type": "function_call_output", "call_id": call.call_id, "output": "Paris: 18 °C, sunny"}]
        events = list(client.responses.create(model="demo", instructions=system, input=history, tools=tools,
                                              max_output_tokens=64, stream=True, **NO_THINKING))
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                   "temp_c": {"type": "integer", "minimum": -60, "maximum": 60}},
                  "required": ["city", "temp_c"], "additionalProperties": False}
        shaped = client.responses.create(  # text.format json_schema: the constrained decoder writes valid JSON
            model="demo", instructions=system, input=ask, max_output_tokens=64, **NO_THINKING,
            text={"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}})
    reply = json.loads(shaped.output_text)
    assert set(reply) == {"city", "temp_c"} and isinstance(reply["temp_c"], int)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        "It is 18 °C and sunny in Paris."
    assert events[-1].type == "response.completed"
