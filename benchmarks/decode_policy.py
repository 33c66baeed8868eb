"""`--decode auto` against `--decode ar`, side by side in one process (issue 34).

Three tables, every row measured in interleaved rounds (AR and auto, alternating which goes first;
medians):

1. a real-shape file with random weights (previews never agree), greedy, 64 and 512 tokens:
   auto's t/s over AR's (the two decodes stepped in turn, token by token, in one process; the
   median of the rounds' ratios) and whether the text is the same;
2. the shipped demo model on held-out sums (the chat template, thinking off): the wall-clock
   t/s of the default decode over AR's over all sums, and whether every answer is AR's;
3. a draft that is right by construction (unchecked blocks, a fixed number of tokens revealed
   per pass: 32, one all-mask pass a block; 8, four passes) on the real-shape file, for each
   expert coreset: t/s over AR's, with a pass's cost in decode steps over an all-mask block and
   over a half-drafted one and the experts the latter routes to, so the cost model's inputs
   (`--decode auto` keeps a coreset only where it cuts a pass to 0.8 of its cost) are visible.

Each thread count runs in a fresh process state of its own calibration record (a temporary
CLOVER_HOME) after one warm-up reply per model, which is what a user's second reply sees.

    python benchmarks/decode_policy.py [--model FILE] [--threads 1 2] [-n 64 512] [--sums 20] [-r 3]

FILE defaults to a real-shape 4-layer Q4_K_M Clover file written once into clover's cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "training"))


def _real_shape(layers: int) -> Path:
    from clover_runtime.paths import cache_dir
    from clover_runtime.synth import SynthSpec, write_model

    path = cache_dir() / "bench" / f"real-shape-{layers}L-clover-Q4_K_M.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        tmp = path.with_suffix(".tmp")
        write_model(tmp, SynthSpec.real_shape(n_layer=layers, quant="Q4_K_M"))
        tmp.replace(path)
    return path


def _generate(model: Any, prompt: list[int], **kw: Any) -> tuple[list[int], Any]:
    from clover_runtime.decoding import BlockEvent, DecodeParams, generate

    toks: list[int] = []
    stats = None
    for ev in generate(model, prompt, DecodeParams(**kw)):
        if isinstance(ev, BlockEvent):
            toks.extend(ev.token_ids)
        elif hasattr(ev, "stats"):
            stats = ev.stats
    return toks, stats


def _side_by_side(model: Any, prompt: list[int], n: int, first: str) -> dict[str, tuple[list[int], float, Any]]:
    """AR and auto over the same prompt, their generators advanced in turn token by token (each
    decode has its own state), each charged only the seconds spent inside its own steps: the
    seconds this shared machine loses now and then fall on both modes alike, which whole runs
    one after the other (~1-10 s each) do not get."""
    import time

    from clover_runtime.decoding import BlockEvent, DecodeParams, generate

    modes = (first, "auto" if first == "ar" else "ar")
    gens = {m: generate(model, prompt, DecodeParams(decode=m, max_tokens=n)) for m in modes}
    toks: dict[str, list[int]] = {m: [] for m in modes}
    secs = dict.fromkeys(modes, 0.0)
    stats: dict[str, Any] = dict.fromkeys(modes)
    live = list(modes)
    while live:
        for m in list(live):
            t = time.perf_counter()
            ev = next(gens[m], None)
            dt = time.perf_counter() - t
            if ev is None:
                live.remove(m)
            elif isinstance(ev, BlockEvent):
                if toks[m]:  # the first token's step also ran the prompt: charged to neither
                    secs[m] += dt
                toks[m].extend(ev.token_ids)
            elif hasattr(ev, "stats"):
                stats[m] = ev.stats
    return {m: (toks[m], (len(toks[m]) - 1) / secs[m], stats[m]) for m in modes}


def random_weights(path: Path, threads: int, lengths: list[int], rounds: int) -> list[dict]:
    from clover_runtime import load_model
    from clover_runtime.bench import synthetic_tokens

    model = load_model(path, n_threads=threads)
    prompt = synthetic_tokens(16, model.n_vocab, seed=7)
    _generate(model, prompt, decode="auto", max_tokens=64)  # warm-up: kernels and the first measurement
    rows = []
    for n in lengths:
        ratios, ar_ts, auto_ts, same, dg = [], [], [], True, 0
        for k in range(rounds):  # which mode steps first alternates round by round
            got = _side_by_side(model, prompt, n, "ar" if k % 2 == 0 else "auto")
            (a, ar_rate, _), (b, auto_rate, sb) = got["ar"], got["auto"]
            ar_ts.append(ar_rate)
            auto_ts.append(auto_rate)
            ratios.append(auto_rate / ar_rate)
            same &= a == b
            dg += sb.diffusion_tokens
        rows.append({"threads": threads, "n": n, "ar": statistics.median(ar_ts), "auto": statistics.median(auto_ts),
                     "ratio": statistics.median(ratios), "same": same, "diffusion_tokens": dg / rounds,
                     "note": sb.auto_note})
    return rows


def demo_sums(threads: int, n_sums: int, rounds: int, path: Path | None = None) -> dict:
    import corpus as demo_corpus
    from clover_runtime.chat import load_chat
    from clover_runtime.decoding import DecodeParams
    from clover_runtime.demo import demo_path
    from clover_runtime.text.reply import Reply

    chat = load_chat(path or demo_path(), n_ctx=1024, n_threads=threads)
    pairs = demo_corpus.make_corpus(0, arithmetic_pairs=1, repeats=1).held_out_arithmetic
    pairs = pairs[:: max(1, len(pairs) // n_sums)][:n_sums]

    def one(decode: str, a: int, op: str, b: int) -> tuple[str, float, int, int]:
        messages = [{"role": "system", "content": demo_corpus.SYSTEM},
                    {"role": "user", "content": demo_corpus.arithmetic_question(a, op, b)}]
        out = Reply()
        for ev in chat.stream(messages, params=DecodeParams(decode=decode, max_tokens=128),
                              chat_template_kwargs={"enable_thinking": False}):
            out.add(ev)
        return out.content, out.stats.gen_ms, out.stats.generated_tokens, out.stats.diffusion_tokens

    modes = ("ar", "auto", "diffusion")  # diffusion: every block diffusion's, what auto could reach
    for a, op, b in pairs[:5]:  # warm-up
        for mode in modes:
            one(mode, a, op, b)
    ar_ts, auto_ts, forced_ts, same, dg = [], [], [], True, 0
    for _ in range(rounds):
        # sum by sum, the modes in turn (their order rotating), so the seconds this shared machine
        # loses now and then fall on every mode alike
        texts = {m: [] for m in modes}
        ms = dict.fromkeys(modes, 0.0)
        toks = dict.fromkeys(modes, 0)
        dg = 0
        for i, (a, op, b) in enumerate(pairs):
            for mode in modes[i % 3:] + modes[:i % 3]:
                text, t_ms, n, d = one(mode, a, op, b)
                texts[mode].append(text)
                ms[mode] += t_ms
                toks[mode] += n
                dg += d if mode == "auto" else 0
        ar_ts.append(toks["ar"] / ms["ar"] * 1e3)
        auto_ts.append(toks["auto"] / ms["auto"] * 1e3)
        forced_ts.append(toks["diffusion"] / ms["diffusion"] * 1e3)
        same &= texts["ar"] == texts["auto"] == texts["diffusion"]
    ar, auto, forced = statistics.median(ar_ts), statistics.median(auto_ts), statistics.median(forced_ts)
    return {"threads": threads, "sums": len(pairs), "ar": ar, "auto": auto, "ratio": auto / ar, "same": same,
            "diffusion_tokens": dg, "forced": forced / ar}


def pass_steps(model: Any, coreset: int | None, reps: int = 3) -> tuple[float, float, float]:
    """A 32-row preview pass in decode steps over an all-mask block and over a half-drafted one
    (within `coreset` experts), and the experts a half-drafted pass used per layer: an all-mask
    block's rows route alike, so only a pass over drafted tokens shows what a coreset saves."""
    import time

    import numpy as np
    from clover_runtime.decoding.draft_cost import half_drafted

    n = int(model.config.diffusion.block_length)
    mask = int(model.config.diffusion.mask_token_id)
    half = half_drafted(model, n)
    state = model.new_state(n + 20)
    model.forward(list(range(16)), state, last_only=True)
    snap = state.copy()

    def best(fn: Any) -> float:
        ts = []
        for _ in range(reps + 1):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
            model.restore(state, snap)
        return min(ts[1:])

    step = best(lambda: model.forward([5], state, last_only=True))
    rows = list(range(n))
    empty = best(lambda: model.preview([mask] * n, state, logit_rows=rows, expert_coreset=coreset))
    drafted = best(lambda: model.preview(half, state, logit_rows=rows, expert_coreset=coreset))
    used = model.preview(half, state, logit_rows=rows, expert_coreset=coreset).experts_per_layer
    return empty / step, drafted / step, float(np.mean(used))


