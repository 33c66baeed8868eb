"""Evaluate a demo GGUF through clover's own runtime (no torch): the issue's table.

    python training/eval.py build/demo/demo-F16.gguf --seed 0 --limit 100

- held-out arithmetic (pairs never trained on), in diffusion mode (commits checked against
  greedy AR, clover's default, and unchecked, as the vendor's decoder keeps blocks) and in AR
  mode: the stated result correct, and the whole worked answer exact;
- weather round trips for held-out cities: one get_weather call whose arguments are exactly
  {"city": ...}, then the tool's result and the exact final answer;
- tokens per forward and passes per block of the diffusion runs (clover's GenerationStats).
Prints one JSON object (and a small table on stderr).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus as demo_corpus  # noqa: E402
from clover_runtime.chat import load_chat  # noqa: E402
from clover_runtime.decoding.params import DecodeParams  # noqa: E402
from clover_runtime.text.reply import Reply  # noqa: E402

NO_THINK = {"enable_thinking": False}


def reply(chat: Any, messages: list[dict], params: DecodeParams, tools: list | None = None) -> tuple[str, list, Any]:
    """(content, tool calls as (name, arguments text), stats) of one reply."""
    out = Reply()
    for ev in chat.stream(messages, tools=tools, params=params, chat_template_kwargs=NO_THINK):
        out.add(ev)
    return out.content, [[c.name, c.arguments] for c in out.calls], out.stats


def arithmetic(chat: Any, pairs: list, decode: str, max_tokens: int, verify: bool | None = None) -> dict[str, float]:
    correct = exact = generated = forwards = passes = blocks = 0
    for a, op, b in pairs:
        messages = [{"role": "system", "content": demo_corpus.SYSTEM},
                    {"role": "user", "content": demo_corpus.arithmetic_question(a, op, b)}]
        text, _, stats = reply(chat, messages, DecodeParams(decode=decode, max_tokens=max_tokens, verify=verify))
        m = re.search(rf"\b{a} \{op} {b} = (-?\d+)\.", text)  # the stated result, first or last
        correct += bool(m) and int(m.group(1)) == (a + b if op == "+" else a - b)
        exact += text.strip() in (demo_corpus.arithmetic_answer(a, op, b, first) for first in (False, True))
        generated, forwards = generated + stats.generated_tokens, forwards + stats.forwards
        passes, blocks = passes + stats.passes, blocks + stats.blocks
    n = max(1, len(pairs))
    return {"accuracy": correct / n, "exact": exact / n, "tokens_per_forward": generated / max(1, forwards),
            "passes_per_block": passes / max(1, blocks), "n": len(pairs)}


def weather_turns(city: str, seed: int, plain: bool = True) -> tuple[list[dict], dict, str]:
    """The question's messages, the tool's result message and the final answer, as the corpus's
    dialogue for this city holds them (the tool's report depends on the seed and the city)."""
    dialogue = demo_corpus.weather_dialogue(city, None, seed, plain)
    question = dialogue[:-3]
    return question, dialogue[-2], dialogue[-1]["content"]


def tool_calls(chat: Any, cities: list[str], seed: int, max_tokens: int, plain: bool = True) -> dict[str, float]:
    """A weather round trip per city: exactly one get_weather call with {"city": city}, then, given
    the tool's result, the final answer the corpus would give (city, temperature and sky copied)."""
    calls_ok = round_trips = 0
    misses = []
    for city in cities:
        question, result, answer = weather_turns(city, seed, plain)
        content, calls, _ = reply(chat, question, DecodeParams(max_tokens=max_tokens), demo_corpus.TOOLS)
        try:
            ok = len(calls) == 1 and calls[0][0] == "get_weather" and json.loads(calls[0][1]) == {"city": city}
        except ValueError:
            ok = False
        calls_ok += ok
        if not ok:
            misses.append({"city": city, "call": calls or content})
            continue
        turn = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}]}
        text, _, _ = reply(chat, [*question, turn, result], DecodeParams(max_tokens=max_tokens), demo_corpus.TOOLS)
        if text.strip() == answer:
            round_trips += 1
        else:
            misses.append({"city": city, "answer": text.strip(), "expected": answer})
    n = max(1, len(cities))
    return {"valid": calls_ok / n, "round_trip": round_trips / n, "n": len(cities), "misses": misses}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--seed", type=int, default=0, help="the training seed (it picks the held-out sets)")
    p.add_argument("--limit", type=int, default=100, help="held-out arithmetic pairs to evaluate")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--plain-reports", action=argparse.BooleanOptionalAction, default=True,
                   help="the weather tool's reports in words, as train.py's default (--no-plain-reports: JSON)")
    args = p.parse_args(argv)
    corpus = demo_corpus.make_corpus(args.seed, arithmetic_pairs=1, repeats=1)
    pairs = corpus.held_out_arithmetic[:: max(1, len(corpus.held_out_arithmetic) // args.limit)][:args.limit]
    chat = load_chat(args.model, n_ctx=2048, n_threads=args.threads)
    result = {"diffusion": arithmetic(chat, pairs, "diffusion", args.max_tokens),
              "diffusion_unchecked": arithmetic(chat, pairs, "diffusion", args.max_tokens, verify=False),
              "ar": arithmetic(chat, pairs, "ar", args.max_tokens),
              "tool_calls": tool_calls(chat, corpus.held_out_cities, args.seed, args.max_tokens,
                                       args.plain_reports)}
    for mode in ("diffusion", "diffusion_unchecked", "ar"):
        r = result[mode]
        print(f"{mode:20s} accuracy {r['accuracy']:.1%}  exact {r['exact']:.1%}  tokens/forward "
              f"{r['tokens_per_forward']:.2f}  passes/block {r['passes_per_block']:.1f}", file=sys.stderr)
    t = result["tool_calls"]
    print(f"tool calls {t['valid']:.0%} valid, {t['round_trip']:.0%} round trips of {t['n']}", file=sys.stderr)
    for miss in t["misses"]:
        print(f"  missed {miss['city']}: " + (f"called {miss['call']}" if "call" in miss
                                              else f"answered {miss['answer']!r}"), file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
