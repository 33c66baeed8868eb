"""`clover bench -o md|csv|json|jsonl`: the runtime's llama-bench records as a markdown table (with a
build/CPU footer), CSV, a JSON array or JSON lines."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from typing import Any

from clover_runtime.bench import BuildInfo
from clover_runtime.errors import CloverError

OUTPUT_FORMATS = ("md", "csv", "json", "jsonl")


def _varying(recs: Sequence[dict], key: str, default: Any) -> bool:
    values = {json.dumps(r.get(key)) for r in recs}
    return len(values) > 1 or (bool(recs) and recs[0].get(key) != default)


def render(recs: Sequence[dict], fmt: str, build: BuildInfo) -> str:
    """The results as a markdown table (with build/CPU footer), CSV, a JSON array or JSON lines."""
    if fmt == "json":
        return json.dumps(list(recs), indent=2) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in recs)
    if fmt == "csv":
        buf = io.StringIO()
        if recs:
            w = csv.DictWriter(buf, fieldnames=list(recs[0].keys()), lineterminator="\n")
            w.writeheader()
            for r in recs:
                w.writerow({k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in r.items()})
        return buf.getvalue()
    if fmt != "md":
        raise CloverError(f"unknown output format '{fmt}' (choose from {', '.join(OUTPUT_FORMATS)})")
    return _markdown(recs, build)


def _markdown(recs: Sequence[dict], build: BuildInfo) -> str:
    cols: list[tuple[str, Callable[[dict], str], str]] = [
        ("model", lambda r: r["model_type"], "l"),
        ("size", lambda r: f"{r['model_size'] / 2**30:.2f} GiB", "r"),
        ("params", lambda r: _params(r["model_n_params"]), "r"),
        ("backend", lambda r: f"{r.get('backends', 'CPU')} ({r['clover_backend']})", "l"),
        ("threads", lambda r: str(r["n_threads"]), "r"),
    ]
    if _varying(recs, "block_length", None):
        cols.append(("block", lambda r: "-" if r["block_length"] is None else str(r["block_length"]), "r"))
    if _varying(recs, "reveal_k", None):
        cols.append(("reveal k", lambda r: "-" if r.get("reveal_k") is None else str(r["reveal_k"]), "r"))
    if _varying(recs, "threshold", None):
        cols.append(("threshold", lambda r: "-" if r["threshold"] is None else f"{r['threshold']:g}", "r"))
    if _varying(recs, "expert_coreset", None):
        cols.append(("coreset", lambda r: "-" if r["expert_coreset"] is None else str(r["expert_coreset"]),
                     "r"))
    cols.append(("test", lambda r: r["test"], "r"))
    cols.append(("t/s", lambda r: f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}", "r"))
    if any(r["diffusion"] for r in recs):
        cols.append(("tok/fwd", lambda r: f"{r['tokens_per_forward']:.2f}" if r["diffusion"] else "", "r"))
        cols.append(("passes/blk", lambda r: f"{r['passes_per_block']:.2f}" if r["diffusion"] else "", "r"))
        # a pass's cost in decode steps = the tokens per pass diffusion needs to beat AR (break-even)
        cols.append(("pass cost", lambda r: f"{r['pass_steps']:.1f} steps" if r.get("pass_steps") else "", "r"))
    cells = [[fn(r) for _, fn, _ in cols] for r in recs]
    widths = [max([len(name)] + [len(row[i]) for row in cells]) for i, (name, _, _) in enumerate(cols)]

    def line(values: Sequence[str]) -> str:
        parts = [v.ljust(w) if a == "l" else v.rjust(w)
                 for v, w, (_, _, a) in zip(values, widths, cols, strict=True)]
        return "| " + " | ".join(parts) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if a == "r" else "-" * w
                             for w, (_, _, a) in zip(widths, cols, strict=True)) + " |"
    lines = [line([c[0] for c in cols]), rule] + [line(row) for row in cells]
    footer = f"\nbuild: clover {build.version} ({build.commit})\ncpu: {build.cpu}"
    if build.cpu_detail:
        footer += f" ({build.cpu_detail})"
    return "\n".join(lines) + "\n" + footer + "\n"


def _params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    return f"{n / 1e3:.2f} K"
