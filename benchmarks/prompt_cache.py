"""Prefix reuse on an agent loop: prefilled tokens and time to first token per turn, cache off vs on.

A three-turn agent conversation through the real chat session (template, tokenizer, engine):
a long system prompt with three tool definitions and a question (turn 1), the assistant's tool
call and the tool's result (turn 2), the answer and a follow-up question (turn 3). Each turn asks
for one token (autoregressive: the first token comes straight from the prefill), so the time
measured is the time to first token. Both columns run in this one process, cache off first,
after a warm-up that compiles the kernels.

    python benchmarks/prompt_cache.py MODEL.gguf [--system-tokens 2000] [--threads 2]

MODEL: e.g. `clover make-model /tmp/real4.gguf --preset real-shape --layers 4`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather and a short forecast for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "days": {"type": "integer", "description": "Days of forecast, 1 to 7"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_files", "description": "Search the project's files for a regular expression.",
        "parameters": {"type": "object", "properties": {
            "pattern": {"type": "string"}, "path": {"type": "string", "description": "Folder to search"}},
            "required": ["pattern"]}}},
    {"type": "function", "function": {
        "name": "run_command", "description": "Run a shell command in the sandbox and return its output.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"}, "timeout_s": {"type": "integer"}}, "required": ["command"]}}},
]

RULES = [
    "Always answer in the user's language and keep answers short unless asked for detail.",
    "Prefer calling a tool over guessing when the answer depends on live data or the file system.",
    "Never run a command that deletes files without asking the user first.",
    "When a tool fails, say what failed and suggest one next step.",
    "Quote file paths and commands exactly, in backticks.",
    "Summarise long tool output instead of repeating it.",
]


def system_prompt(session, n_tokens: int) -> str:  # noqa: ANN001
    """Numbered agent rules, repeated until the text is about `n_tokens` tokens long."""
    lines, i = ["You are a careful coding and research agent working for one user."], 0
    while len(session.tokenizer.encode("\n".join(lines))) < n_tokens:
        lines.append(f"{i + 1}. {RULES[i % len(RULES)]}")
        i += 1
    return "\n".join(lines)


def conversation(system: str) -> list[list[dict]]:
    """The messages of each of the three turns."""
    q = [{"role": "system", "content": system},
         {"role": "user", "content": "What is the weather in Paris for the next three days?"}]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Paris", "days": 3}}}]}
    result = {"role": "tool", "tool_call_id": "call_1",
              "content": json.dumps({"city": "Paris", "days": [{"max_c": 18, "sky": "sunny"},
                                                               {"max_c": 16, "sky": "cloudy"},
                                                               {"max_c": 14, "sky": "rain"}]})}
    answer = {"role": "assistant", "content": "Paris: 18 °C and sunny today, 16 °C and cloudy tomorrow, "
                                              "then 14 °C with rain."}
    follow = {"role": "user", "content": "Should I take an umbrella on Thursday?"}
    return [q, q + [call, result], q + [call, result, answer, follow]]


def one_turn(session, messages: list[dict], cache) -> dict:  # noqa: ANN001
    from clover_runtime.decoding import DecodeParams
    from clover_runtime.text.reply import Finished

    params = DecodeParams(decode="ar", max_tokens=1)
    t0 = time.perf_counter()
    done = None
    for ev in session.stream(messages, tools=TOOLS, params=params, cache=cache,
                             chat_template_kwargs={"enable_thinking": False}):
        if isinstance(ev, Finished):
            done = ev
    ttft = time.perf_counter() - t0
    assert done is not None
    return {"prompt": done.usage.prompt_tokens, "cached": done.usage.cached_tokens,
            "prefilled": done.timings.prompt_n, "ttft_s": ttft}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    args = ap.parse_args()

    from clover_runtime.chat import load_chat

    session = load_chat(args.model, n_ctx=args.ctx, n_threads=args.threads)
    turns = conversation(system_prompt(session, args.system_tokens))
    one_turn(session, [{"role": "user", "content": "warm-up " * 80}], None)  # compile the kernels
    off = [one_turn(session, m, None) for m in turns]
    cache = session.new_cache()
    on = [one_turn(session, m, cache) for m in turns]
    print(f"model: {Path(args.model).name}, backend {session.model.backend}, threads {args.threads or 'default'}")
    print("| turn | prompt tokens | cache off: prefilled | cache off: TTFT s | cache on: prefilled "
          "| cache on: reused | cache on: TTFT s | on/off TTFT |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(zip(off, on, strict=True), 1):
        print(f"| {i} | {a['prompt']} | {a['prefilled']} | {a['ttft_s']:.2f} | {b['prefilled']} | {b['cached']} "
              f"| {b['ttft_s']:.2f} | {b['ttft_s'] / a['ttft_s']:.1%} |")
    print(f"checkpoints held: {len(cache.checkpoints)} at {[c.n_past for c in cache.checkpoints]}, "
          f"{cache.checkpoint_bytes / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
