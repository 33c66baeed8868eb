"""A JSON-schema-constrained reply against the same reply unconstrained (issue 36's target: ≤ 1.2×).

Per model and decode mode, in interleaved rounds (free, then constrained; medians), the seconds
of an `-n`-token reply, prefill included (no stop tokens: both replies run to max_tokens = n, the
constrained one inside one long JSON string) and the seconds per generated token, plus the one-off costs a
constrained request adds before its first token: llguidance's view of the vocabulary (once per
tokenizer) and the grammar's compilation (per request).

    python benchmarks/constrained.py [--model FILE ...] [-n 32] [-r 5] [--decode ar diffusion]

FILE defaults to the shipped demo model (952 tokens) and, when it exists, a real-shape 4-layer file
with the real 248,320-token Qwen3.6 vocabulary. Forced diffusion on a random-weight file is slow
(its previews never agree): use `--decode ar auto` there.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Answer in JSON."}]


def _reply(session: Any, ids: list[int], params: Any) -> tuple[float, int]:
    """Seconds and tokens of one reply, prefill included; no stop token ends it before max_tokens."""
    from clover_runtime.decoding import DoneEvent, generate

    t0 = time.perf_counter()
    n = 0
    for ev in generate(session.model, ids, params):
        if isinstance(ev, DoneEvent):
            n = ev.stats.generated_tokens
    return time.perf_counter() - t0, n


def bench(path: Path, decode: str, n: int, rounds: int, threads: int | None) -> dict[str, Any]:
    from clover_runtime.chat import load_chat
    from clover_runtime.decoding import DecodeParams
    from clover_runtime.decoding import constraint as con

    session = load_chat(path, n_ctx=512, n_threads=threads)
    t0 = time.perf_counter()
    con.ll_tokenizer(session.tokenizer)
    vocab_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = session.compile_grammar("json_schema", SCHEMA)
    compile_s = time.perf_counter() - t0
    ids = session.prepare(MESSAGES, chat_template_kwargs={"enable_thinking": False}).ids
    free = replace(session._params(DecodeParams(decode=decode, max_tokens=n)), stop_ids=frozenset())
    bound = replace(free, grammar=grammar)
    _reply(session, ids, free)  # warm-up: kernels, calibration record
    _reply(session, ids, bound)
    times: dict[str, list[tuple[float, int]]] = {"free": [], "constrained": []}
    for _ in range(rounds):
        times["free"].append(_reply(session, ids, free))
        times["constrained"].append(_reply(session, ids, bound))
    row: dict[str, Any] = {"model": path.name, "vocab": session.tokenizer.n_vocab, "decode": decode,
                           "vocab_s": vocab_s, "compile_s": compile_s}
    for key, runs in times.items():
        row[key + "_s"] = statistics.median(t for t, _ in runs)
        row[key + "_tokens"] = statistics.median(k for _, k in runs)
        row[key + "_spt"] = statistics.median(t / max(k, 1) for t, k in runs)
    row["ratio"] = row["constrained_s"] / row["free_s"]
    row["ratio_per_token"] = row["constrained_spt"] / row["free_spt"]
    return row


def _default_models() -> list[Path]:
    from clover_runtime.demo import demo_path
    from clover_runtime.paths import cache_dir

    models = [demo_path()]
    for candidate in (Path("/work/models/rs4.gguf"), cache_dir() / "bench" / "real-shape-4L-clover-Q4_K_M.gguf"):
        if candidate.exists():
            models.append(candidate)
            break
    return models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, nargs="*")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--decode", nargs="*", default=["ar", "diffusion"])
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    print(f"| model | vocab | decode | free s ({args.n} tok) | constrained s | × | × per token "
          "| vocab view s (once) | grammar compile s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for path in args.model or _default_models():
        for decode in args.decode:
            r = bench(path, decode, args.n, args.rounds, args.threads)
            print(f"| {r['model']} | {r['vocab']} | {decode} | {r['free_s']:.3f} ({r['free_tokens']:g}) "
                  f"| {r['constrained_s']:.3f} ({r['constrained_tokens']:g}) | {r['ratio']:.2f} "
                  f"| {r['ratio_per_token']:.2f} | {r['vocab_s']:.2f} | {r['compile_s'] * 1e3:.1f} ms |", flush=True)


if __name__ == "__main__":
    main()
