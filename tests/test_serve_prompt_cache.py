"""Prefix reuse in `clover serve`: an agent loop (system prompt, tools, a tool call, its result, a
follow-up) driven with the `openai` SDK against the real server prefills only what is new, gives
the same answers as with `cache_prompt: false`, and routes each conversation to its own slot."""

from __future__ import annotations

import json
import re

import pytest
from serve_helpers import chat_factory, fixed_reply_model, live_server

CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>")
ANSWER = "It is 18 °C and sunny in Paris."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
NO_THINKING = {"enable_thinking": False}


@pytest.fixture(scope="module")
def server():
    model = fixed_reply_model(CALL, after_tool=ANSWER)
    with live_server(chat_factory(model, 2048), model_id="m", n_ctx_slot=2048, n_parallel=2,
                     slots_verbose=True) as live:
        yield live


def _ask(client, messages, cache: bool = True):  # noqa: ANN001
    body = {"chat_template_kwargs": NO_THINKING}
    if not cache:
        body["cache_prompt"] = False
    return client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=48, temperature=0,
                                          extra_body=body)


def _conversation(client, system: str, cache: bool = True) -> tuple[list, list]:  # noqa: ANN001
    """Three turns: a question (-> tool call), the tool's result (-> answer), a follow-up; returns
    the replies and each turn's messages."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Weather in Paris?"}]
    turns = [list(messages)]
    first = _ask(client, messages, cache)
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18})}]
    turns.append(list(messages))
    second = _ask(client, messages, cache)
    messages += [{"role": "assistant", "content": second.choices[0].message.content},
                 {"role": "user", "content": "Thanks. And tomorrow?"}]
    turns.append(list(messages))
    third = _ask(client, messages, cache)
    return [first, second, third], turns


def _prompt_ids(c, messages: list) -> list[int]:  # noqa: ANN001
    """The prompt the server renders, through its own /apply-template and /tokenize endpoints."""
    prompt = c.post("/apply-template", json={"messages": messages, "tools": TOOLS,
                                             "chat_template_kwargs": NO_THINKING}).json()["prompt"]
    return c.post("/tokenize", json={"content": prompt}).json()["tokens"]


def _reusable(prev: list[int], new: list[int], boundary: list[int]) -> int:
    """The newest assistant-message boundary (`<|im_start|>assistant`) at or before the two prompts'
    common prefix: where a restore lands when a re-rendered history diverges from what the slot holds."""
    common = next((i for i, (a, b) in enumerate(zip(prev, new, strict=False)) if a != b), min(len(prev), len(new)))
    return max((i for i in range(1, common + 1) if new[i:i + len(boundary)] == boundary), default=0)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^clover:{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_agent_loop_prefills_only_what_is_new(server) -> None:  # noqa: ANN001
    client = server.openai()
    system = "You are a weather assistant. " * 20
    cold, _ = _conversation(client, system, cache=False)
    assert [r.usage.prompt_tokens_details.cached_tokens for r in cold] == [0, 0, 0]
    with server.client() as c:
        before = c.get("/metrics").text
    warm, turns = _conversation(client, system + " Be brief.")
    for w, k in zip(warm, cold, strict=True):
        assert w.choices[0].finish_reason == k.choices[0].finish_reason
        assert w.choices[0].message.content == k.choices[0].message.content
        assert [t.function.arguments for t in w.choices[0].message.tool_calls or []] == \
               [t.function.arguments for t in k.choices[0].message.tool_calls or []]
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in warm]
    prompts = [r.usage.prompt_tokens for r in warm]
    assert cached[0] == 0
    with server.client() as c:
        ids = [_prompt_ids(c, t) for t in turns]
        boundary = c.post("/tokenize", json={"content": "<|im_start|>assistant"}).json()["tokens"]
    assert [len(i) for i in ids] == prompts
    for i in (1, 2):  # the restore lands at the last message boundary before the prompts diverge
        want = _reusable(ids[i - 1], ids[i], boundary)
        assert want > prompts[0] // 2
        assert cached[i] >= want // 64 * 64, (i, cached, want)  # checkpoints sit at multiples of 64
    raw = server.client().post("/v1/chat/completions", json={
        "messages": [{"role": "system", "content": system + " Be brief."},
                     {"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS, "max_tokens": 8, "chat_template_kwargs": NO_THINKING}).json()
    assert raw["timings"]["cache_n"] == raw["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert raw["timings"]["prompt_n"] == raw["usage"]["prompt_tokens"] - raw["timings"]["cache_n"]
    server.wait_idle()
    with server.client() as c:
        after = c.get("/metrics").text
    reused = _metric(after, "prompt_tokens_cached_total") - _metric(before, "prompt_tokens_cached_total")
    prefilled = _metric(after, "prompt_tokens_total") - _metric(before, "prompt_tokens_total")
    assert reused == sum(cached) + raw["timings"]["cache_n"]
    assert prefilled == sum(p - c for p, c in zip(prompts, cached, strict=True)) + raw["timings"]["prompt_n"]


def test_each_conversation_keeps_its_slot(server) -> None:  # noqa: ANN001
    client = server.openai()
    a = [{"role": "system", "content": "Slot A. " * 30}, {"role": "user", "content": "Weather in Paris?"}]
    b = [{"role": "system", "content": "Slot B. " * 30}, {"role": "user", "content": "Weather in Paris?"}]
    _ask(client, a)
    _ask(client, b)
    server.wait_idle()
    with server.client() as c:
        slots = c.get("/slots").json()
    assert len(slots) == 2 and not any(s["is_processing"] for s in slots)
    holders = {("Slot A." in s["prompt"], "Slot B." in s["prompt"]) for s in slots}
    assert holders == {(True, False), (False, True)}  # the idle, least recently used slot took B
    for s in slots:
        assert s["n_cached_tokens"] > 60 and s["checkpoints"] and s["n_ctx"] == 2048
        assert s["checkpoint_bytes"] > 0 and s["next_token"][0]["has_next_token"] is False
    for conv in (a, b):  # each follow-up finds its own conversation's slot
        again = _ask(client, conv + [{"role": "user", "content": "More?"}])
        assert again.usage.prompt_tokens_details.cached_tokens > 60


def test_slot_save_restore_erase(server, tmp_path) -> None:  # noqa: ANN001
    with server.client() as c:  # the module's server has no --slot-save-path
        off = c.post("/slots/0?action=save", json={"filename": "a.bin"})
        assert off.status_code == 501 and "--slot-save-path" in off.json()["error"]["message"]
    model = fixed_reply_model(CALL, after_tool=ANSWER)
    conv = [{"role": "system", "content": "Saved slot. " * 30}, {"role": "user", "content": "Weather in Paris?"}]
    with live_server(chat_factory(model, 2048), model_id="m", n_ctx_slot=2048, slot_save_path=str(tmp_path)) as live:
        client = live.openai()
        _ask(client, conv)
        live.wait_idle()
        with live.client() as c:
            shown = c.get("/slots")  # without --slots-verbose: counts and state, not the conversation
            assert "prompt" not in shown.json()[0] and "Saved slot" not in shown.text
            assert shown.json()[0]["n_cached_tokens"] > 60
            saved = c.post("/slots/0?action=save", json={"filename": "a.bin"}).json()
            assert saved["id_slot"] == 0 and saved["n_saved"] > 60
            assert saved["n_written"] == (tmp_path / "a.bin").stat().st_size
            assert c.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": saved["n_saved"]}
            assert c.get("/slots").json()[0]["n_cached_tokens"] == 0
            restored = c.post("/slots/0?action=restore", json={"filename": "a.bin"}).json()
            assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
            for url, body, status in [("/slots/0?action=save", {"filename": "../x.bin"}, 400),
                                      ("/slots/0?action=restore", {"filename": "missing.bin"}, 404),
                                      ("/slots/0?action=fly", None, 400),
                                      ("/slots/7?action=erase", None, 404),
                                      ("/slots/0?action=save", {}, 400)]:
                r = c.post(url, json=body)
                assert r.status_code == status, (url, r.text)
                assert r.json()["error"]["code"] == status
        again = _ask(client, conv + [{"role": "user", "content": "More?"}])
        assert again.usage.prompt_tokens_details.cached_tokens > 60  # resumed from the restored file
