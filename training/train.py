"""Train clover's demo model from a seed: corpus, vocabulary, model, GGUF files.

    python training/train.py --seed 0 --steps 1700 --out build/demo

writes OUT/demo-F16.gguf, OUT/demo-Q8_0.gguf, OUT/model.pt (weights and spec, for eval and
re-export) and OUT/train-log.json (the loss curve). With --steps the run is reproducible byte
for byte (seeded data order and masks, deterministic torch ops, a fixed thread count);
--minutes stops at a wall-clock budget instead and prints the step count to rerun with.
Needs the `train` extra (torch).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus as demo_corpus  # noqa: E402
import vocab as demo_vocab  # noqa: E402
from clover_runtime.synth import SynthSpec  # noqa: E402
from export import export  # noqa: E402
from model import CloverLM  # noqa: E402
from objectives import Example, example, losses, make_batch  # noqa: E402

BALANCE_WEIGHT = 0.01


def demo_spec(n_vocab: int, *, hidden: int = 128, layers: int = 12, experts: int = 8, expert_ff: int = 96,
              block_length: int = 32) -> SynthSpec:
    """The demo model's shape: the Clover pattern (3 Gated DeltaNet layers per attention layer),
    top-2 routed experts plus a shared expert, tied embeddings; every row a multiple of 32 (Q8_0)."""
    return SynthSpec(
        hidden=hidden, n_layer=layers, full_attention_interval=4, n_head=4, n_head_kv=2,
        head_dim=32, rope_dim=16, ssm_k_heads=2, ssm_v_heads=4, ssm_state=32,
        n_expert=experts, n_expert_used=2, expert_ff=expert_ff, shared_ff=expert_ff, n_vocab=n_vocab,
        tied_output=True, context_length=4096, block_length=block_length, threshold=0.9, shift_logits=True,
        name="clover-demo",
    )


def tokenize(dialogues: list, tok: object, calls: bool = False) -> list[Example]:
    """Each dialogue's segments, tokenized piece by piece as the model sees them, with the
    assistant pieces that answer a tool's result marked (and with `calls` those that call one)."""
    pieces = [list(demo_corpus.segments(d)) for d in dialogues]
    flat = [text for p in pieces for text, _ in p]
    encoded = iter(e.ids for e in tok.encode_batch(flat, add_special_tokens=False))  # type: ignore[attr-defined]
    return [example([(next(encoded), is_assistant) for _, is_assistant in p],
                    [is_assistant and k > 0 and weighted(p[k - 1][0], text, calls)
                     for k, (text, is_assistant) in enumerate(p)])
            for p in pieces]


def weighted(prompt: str, reply: str, calls: bool) -> bool:
    """Whether an assistant piece's tokens get --tool-answer-weight: it answers a tool's result,
    or (with `calls`) it calls a tool."""
    return answers_a_tool(prompt) or (calls and calls_a_tool(reply))


def answers_a_tool(prompt: str) -> bool:
    """Whether the assistant text after this prompt piece answers a tool's result: the prompt's
    last user turn is a tool response (an earlier round trip in a chat's history does not count)."""
    return "<tool_response>" in prompt[prompt.rfind("<|im_start|>user"):]


def calls_a_tool(reply: str) -> bool:
    """Whether this assistant piece calls a tool: its arguments copy a name or an expression
    from the question, the copy the demo model misses most (a long unseen city)."""
    return "<tool_call>" in reply


def common_prefix(a: Example, b: Example) -> int:
    """Leading tokens two examples share before either one's first assistant token."""
    limit = min(a.spans[0][0] if a.spans else len(a.ids), b.spans[0][0] if b.spans else len(b.ids)) - 1
    n = 0
    while n < limit and a.ids[n] == b.ids[n]:
        n += 1
    return n


def batches(examples: list[Example], batch_tokens: int, rng: random.Random):  # noqa: ANN201
    """Endless batches of similar length in seeded order, each at most `batch_tokens` rows of
    work: a prefix every example of the batch shares (the tool prompt) counts once, as the
    model runs it once (`model.shared_prefix`)."""
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        groups = []
        for g0 in range(0, len(order), 256):
            group = sorted(order[g0:g0 + 256], key=lambda i: (len(examples[i].ids), examples[i].ids))
            batch: list[int] = []
            shared = longest = 0
            for i in group:
                ex = examples[i]
                s = min(shared, common_prefix(examples[batch[0]], ex)) if batch else len(ex.ids)
                n = max(longest, len(ex.ids))
                if batch and s + (len(batch) + 1) * (n - s) > batch_tokens:
                    groups.append(batch)
                    batch, s, n = [], len(ex.ids), len(ex.ids)
                batch.append(i)
                shared, longest = s, n
            if batch:
                groups.append(batch)
        rng.shuffle(groups)
        for g in groups:
            yield [examples[i] for i in g]


COPY_KINDS = ("weather", "echo", "calculator")


