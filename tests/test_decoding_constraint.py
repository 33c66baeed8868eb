"""Constrained decoding (decoding/constraint.py) on the shipped demo model: masks, AR and block
diffusion under a grammar, the `clover run` flags, and no grammar work for an unconstrained reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from clover_runtime.chat import load_chat
from clover_runtime.decoding import BlockEvent, DecodeParams, DoneEvent, SamplingParams, generate
from clover_runtime.decoding.constraint import GrammarError
from clover_runtime.demo import demo_path

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "sunny": {"type": "boolean"},
                                           "temp": {"type": "integer", "minimum": -40, "maximum": 50}},
          "required": ["city", "sunny", "temp"], "additionalProperties": False}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def session():  # noqa: ANN201
    return load_chat(demo_path(), n_ctx=1024)


def _tokens(session, params: DecodeParams) -> tuple[list[int], object]:  # noqa: ANN001
    prompt = session.prepare(QUESTION, chat_template_kwargs={"enable_thinking": False})
    out, stats = [], None
    for ev in generate(session.model, prompt.ids, session._params(params)):
        if isinstance(ev, BlockEvent):
            out.extend(ev.token_ids)
        elif isinstance(ev, DoneEvent):
            stats = ev.stats
    return out, stats


def test_mask_allows_only_what_the_grammar_accepts(session) -> None:  # noqa: ANN001
    tok = session.tokenizer
    con = session.compile_grammar("gbnf", 'root ::= "yes" | "no"').start()
    stops = sorted(tok.stop_ids)
    logits = np.zeros(session.model.config.n_vocab, dtype=np.float32)
    first = np.flatnonzero(np.isfinite(con.mask(logits, stops)))
    assert first.size and all("yes".startswith(tok.decode([t])) or "no".startswith(tok.decode([t])) for t in first)
    assert not set(stops) & set(first.tolist())  # nothing is complete yet: no stop
    ahead = con.fork()
    for t in tok.encode("yes"):
        assert ahead.advance(t)
    assert ahead.is_accepting() and not con.is_accepting()  # the fork moved, the original did not
    assert set(np.flatnonzero(np.isfinite(ahead.mask(logits, stops))).tolist()) == set(stops)
    assert not ahead.advance(tok.encode("x")[0])


def test_constrained_diffusion_writes_exactly_what_constrained_ar_writes(session) -> None:  # noqa: ANN001
    grammar = session.compile_grammar("json_schema", SCHEMA)
    free, _ = _tokens(session, DecodeParams(decode="ar", max_tokens=48))
    with pytest.raises(json.JSONDecodeError):
        json.loads(session.tokenizer.decode(free))  # the premise: left alone, the model writes no JSON
    runs = {}
    for mode in ("ar", "diffusion"):
        runs[mode], stats = _tokens(session, DecodeParams(decode=mode, max_tokens=64, grammar=grammar))
        assert stats.decode_mode == mode and stats.finish_reason == "stop"
    assert runs["ar"] == runs["diffusion"]
    jsonschema.validate(json.loads(session.tokenizer.decode(runs["ar"])), SCHEMA)


def test_sampled_and_unverified_replies_keep_the_grammar(session) -> None:  # noqa: ANN001
    grammar = session.compile_grammar("json_schema", SCHEMA)
    for seed in (1, 2, 3):
        sp = SamplingParams(temperature=1.0, seed=seed)
        toks, stats = _tokens(session, DecodeParams(decode="diffusion", max_tokens=64, grammar=grammar, sampling=sp))
        jsonschema.validate(json.loads(session.tokenizer.decode(toks)), SCHEMA)
    # Unchecked blocks cannot be constrained: such a request decodes as AR instead.
    toks, stats = _tokens(session, DecodeParams(decode="diffusion", verify=False, max_tokens=64, grammar=grammar))
    assert stats.decode_mode == "ar" and "verified" in stats.reason
    jsonschema.validate(json.loads(session.tokenizer.decode(toks)), SCHEMA)


def test_bad_grammars_are_one_line_errors(session) -> None:  # noqa: ANN001
    for kind, spec in [("json_schema", {"type": "nope"}), ("json_schema", "{not json"), ("json_schema", "[1]"),
                       ("gbnf", 'root ::= ( "a"'), ("gbnf", "root ::= missing"), ("lark", "start: nothing"),
                       ("regex", "a(")]:
        with pytest.raises(GrammarError) as info:
            session.compile_grammar(kind, spec)
        assert info.value.message and "\n" not in info.value.message, (kind, spec)


def test_an_unconstrained_reply_never_loads_the_grammar_library(session) -> None:  # noqa: ANN001
    """The constraint costs an unconstrained request nothing: llguidance is not even imported."""
    code = ("import sys\nfrom clover_runtime.chat import load_chat\nfrom clover_runtime.demo import demo_path\n"
            "from clover_runtime.decoding import DecodeParams\n"
            "s = load_chat(demo_path(), n_ctx=256)\n"
            "list(s.stream([{'role': 'user', 'content': 'hi'}], params=DecodeParams(max_tokens=8)))\n"
            "print('llguidance' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
    # ...and with a grammar it is.
    assert replace(DecodeParams(), grammar=session.compile_grammar("regex", "a+")).grammar is not None
    assert "llguidance" in sys.modules


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "clover_cli", "run", "demo", *args], capture_output=True, text=True,
                          env=env, timeout=300, input="")


def test_clover_run_json_schema_prints_valid_json(tmp_path: Path) -> None:
    res = _run(["What is the weather in Paris?", "--json-schema", json.dumps(SCHEMA), "-n", "64"], tmp_path)
    assert res.returncode == 0, res.stderr
    jsonschema.validate(json.loads(res.stdout), SCHEMA)
    grammar = tmp_path / "yn.gbnf"
    grammar.write_text('root ::= ("yes" | "no") "."\n', encoding="utf-8")
    res = _run(["Is it sunny?", "--grammar-file", str(grammar), "-n", "8"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() in ("yes.", "no.")
    bad = _run(["hi", "--json-schema", '{"type": "nope"}'], tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == ["error: --json-schema: Invalid type: nope"]
    both = _run(["hi", "--grammar", 'root ::= "a"', "--json-schema", "{}"], tmp_path)
    assert both.returncode == 2 and "--grammar and --json-schema" in both.stderr  # a usage error