def forced_drafts(path: Path, threads: int, coresets: list[int | None], rounds: int,
                  reveal_ks: list[int]) -> list[dict]:
    """Unchecked blocks revealing a fixed `reveal_k` per pass (32: one all-mask pass a block; 8: four
    passes, three over drafted tokens), for each coreset, against AR, with what a pass costs."""
    from clover_runtime import load_model
    from clover_runtime.bench import synthetic_tokens
    from clover_runtime.text.reply import Timings

    model = load_model(path, n_threads=threads)
    prompt = synthetic_tokens(16, model.n_vocab, seed=7)
    rows = []
    for core in coresets:
        costs = pass_steps(model, core)
        for k in reveal_ks:
            kw = {"decode": "diffusion", "verify": False, "reveal_k": k, "expert_coreset": core, "max_tokens": 64}
            _generate(model, prompt, **kw)
            ar_ts, dg_ts = [], []
            for _ in range(rounds):
                ar_ts.append(Timings.of(_generate(model, prompt, decode="ar", max_tokens=64)[1]).predicted_per_second)
                dg_ts.append(Timings.of(_generate(model, prompt, **kw)[1]).predicted_per_second)
            ar, dg = statistics.median(ar_ts), statistics.median(dg_ts)
            rows.append({"threads": threads, "coreset": core or "all", "reveal_k": k, "ar": ar, "dg": dg,
                         "ratio": dg / ar, "empty_steps": costs[0], "drafted_steps": costs[1], "experts": costs[2]})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a Clover GGUF with random weights")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("-n", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--sums", type=int, default=20, help="the demo's held-out sums (0: none)")
    ap.add_argument("--coresets", type=int, nargs="*", default=[0, 16, 8], help="0: every expert")
    ap.add_argument("--reveal-ks", type=int, nargs="+", default=[32, 8],
                    help="tokens a forced draft reveals per pass")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--demo-only", action="store_true", help="only the demo's held-out sums")
    ap.add_argument("--demo", type=Path, default=None, help="another demo file (default: the shipped one)")
    args = ap.parse_args(argv)
    path = None if args.demo_only else args.model or _real_shape(args.layers)
    home = os.environ.get("CLOVER_HOME")
    print(f"model: {path}\n")
    print("| threads | tokens | AR t/s | auto t/s | auto/AR | same text | diffusion tokens | auto's banner |")
    print("|---|---|---|---|---|---|---|---|")
    demo, forced = [], []
    for t in args.threads:
        with tempfile.TemporaryDirectory() as tmp:  # each thread count measures its own costs
            os.environ["CLOVER_HOME"] = tmp
            from clover_runtime.decoding import calibration

            calibration._memory.clear()
            for r in [] if args.demo_only else random_weights(path, t, args.n, args.rounds):
                print(f"| {t} | {r['n']} | {r['ar']:.2f} | {r['auto']:.2f} | **{r['ratio']:.2f}×** | {r['same']} | "
                      f"{r['diffusion_tokens']:.0f} | {r['note']} |", flush=True)
            if args.sums > 0:
                demo.append(demo_sums(t, args.sums, args.rounds, args.demo))
            if not args.demo_only:
                forced += forced_drafts(path, t, [c or None for c in args.coresets], args.rounds, args.reveal_ks)
            calibration.flush()  # before its folder goes
    if home is None:
        os.environ.pop("CLOVER_HOME", None)
    else:
        os.environ["CLOVER_HOME"] = home
    print("\n| threads | held-out sums | AR t/s | default t/s | default/AR | every answer AR's | diffusion tokens "
          "| --decode diffusion/AR |")
    print("|---|---|---|---|---|---|---|---|")
    for d in demo:
        print(f"| {d['threads']} | {d['sums']} | {d['ar']:.1f} | {d['auto']:.1f} | **{d['ratio']:.2f}×** | "
              f"{d['same']} | {d['diffusion_tokens']} | {d['forced']:.2f}× |")
    print("\n| threads | expert coreset | tokens a pass | AR t/s | forced drafts t/s | ratio | all-mask pass "
          "(decode steps) | half-drafted pass (decode steps) | experts a layer (half-drafted) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for f in forced:
        print(f"| {f['threads']} | {f['coreset']} | {f['reveal_k']} | {f['ar']:.2f} | {f['dg']:.2f} | "
              f"{f['ratio']:.2f}× | {f['empty_steps']:.1f} | {f['drafted_steps']:.1f} | {f['experts']:.0f} |")


if __name__ == "__main__":
    main()