def copy_mix(dialogues: list, seed: int, others: int) -> list:
    """The copy phase's dialogues: every one whose reply repeats a name or an expression from the
    prompt (tool calls, echoes), plus a seeded sample of `others` of the rest so that sums and
    facts stay learned."""
    rest = [d for d in dialogues if d.kind not in COPY_KINDS]
    random.Random(f"{seed}:copy-mix").shuffle(rest)
    return [d for d in dialogues if d.kind in COPY_KINDS] + rest[:others]


@dataclass
class Run:
    """What every phase of one training run shares: its options, mask draws, special tokens and
    clock (wall and CPU time since the start, steps taken)."""

    args: argparse.Namespace
    gen: torch.Generator
    mask_id: int
    pad_id: int
    start: float = field(default_factory=time.perf_counter)
    cpu0: float = field(default_factory=time.process_time)
    steps: int = 0


def run_phase(model: CloverLM, examples: list[Example], steps: int, peak_lr: float, order: random.Random,
              run: Run, phase: str, diffusion: bool = True) -> list[dict]:
    """`steps` optimizer steps over `examples` (a fresh AdamW, warm-up then cosine to a tenth of
    `peak_lr`), with the diffusion objective or the causal one alone; returns the logged rows
    (the losses of the row's step, and `answer`: the mean causal loss on the marked spans,
    the answers to a tool's result and as asked the calls, over the steps since the last row).
    `--minutes` bounds the whole run's wall time."""
    args = run.args
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.01)
    feed = batches(examples, args.batch_tokens, order)
    log = []
    answered: list[float] = []  # the `answer` losses since the last row (batches without an answer have none)
    for step in range(steps):
        if args.minutes is not None and time.perf_counter() - run.start > args.minutes * 60:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        batch = make_batch(next(feed), model.spec.block_length, run.mask_id, run.pad_id, run.gen, args.complementary)
        parts = losses(model, batch, diffusion, args.tool_answer_weight)
        total = parts["ar"] + parts["diffusion"] + BALANCE_WEIGHT * parts["balance"]
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run.steps += 1
        if batch.ar_answer.any():
            answered.append(float(parts["answer"]))
        if run.steps % args.log_every == 0 or run.steps == 1:
            row = {"step": run.steps, "phase": phase, "seconds": round(time.perf_counter() - run.start, 1),
                   "cpu_seconds": round(time.process_time() - run.cpu0, 1),
                   **{k: round(float(v.detach()), 4) for k, v in parts.items() if k != "answer"},
                   "answer": round(sum(answered) / len(answered), 4) if answered else None}
            answered = []
            log.append(row)
            print(json.dumps(row), flush=True)
    return log


def lr_at(step: int, total: int, peak: float) -> float:
    """Linear warm-up over the first 5% of the steps, then cosine decay to a tenth of the peak."""
    warmup = max(1, min(100, total // 20))
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init", type=Path, default=None,
                   help="start from another run's model.pt (same seed and corpus options) instead of from scratch")
    p.add_argument("--steps", type=int, default=1700, help="optimizer steps (reproducible)")
    p.add_argument("--minutes", type=float, default=None, help="stop after this much wall time instead")
    p.add_argument("--out", type=Path, default=Path("build/demo"))
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--expert-ff", type=int, default=96)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--arithmetic-pairs", type=int, default=6000)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--complementary", action=argparse.BooleanOptionalAction, default=True,
                   help="train each diffusion block under a mask and its complement")
    p.add_argument("--echoes", type=int, default=0, help="repeat-after-me dialogues per corpus repeat")
    p.add_argument("--name-pieces", action=argparse.BooleanOptionalAction, default=False,
                   help="make most invented place names of the vocabulary's word pieces")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="a first phase, causal loss only, on repeat-after-me dialogues (copying forms there)")
    p.add_argument("--warmup-dialogues", type=int, default=12000, help="repeat-after-me dialogues of the warm-up")
    p.add_argument("--copy-steps", type=int, default=0,
                   help="a final phase of this many steps on the tool and echo dialogues (plus a sample of the rest)")
    p.add_argument("--copy-lr", type=float, default=5e-4)
    p.add_argument("--copy-others", type=int, default=1500, help="other dialogues sampled into the copy phase")
    p.add_argument("--final-steps", type=int, default=0,
                   help="a last phase on the corpus without the repeat-after-me dialogues (at --final-lr)")
    p.add_argument("--final-lr", type=float, default=5e-4)
    p.add_argument("--plain-reports", action=argparse.BooleanOptionalAction, default=True,
                   help="the weather tool answers in words, not JSON (the sky is then the answer's token)")
    p.add_argument("--sky-pieces", action=argparse.BooleanOptionalAction, default=False,
                   help="cut the weather's sky words out of the vocabulary's text, as the cities are "
                        "(corpus.weather_names says why)")
    p.add_argument("--tool-answer-weight", type=float, default=1.0,
                   help="how many times the tokens of an answer to a tool's result count in the losses: its "
                        "sky is one token in a thousand, and unweighted the model answered one sky for all")
    p.add_argument("--weight-tool-calls", action=argparse.BooleanOptionalAction, default=False,
                   help="the tool calls count --tool-answer-weight times too, not only the answers to their results")
    p.add_argument("--chats", type=int, default=150,
                   help="multi-turn chats per corpus repeat (follow-up sums, a fact or a tool call after chat)")
    p.add_argument("--refusals", type=int, default=10, help="out-of-scope questions per corpus repeat")
    p.add_argument("--fact-draws", type=int, default=4, help="questions per fact (and greetings) per corpus repeat")
    p.add_argument("--result-first", action=argparse.BooleanOptionalAction, default=False,
                   help="arithmetic answers state the result before the worked steps")
    return p.parse_args(argv)


