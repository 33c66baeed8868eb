"""Ship a trained demo model: copy its Q8_0 file into the package and record where it came from.

    python training/ship.py build/demo

copies OUT/demo-Q8_0.gguf to runtime/demo/clover-demo-Q8_0.gguf (what `demo` names) and writes
training/demo-manifest.json: the command that reproduces the file and the commit whose training/
it ran (a later corpus trains another file), the seed and step count, the training time, the
file's size and sha256 (tests/test_demo_model.py checks the shipped file against it). Needs no torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "runtime" / "demo" / "clover-demo-Q8_0.gguf"
MANIFEST = ROOT / "training" / "demo-manifest.json"


def _command(log: dict, out: str, init: str | None = None) -> str:
    """The train.py command line a run's train-log.json records."""
    args = log["args"]
    start = [f"--init {init}"] if init else []
    return " ".join(["python training/train.py", f"--seed {args['seed']}", *start,
                     f"--steps {log.get('main_steps', log['steps'])}", *log.get("recipe", []),
                     f"--threads {args['threads']}", f"--out {out}"])


def manifest(out: Path, shipped: Path) -> dict:
    """What the run in `out` was (its train-log.json, and that of the run it started from with
    `--init`: the command then trains that one first, and times and steps add up) and what was
    shipped from it."""
    log = json.loads((out / "train-log.json").read_text(encoding="utf-8"))
    args = log["args"]
    last = log["log"][-1]
    init = args.get("init")
    base = None if init in (None, "None") else json.loads((Path(init).parent / "train-log.json").read_text("utf-8"))
    runs = [log] if base is None else [base, log]
    commands = [_command(log, "build/demo")] if base is None else [
        _command(base, "build/demo-base"), _command(log, "build/demo", "build/demo-base/model.pt")]
    return {
        "file": shipped.name,
        "sha256": hashlib.sha256(shipped.read_bytes()).hexdigest(),
        "bytes": shipped.stat().st_size,
        "seed": int(args["seed"]),
        "steps": sum(int(r["steps"]) for r in runs),
        "threads": int(args["threads"]),
        "train_seconds": sum(int(r["seconds"]) for r in runs),
        "train_cpu_seconds": round(sum(float(r["log"][-1]["cpu_seconds"]) for r in runs), 1),
        "command": " && ".join([*commands, "python training/ship.py build/demo"]),
        "training_commit": log.get("commit"),
        "final_losses": {k: last[k] for k in ("ar", "diffusion", "balance") if k in last},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the training run's output folder (train.py --out)")
    args = p.parse_args(argv)
    shutil.copyfile(args.out / "demo-Q8_0.gguf", SHIPPED)
    doc = manifest(args.out, SHIPPED)
    MANIFEST.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"shipped {SHIPPED.relative_to(ROOT)} ({doc['bytes'] / 1e6:.1f} MB, sha256 {doc['sha256'][:12]}…)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
