"""Evaluate a demo GGUF through clover's own runtime (no torch): the issue's table.

    python training/eval.py build/demo/demo-F16.gguf --seed 0 --limit 100

- held-out arithmetic (pairs never trained on), in diffusion mode (commits checked against
  greedy AR, clover's default, and unchecked, as the vendor's decoder keeps blocks) and in AR
  mode: the stated result correct, and the whole worked answer exact;
- weather round trips for held-out cities: one get_weather call whose arguments are exactly
  {"city": ...}, then the tool's result and the exact final answer;
- tokens per forward and passes per block of the diffusion runs (clover's GenerationStats);
- multi-turn chats, in AR mode and checked diffusion, with the model's own replies as the history:
  three held-out sums in a row (the second and third asked as follow-ups, "And what is 20 + 5?"),
  a fact after a sum, a sum after a weather round trip and a weather call after a sum;
- every fact question (each of the 13 topics, the greeting included) in its trained phrasings and
  in the held-out one, and held-out out-of-scope questions, which get the refusal.
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
    ms = 0.0
    for a, op, b in pairs:
        messages = [{"role": "system", "content": demo_corpus.SYSTEM},
                    {"role": "user", "content": demo_corpus.arithmetic_question(a, op, b)}]
        text, _, stats = reply(chat, messages, DecodeParams(decode=decode, max_tokens=max_tokens, verify=verify))
        m = re.search(rf"\b{a} \{op} {b} = (-?\d+)\.", text)  # the stated result, first or last
        correct += bool(m) and int(m.group(1)) == (a + b if op == "+" else a - b)
        exact += text.strip() in (demo_corpus.arithmetic_answer(a, op, b, first) for first in (False, True))
        generated, forwards = generated + stats.generated_tokens, forwards + stats.forwards
        passes, blocks = passes + stats.passes, blocks + stats.blocks
        ms += stats.gen_ms
    n = max(1, len(pairs))
    return {"accuracy": correct / n, "exact": exact / n, "tokens_per_forward": generated / max(1, forwards),
            "passes_per_block": passes / max(1, blocks), "tokens_per_second": generated / ms * 1e3 if ms else 0.0,
            "n": len(pairs)}


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


def stated(text: str, a: int, op: str, b: int) -> bool:
    """Whether a reply states the right result for a op b."""
    m = re.search(rf"\b{a} \{op} {b} = (-?\d+)\.", text)
    return bool(m) and int(m.group(1)) == (a + b if op == "+" else a - b)


def follow_ups(chat: Any, pairs: list, decode: str, max_tokens: int, turns: int = 3) -> dict[str, Any]:
    """Chats of `turns` held-out sums in a row: the first asked as a first question, the next ones
    as follow-ups ("And what is 20 + 5?", "What about 7 + 19?"), each after the model's own earlier
    replies. Per turn: the share of right results, and of replies about an earlier turn's numbers
    (the old demo's failure: it answered the first question again)."""
    forms = demo_corpus.FOLLOW_UPS
    right = [0] * turns
    earlier = [0] * turns
    n = 0
    misses = []
    for k in range(0, len(pairs) - turns + 1, turns):
        messages = [{"role": "system", "content": demo_corpus.SYSTEM}]
        for t, (a, op, b) in enumerate(pairs[k:k + turns]):
            question = (demo_corpus.arithmetic_question(a, op, b) if t == 0
                        else forms[(t - 1) % 2].format(a=a, op=op, b=b))
            messages.append({"role": "user", "content": question})
            text, _, _ = reply(chat, messages, DecodeParams(decode=decode, max_tokens=max_tokens))
            ok = stated(text, a, op, b)
            right[t] += ok
            if not ok:
                misses.append({"turn": t + 1, "question": question, "answer": text.strip()})
            earlier[t] += any(f"{x} {o} {y} =" in text for x, o, y in pairs[k:k + t])
            messages.append({"role": "assistant", "content": text})
        n += 1
    return {"turn_right": [r / max(1, n) for r in right], "turn_earlier_numbers": [e / max(1, n) for e in earlier],
            "chats": n, "misses": misses}


def fact_questions(chat: Any, decode: str, max_tokens: int) -> dict[str, Any]:
    """Each fact topic (and the greeting) asked in every phrasing: the first one (the topic's main
    question), all the trained ones, and the held-out one; right when the reply is the trained
    answer exactly."""
    topics = [*demo_corpus.FACTS, (demo_corpus.GREETINGS, demo_corpus.GREETING_ANSWER)]
    held = demo_corpus.HELD_OUT_PHRASINGS
    main_right = trained_right = trained_n = held_right = held_n = 0
    misses = []
    for questions, answer in topics:
        for i, question in enumerate(questions):
            messages = [{"role": "system", "content": demo_corpus.SYSTEM}, {"role": "user", "content": question}]
            text, _, _ = reply(chat, messages, DecodeParams(decode=decode, max_tokens=max_tokens))
            ok = text.strip() == answer
            if i >= len(questions) - held:
                held_right, held_n = held_right + ok, held_n + 1
            else:
                trained_right, trained_n = trained_right + ok, trained_n + 1
                main_right += ok and i == 0
            if not ok:
                misses.append({"question": question, "answer": text.strip()})
    return {"main_right": main_right, "topics": len(topics), "trained": trained_right / max(1, trained_n),
            "trained_n": trained_n, "held_out_right": held_right, "held_out_n": held_n, "misses": misses}


def refusals(chat: Any, questions: list[str], decode: str, max_tokens: int) -> dict[str, Any]:
    """Held-out out-of-scope questions: the share answered with the refusal exactly."""
    right = 0
    misses = []
    for question in questions:
        messages = [{"role": "system", "content": demo_corpus.SYSTEM}, {"role": "user", "content": question}]
        text, _, _ = reply(chat, messages, DecodeParams(decode=decode, max_tokens=max_tokens))
        right += text.strip() == demo_corpus.REFUSAL
        if text.strip() != demo_corpus.REFUSAL:
            misses.append({"question": question, "answer": text.strip()})
    return {"right": right / max(1, len(questions)), "n": len(questions), "misses": misses}


def mixed_chats(chat: Any, pairs: list, cities: list[str], seed: int, decode: str, max_tokens: int) -> dict[str, Any]:
    """Per held-out city (with a held-out sum each), three two-turn chats: a fact after a sum (the
    topic's main question), a sum after a weather round trip (the corpus's messages as history),
    and a weather call after a sum (exactly one get_weather call with the asked city)."""
    fact_right = sum_right = call_right = 0
    facts = demo_corpus.FACTS
    for i, city in enumerate(cities):
        a, op, b = pairs[i % len(pairs)]
        first = [{"role": "system", "content": demo_corpus.SYSTEM},
                 {"role": "user", "content": demo_corpus.arithmetic_question(a, op, b)}]
        text, _, _ = reply(chat, first, DecodeParams(decode=decode, max_tokens=max_tokens))
        history = [*first, {"role": "assistant", "content": text}]
        questions, answer = facts[i % len(facts)]
        got, _, _ = reply(chat, [*history, {"role": "user", "content": questions[0]}],
                          DecodeParams(decode=decode, max_tokens=max_tokens))
        fact_right += got.strip() == answer
        _, calls, _ = reply(chat, [*history, {"role": "user", "content": f"What is the weather in {city}?"}],
                            DecodeParams(decode=decode, max_tokens=max_tokens), demo_corpus.TOOLS)
        try:
            call_right += (len(calls) == 1 and calls[0][0] == "get_weather"
                           and json.loads(calls[0][1]) == {"city": city})
        except ValueError:
            pass
        trip = demo_corpus.weather_dialogue(city, None, seed)
        c, o, d = pairs[(i + len(cities)) % len(pairs)]
        got, _, _ = reply(chat, [*trip, {"role": "user", "content": demo_corpus.follow_up_question(c, o, d)}],
                          DecodeParams(decode=decode, max_tokens=max_tokens), demo_corpus.TOOLS)
        sum_right += stated(got, c, o, d)
    n = max(1, len(cities))
    return {"fact_after_sum": fact_right / n, "sum_after_tool": sum_right / n, "tool_after_sum": call_right / n,
            "n": len(cities)}


def single_turn(chat: Any, corpus: demo_corpus.Corpus, args: argparse.Namespace) -> dict[str, Any]:
    """The held-out sums in the three decode modes and the weather round trips."""
    pairs = corpus.held_out_arithmetic[:: max(1, len(corpus.held_out_arithmetic) // args.limit)][:args.limit]
    for decode in ("diffusion", "ar"):  # a process's first reply in a mode loads its kernels: not timed
        arithmetic(chat, pairs[:1], decode, args.max_tokens)
    return {"diffusion": arithmetic(chat, pairs, "diffusion", args.max_tokens),
            "diffusion_unchecked": arithmetic(chat, pairs, "diffusion", args.max_tokens, verify=False),
            "ar": arithmetic(chat, pairs, "ar", args.max_tokens),
            "tool_calls": tool_calls(chat, corpus.held_out_cities, args.seed, args.max_tokens, args.plain_reports)}


def chats(chat: Any, corpus: demo_corpus.Corpus, args: argparse.Namespace) -> dict[str, Any]:
    """Follow-up sums, facts, refusals and mixed chats, in each of --chat-modes."""
    held = corpus.held_out_arithmetic
    pairs = held[1::max(1, len(held) // (3 * args.chats))][:3 * args.chats]
    return {f"chat_{mode}": {"follow_ups": follow_ups(chat, pairs, mode, args.max_tokens),
                             "facts": fact_questions(chat, mode, args.max_tokens),
                             "refusals": refusals(chat, corpus.held_out_refusals, mode, args.max_tokens),
                             "mixed": mixed_chats(chat, pairs, corpus.held_out_cities, args.seed, mode,
                                                  args.max_tokens)}
            for mode in args.chat_modes}


def print_table(result: dict[str, Any]) -> None:
    """The figures in words, on stderr."""
    for mode in ("diffusion", "diffusion_unchecked", "ar"):
        if mode in result:
            r = result[mode]
            print(f"{mode:20s} accuracy {r['accuracy']:.1%}  exact {r['exact']:.1%}  tokens/forward "
                  f"{r['tokens_per_forward']:.2f}  passes/block {r['passes_per_block']:.1f}  "
                  f"{r['tokens_per_second']:.0f} t/s", file=sys.stderr)
    if "tool_calls" in result:
        t = result["tool_calls"]
        print(f"tool calls {t['valid']:.0%} valid, {t['round_trip']:.0%} round trips of {t['n']}", file=sys.stderr)
        for miss in t["misses"]:
            print(f"  missed {miss['city']}: " + (f"called {miss['call']}" if "call" in miss
                                                  else f"answered {miss['answer']!r}"), file=sys.stderr)
    for mode in ("ar", "diffusion"):
        if f"chat_{mode}" not in result:
            continue
        c = result[f"chat_{mode}"]
        f, r, m, u = c["facts"], c["refusals"], c["mixed"], c["follow_ups"]
        turns = ", ".join(f"{x:.0%}" for x in u["turn_right"])
        earlier = ", ".join(f"{x:.0%}" for x in u["turn_earlier_numbers"])
        print(f"{mode:10s} chats: sums by turn {turns} ({u['chats']} chats; an earlier turn's numbers {earlier})",
              file=sys.stderr)
        print(f"{mode:10s} facts: main question {f['main_right']} of {f['topics']}, trained phrasings "
              f"{f['trained']:.0%} of {f['trained_n']}, held-out phrasing {f['held_out_right']} of {f['held_out_n']}; "
              f"refusals {r['right']:.0%} of {r['n']} held out", file=sys.stderr)
        print(f"{mode:10s} mixed ({m['n']}): fact after a sum {m['fact_after_sum']:.0%}, sum after a tool round "
              f"trip {m['sum_after_tool']:.0%}, weather call after a sum {m['tool_after_sum']:.0%}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--seed", type=int, default=0, help="the training seed (it picks the held-out sets)")
    p.add_argument("--limit", type=int, default=100, help="held-out arithmetic pairs to evaluate")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--chats", type=int, default=30, help="three-turn chats of held-out sums, per decode mode")
    p.add_argument("--chat-modes", nargs="+", choices=("ar", "diffusion"), default=["ar", "diffusion"],
                   help="the decode modes of the chat rows (checked diffusion answers as AR does, faster)")
    p.add_argument("--only", choices=("single", "chats"), default=None,
                   help="only the single-turn rows (sums, round trips) or only the chat rows")
    p.add_argument("--plain-reports", action=argparse.BooleanOptionalAction, default=True,
                   help="the weather tool's reports in words, as train.py's default (--no-plain-reports: JSON)")
    args = p.parse_args(argv)
    corpus = demo_corpus.make_corpus(args.seed, arithmetic_pairs=1, repeats=1)
    chat = load_chat(args.model, n_ctx=2048, n_threads=args.threads)
    result = {**(single_turn(chat, corpus, args) if args.only != "chats" else {}),
              **(chats(chat, corpus, args) if args.only != "single" else {})}
    print_table(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