def recipe_flags(args: argparse.Namespace) -> list[str]:
    """The options of this run that differ from the defaults and change what is trained (not the
    seed, step count, threads or output folder, which the manifest command spells out)."""
    defaults = vars(parse_args([]))
    flags = []
    for key, value in vars(args).items():
        if key in ("seed", "steps", "minutes", "threads", "out", "log_every", "init") or value == defaults[key]:
            continue
        name = "--" + key.replace("_", "-")
        flags.append((name if value else "--no-" + name[2:]) if isinstance(value, bool) else f"{name} {value}")
    return flags


def source_commit() -> str | None:
    """The commit whose training/ this run uses (with "+dirty" when training/ has uncommitted
    changes), so that the manifest's command names the code it reproduces with; None outside git."""
    root = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=root, capture_output=True,
                               text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    sizes = {"arithmetic_pairs": args.arithmetic_pairs, "repeats": args.repeats, "echoes": args.echoes,
             "result_first": args.result_first, "plain_reports": args.plain_reports, "sky_pieces": args.sky_pieces,
             "chats": args.chats, "refusals": args.refusals, "fact_draws": args.fact_draws}
    corpus = demo_corpus.make_corpus(args.seed, **sizes)
    tok = demo_vocab.train_tokenizer(demo_corpus.vocabulary_texts(corpus.train), args.vocab_size)
    arrays = demo_vocab.vocab_arrays(tok)
    pieces = demo_corpus.name_pieces(arrays.tokens) if args.name_pieces else []
    if pieces:  # the vocabulary comes first; then the names are made of its pieces
        corpus = demo_corpus.make_corpus(args.seed, **sizes, pieces=pieces)
    examples = tokenize(corpus.train, tok, args.weight_tool_calls)
    spec = demo_spec(len(arrays.tokens), hidden=args.hidden, layers=args.layers, experts=args.experts,
                     expert_ff=args.expert_ff)
    model = CloverLM(spec)
    if args.init is not None:
        model.load_state_dict(torch.load(args.init, weights_only=True)["state"])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"corpus {len(examples)} dialogues, {sum(len(e.ids) for e in examples)} tokens; vocabulary "
          f"{len(arrays.tokens)}; model {n_params / 1e6:.2f}M parameters ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    run = Run(args, torch.Generator().manual_seed(args.seed), arrays.special["mask"], arrays.special["pad"])
    log: list[dict] = []
    if args.warmup_steps:
        warm = tokenize(demo_corpus.copy_warmup(args.seed, args.warmup_dialogues, pieces), tok)
        log += run_phase(model, warm, args.warmup_steps, args.lr, random.Random(f"{args.seed}:warmup"), run,
                         "warmup", diffusion=False)
    warmed = run.steps
    log += run_phase(model, examples, args.steps, args.lr, random.Random(args.seed), run, "main")
    main_steps = run.steps - warmed
    if args.copy_steps:
        mix = tokenize(copy_mix(corpus.train, args.seed, args.copy_others), tok, args.weight_tool_calls)
        log += run_phase(model, mix, args.copy_steps, args.copy_lr, random.Random(f"{args.seed}:copy"), run, "copy")
    if args.final_steps:  # the echoes taught the copy; the sums and tool turns settle without them
        plain = [e for e, d in zip(examples, corpus.train, strict=True) if d.kind != "echo"]
        log += run_phase(model, plain, args.final_steps, args.final_lr, random.Random(f"{args.seed}:final"), run,
                         "final")
    step, elapsed, cpu = run.steps, time.perf_counter() - run.start, time.process_time() - run.cpu0
    print(f"{step} steps in {elapsed:.0f} s ({elapsed / max(step, 1):.2f} s/step; CPU time "
          f"{cpu / max(step, 1):.2f} s/step on {args.threads} thread(s))", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model.eval()
    tensors = model.gguf_tensors()
    torch.save({"spec": spec.as_dict(), "state": model.state_dict(), "steps": step, "seed": args.seed},
               args.out / "model.pt")
    (args.out / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    (args.out / "train-log.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                         "steps": step, "main_steps": main_steps,
                                                         "commit": source_commit(),
                                                         "recipe": recipe_flags(args), "seconds": round(elapsed),
                                                         "log": log}, indent=1), encoding="utf-8")
    for quant in ("F16", "Q8_0"):
        path = export(tensors, spec, arrays, args.out / f"demo-{quant}.gguf", quant)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
