"""Logprobs, echo and reasoning-aware stops through the real clients against `clover serve demo`.

The scores are checked against an independent computation: one causal `model.forward` over the
prompt and the reply in this process, log-softmaxed (the server's path is the decoder's own logits).
Both use float kernels (`--exact-kernels`): with 8-bit activations a row's logits depend on which
rows share its forward (the prefill's chunks, a block's commit), by up to 0.1 in a logprob.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from clover_runtime.chat import load_chat
from clover_runtime.decoding import log_softmax
from serve_helpers import ROOT, clover_serve

QUESTION = [{"role": "user", "content": "What is 48 + 36?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
LM_EVAL_TASK = ROOT / "tests" / "lm_eval_task"


def _env(home: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOVER_")}
    return {**clean, "CLOVER_HOME": str(home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}


def _loaded(url: str, timeout: float = 300.0) -> str:
    """`url` once /health says the model is loaded (it answers 503 while loading)."""
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the model did not load"
        time.sleep(0.2)
    return url


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with clover_serve(["demo", "-c", "1024", "--exact-kernels"], _env(tmp_path_factory.mktemp("lp-home"))) as (url, _):
        yield _loaded(url)


@pytest.fixture(scope="module")
def session():
    return load_chat("demo", n_ctx=1024, exact_kernels=True)


@pytest.fixture(scope="module")
def by_bytes(session):
    tok = session.tokenizer
    table: dict[bytes, int] = {}
    for i in range(tok.n_vocab):
        table.setdefault(tok.token_bytes(i), i)
    return table


def _client(url: str):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def _reference(session, ids: list[int]) -> np.ndarray:
    """Log-probabilities of every next token after each prefix of `ids` (rows × vocab)."""
    return log_softmax(session.model.forward(ids))


def _check_chat_entries(session, by_bytes, content: list, prompt_ids: list[int], top: int) -> None:
    ids = [by_bytes[bytes(e.bytes)] for e in content]
    ref = _reference(session, prompt_ids + ids)
    for j, entry in enumerate(content):
        row = ref[len(prompt_ids) - 1 + j]
        assert entry.logprob <= 0.0
        assert abs(entry.logprob - row[ids[j]]) < 1e-4, (j, entry.token, entry.logprob, row[ids[j]])
        assert len(entry.top_logprobs) == top
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)  # greedy: the best
        assert entry.top_logprobs[0].token == entry.token
        best = np.sort(row)[::-1][:top]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(best.tolist(), abs=1e-4)
        assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in entry.top_logprobs)


@pytest.mark.parametrize("decode", ["ar", "diffusion"])
def test_chat_logprobs_match_an_independent_forward_streamed_or_not(server, session, by_bytes, decode):
    client = _client(server)
    extra = {**NO_THINK, "decode": decode}
    r = client.chat.completions.create(model="demo", messages=QUESTION, temperature=0, max_tokens=48,
                                       logprobs=True, top_logprobs=3, extra_body=extra)
    choice = r.choices[0]
    content = choice.logprobs.content
    assert "".join(e.token for e in content) == choice.message.content
    prompt = session.prepare(QUESTION, chat_template_kwargs={"enable_thinking": False}).ids
    _check_chat_entries(session, by_bytes, content, prompt, 3)

    streamed, text = [], ""
    for chunk in client.chat.completions.create(model="demo", messages=QUESTION, temperature=0, max_tokens=48,
                                                logprobs=True, top_logprobs=3, stream=True, extra_body=extra):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == choice.message.content
    assert [e.token for e in streamed] == [e.token for e in content]
    # the second request resumes from the prompt cache: equal to float32 round-off (README)
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)


def test_chat_without_logprobs_has_none_and_bad_values_are_400(server):
    with httpx.Client(base_url=server, timeout=120) as http:
        body = {"messages": QUESTION, "max_tokens": 4, **NO_THINK}
        assert http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"] is None
        for bad, field in (({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21},
                                                                    "top_logprobs")):
            r = http.post("/v1/chat/completions", json={**body, **bad})
            assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
        r = http.post("/v1/completions", json={"prompt": "x", "logprobs": 99})
        assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"]


def test_completions_logprobs_streamed_and_not(server, session):
    client = _client(server)
    prompt = "Ones: 8 + 6 = 14, write 4, carry 1."
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=12, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 12
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and 5 <= len(top) <= 6 and top[tok] == value == max(top.values())
    ids = session.tokenizer.encode(prompt) + session.tokenizer.encode(r.choices[0].text)
    ref = _reference(session, ids)
    n = len(ids) - 12
    assert lp.token_logprobs == pytest.approx([ref[n - 1 + j][ids[n + j]] for j in range(12)], abs=1e-4)
    chunks = list(client.completions.create(model="demo", prompt=prompt, max_tokens=12, temperature=0,
                                            logprobs=5, stream=True))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    values = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert tokens == lp.tokens and values == pytest.approx(lp.token_logprobs, abs=1e-5)  # a cached prompt: round-off


def test_echo_with_max_tokens_0_scores_the_prompt(server, session):
    prompt = "Tens: 4 + 3 + 1 = 8. So 48 + 36 = 84."
    r = _client(server).completions.create(model="demo", prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                           temperature=0)
    choice = r.choices[0]
    ids = session.tokenizer.encode(prompt)
    assert choice.text == prompt and "".join(choice.logprobs.tokens) == prompt
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    ref = _reference(session, ids)
    assert choice.logprobs.token_logprobs[1:] == pytest.approx([ref[i - 1][ids[i]] for i in range(1, len(ids))],
                                                                abs=1e-4)
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)


def _check_echoed(session, choice: dict, text: str, top: int) -> None:
    """An echoed prompt's scores in OpenAI's completions shape against an independent forward."""
    lp, ids = choice["logprobs"], session.tokenizer.encode(text)
    assert choice["text"] == text and "".join(lp["tokens"]) == text and len(lp["tokens"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and lp["text_offset"][0] == 0
    ref = _reference(session, ids)
    assert lp["token_logprobs"][1:] == pytest.approx([ref[i - 1][ids[i]] for i in range(1, len(ids))], abs=1e-4)
    for tok, value, alts in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
        assert top <= len(alts) <= top + 1 and alts[tok] == value  # the chosen token is added, as OpenAI does


def test_a_list_of_prompts_as_text_or_token_ids_is_scored_one_choice_each(server, session):
    """lm-eval batches loglikelihood requests: `prompt` is a list of token-id lists, one choice each."""
    texts = ["Tens: 4 + 3 + 1 = 8. So 48 + 36 = 84.", "What is 17 + 25?", "Ones: 7 + 5 = 12, write 2, carry 1."]
    tok = session.tokenizer
    with httpx.Client(base_url=server, timeout=120) as http:
        for prompt in (texts, [tok.encode(t) for t in texts]):
            body = {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 2, "temperature": 0}
            out = http.post("/v1/completions", json=body).json()
            choices = sorted(out["choices"], key=lambda c: c["index"])
            assert [c["index"] for c in choices] == [0, 1, 2], out
            for choice, text in zip(choices, texts, strict=True):
                _check_echoed(session, choice, text, 2)
            assert out["usage"]["completion_tokens"] == 0
            assert out["usage"]["prompt_tokens"] == sum(len(tok.encode(t)) for t in texts)
    client = _client(server)
    r = client.completions.create(model="demo", prompt=texts[1:], max_tokens=6, temperature=0, logprobs=1)
    assert len(r.choices) == 2
    for choice, text in zip(sorted(r.choices, key=lambda c: c.index), texts[1:], strict=True):
        alone = client.completions.create(model="demo", prompt=text, max_tokens=6, temperature=0, logprobs=1)
        assert choice.text == alone.choices[0].text and choice.logprobs.tokens == alone.choices[0].logprobs.tokens
        assert choice.logprobs.token_logprobs == pytest.approx(alone.choices[0].logprobs.token_logprobs, abs=1e-5)
        assert choice.logprobs.text_offset == alone.choices[0].logprobs.text_offset


def test_several_chat_choices_each_have_their_logprobs(server):
    r = _client(server).chat.completions.create(model="demo", messages=QUESTION, max_tokens=8, n=2, seed=3,
                                                logprobs=True, top_logprobs=2, extra_body=NO_THINK)
    assert len(r.choices) == 2
    for choice in r.choices:
        content = choice.logprobs.content
        assert "".join(e.token for e in content) == choice.message.content and len(content) == 8
        assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)


def test_the_requests_lm_eval_local_completions_sends_for_loglikelihood(server, session):
    """lm-eval 0.4.13's `local-completions` sends, per loglikelihood request, token ids with echo,
    max_tokens 1 and logprobs 1, and sums `token_logprobs[ctxlen:-1]`, greedy when each equals its
    `top_logprobs` maximum (checked here without lm-eval installed; the next test runs lm-eval itself)."""
    tok = session.tokenizer
    context, continuation = tok.encode("What is 48 + 36?"), tok.encode(" So 48 + 36 = 84.")
    payload = {"model": "demo", "prompt": [context + continuation], "temperature": 0, "max_tokens": 1,
               "logprobs": 1, "seed": 1234, "echo": True}
    with httpx.Client(base_url=server, timeout=120) as http:
        out = http.post("/v1/completions", json=payload).json()
        llama = http.post("/v1/completions", json={"prompt": context, "max_tokens": 2, "n_probs": 2}).json()
    choice = sorted(out["choices"], key=lambda c: c["index"])[0]
    ctxlen = len(context)
    assert len(choice["logprobs"]["token_logprobs"]) == ctxlen + len(continuation) + 1
    values = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    ids = context + continuation
    ref = _reference(session, ids)
    expected = sum(ref[i - 1][ids[i]] for i in range(ctxlen, len(ids)))
    assert sum(values) == pytest.approx(expected, abs=1e-3)
    greedy = all(v == max(t.values()) for v, t in zip(values, tops, strict=True))
    assert greedy == all(int(np.argmax(ref[i - 1])) == ids[i] for i in range(ctxlen, len(ids)))
    probs = llama["completion_probabilities"]
    assert len(probs) == 2 and all(set(p) == {"id", "token", "logprob", "bytes", "top_logprobs"} for p in probs)
    assert probs[0]["top_logprobs"][0]["id"] == probs[0]["id"] and len(probs[0]["top_logprobs"]) == 2


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(f"clover:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed (the test extra)")
def test_lm_eval_runs_a_loglikelihood_task_from_a_local_file(server, session, tmp_path):
    """lm-evaluation-harness itself (`local-completions`, batches of 4 prompts, the server's own
    tokenizer through /tokenizer_info and /tokenize) on tests/lm_eval_task: offline, no Hub."""
    out = tmp_path / "out"
    env = {**_env(tmp_path / "home"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    before = _metric(server, "requests_total")
    res = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                          f"base_url={server}/v1/completions,model=demo", "--batch_size", "4", "--include_path", ".",
                          "--tasks", "clover_sums", "--output_path", str(out), "--log_samples"],
                         cwd=LM_EVAL_TASK, env=env, capture_output=True, text=True, encoding="utf-8", timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "Using remote tokenizer" in res.stderr  # it tokenized with the server's tokenizer, not a download
    docs = (LM_EVAL_TASK / "sums.jsonl").read_text(encoding="utf-8").splitlines()
    assert _metric(server, "requests_total") - before == 4 * len(docs)  # one scored prompt per choice
    results = json.loads(next(out.rglob("results_*.json")).read_text(encoding="utf-8"))["results"]
    acc = results["clover_sums"]["acc,none"]
    assert 0.5 <= acc <= 1.0  # chance is 0.25; the demo knows these sums
    samples = [json.loads(line) for line in next(out.rglob("samples_clover_sums_*.jsonl")).read_text(
        encoding="utf-8").splitlines()]
    assert sorted(s["doc_id"] for s in samples) == list(range(len(docs)))
    first = next(s for s in samples if s["doc_id"] == 0)
    tok = session.tokenizer
    for k, (ll, _greedy) in enumerate(first["filtered_resps"]):
        args = first["arguments"][f"gen_args_{k}"]
        context, ids = tok.encode(args["arg_0"]), tok.encode(args["arg_0"] + args["arg_1"])
        ref = _reference(session, ids)
        assert float(ll) == pytest.approx(sum(ref[i - 1][ids[i]] for i in range(len(context), len(ids))), abs=1e-3)


def test_a_stop_string_applies_to_the_answer_not_the_reasoning(server):
    client = _client(server)
    for stream in (False, True):
        kw = {"model": "demo", "messages": QUESTION, "temperature": 0, "max_tokens": 80, "stop": ["\n\n"]}
        if stream:
            parts = list(client.chat.completions.create(stream=True, **kw))
            content = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
            reasoning = "".join(getattr(p.choices[0].delta, "reasoning_content", None) or ""
                                for p in parts if p.choices)
        else:
            msg = client.chat.completions.create(**kw).choices[0].message
            content, reasoning = msg.content, getattr(msg, "reasoning_content", "")
        assert reasoning and content.startswith("Ones: 8 + 6 = 14"), (reasoning, content)
    r = client.chat.completions.create(**{**kw, "stop": [" carry"]})
    assert r.choices[0].message.content == "Ones: 8 + 6 = 14, write 4," and r.choices[0].finish_reason == "stop"


def test_serve_no_think_is_a_default_a_request_overrides(tmp_path):
    with clover_serve(["demo", "-c", "512", "--no-think"], _env(tmp_path / "home")) as (url, _):
        client = _client(_loaded(url))
        plain = client.chat.completions.create(model="demo", messages=QUESTION, max_tokens=60, temperature=0)
        assert not getattr(plain.choices[0].message, "reasoning_content", None)
        assert "= 84" in plain.choices[0].message.content
        on = client.chat.completions.create(model="demo", messages=QUESTION, max_tokens=60, temperature=0,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        assert on.choices[0].message.reasoning_content
        budget = client.chat.completions.create(model="demo", messages=QUESTION, max_tokens=60, temperature=0,
                                                extra_body={"reasoning_budget_tokens": -1})
        assert budget.choices[0].message.reasoning_content
        assert httpx.get(url + "/props").json()["default_generation_settings"]["params"]["reasoning_budget"] == 0


def test_serve_think_flags_that_disagree_are_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "clover_cli", "serve", "demo", "--no-think", "--reasoning-budget",
                          "5"], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, encoding="utf-8",
                         timeout=120)
    assert res.returncode != 0 and "disagree" in res.stderr and "Traceback" not in res.stderr
