"""`clover bench -o md|csv|json|jsonl`: the runtime's llama-bench records as a markdown table (with a
build/CPU footer), CSV, a JSON array or JSON lines."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from clover_runtime.bench import BuildInfo
from clover_runtime.errors import CloverError

OUTPUT_FORMATS = ("md", "csv", "json", "jsonl")


# Column widths of the streamed markdown table (llama-bench prints each row as its test ends, so
# it cannot size columns to the values; a longer value widens its own cell).
_WIDTHS = {"model": 30, "size": 10, "params": 10, "backend": 14, "threads": 7, "test": 13, "t/s": 20}
_KNOBS = (("block_length", "block"), ("reveal_k", "reveal k"), ("threshold", "threshold"),
          ("expert_coreset", "coreset"))  # diffusion settings: a column where they vary


def _varying(recs: Sequence[dict], key: str, default: Any) -> bool:
    values = {json.dumps(r.get(key)) for r in recs}
    return len(values) > 1 or (bool(recs) and recs[0].get(key) != default)


def _knob(key: str) -> Callable[[dict], str]:
    def cell(r: dict) -> str:
        v = r.get(key)
        return "-" if v is None else f"{v:g}" if key == "threshold" else str(v)
    return cell


def _columns(settings: Sequence[dict], diffusion: bool) -> list[tuple[str, Callable[[dict], str], str]]:
    """The markdown columns: llama-bench's, a column per diffusion setting that varies across
    `settings` (one dict of setting values per run configuration), the dg columns when a test is one."""
    cols: list[tuple[str, Callable[[dict], str], str]] = [
        ("model", lambda r: r["model_type"], "l"),
        ("size", lambda r: f"{r['model_size'] / 2**30:.2f} GiB", "r"),
        ("params", lambda r: _params(r["model_n_params"]), "r"),
        ("backend", lambda r: f"{r.get('backends', 'CPU')} ({r['clover_backend']})", "l"),
        ("threads", lambda r: str(r["n_threads"]), "r"),
    ]
    cols += [(name, _knob(key), "r") for key, name in _KNOBS if _varying(settings, key, None)]
    cols.append(("test", lambda r: r["test"], "r"))
    cols.append(("t/s", lambda r: f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}", "r"))
    if diffusion:
        cols.append(("tok/fwd", lambda r: f"{r['tokens_per_forward']:.2f}" if r["diffusion"] else "", "r"))
        cols.append(("passes/blk", lambda r: f"{r['passes_per_block']:.2f}" if r["diffusion"] else "", "r"))
        # a pass's cost in decode steps = the tokens per pass diffusion needs to beat AR (break-even)
        cols.append(("pass cost", lambda r: f"{r['pass_steps']:.1f} steps" if r.get("pass_steps") else "", "r"))
    return cols


class TablePrinter:
    """Writes records as they are measured, as llama-bench does: a markdown row (after the header),
    a CSV line, a JSON array element or a JSON line per record, so a long run shows each test as
    it ends and an interrupted one keeps what it measured."""

    def __init__(self, fmt: str, build: BuildInfo, out: TextIO, settings: Sequence[dict], diffusion: bool) -> None:
        if fmt not in OUTPUT_FORMATS:
            raise CloverError(f"unknown output format '{fmt}' (choose from {', '.join(OUTPUT_FORMATS)})")
        self.fmt, self.build, self.out = fmt, build, out
        self.cols = _columns(settings, diffusion)
        self.widths = [max(len(name), _WIDTHS.get(name, 0)) for name, _, _ in self.cols]
        self._csv: csv.DictWriter | None = None
        self.count = 0

    def add(self, recs: Sequence[dict]) -> None:
        """Write these records now."""
        for r in recs:
            if self.fmt == "md":
                if not self.count:
                    self._write(self._line([c[0] for c in self.cols]) + "\n" + self._rule() + "\n")
                self._write(self._line([fn(r) for _, fn, _ in self.cols]) + "\n")
            elif self.fmt == "csv":
                if self._csv is None:
                    self._csv = csv.DictWriter(self.out, fieldnames=list(r.keys()), lineterminator="\n")
                    self._csv.writeheader()
                self._csv.writerow({k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in r.items()})
                self.out.flush()
            elif self.fmt == "json":
                body = textwrap.indent(json.dumps(r, indent=2), "  ")
                self._write(("[\n" if not self.count else ",\n") + body)
            else:
                self._write(json.dumps(r) + "\n")
            self.count += 1

    def end(self) -> None:
        """Close the output: the build/CPU footer of the markdown table, the JSON array's end."""
        if self.fmt == "md" and self.count:
            footer = f"\nbuild: clover {self.build.version} ({self.build.commit})\ncpu: {self.build.cpu}"
            if self.build.cpu_detail:
                footer += f" ({self.build.cpu_detail})"
            self._write(footer + "\n")
        elif self.fmt == "json":
            self._write("\n]\n" if self.count else "[]\n")

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _line(self, values: Sequence[str]) -> str:
        parts = [v.ljust(w) if a == "l" else v.rjust(w)
                 for v, w, (_, _, a) in zip(values, self.widths, self.cols, strict=True)]
        return "| " + " | ".join(parts) + " |"

    def _rule(self) -> str:
        return "| " + " | ".join(("-" * (w - 1) + ":") if a == "r" else "-" * w
                                 for w, (_, _, a) in zip(self.widths, self.cols, strict=True)) + " |"


def render(recs: Sequence[dict], fmt: str, build: BuildInfo) -> str:
    """All the records at once, as `TablePrinter` writes them one by one."""
    buf = io.StringIO()
    printer = TablePrinter(fmt, build, buf, recs, any(r.get("diffusion") for r in recs))
    printer.add(recs)
    printer.end()
    return buf.getvalue()


def _params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    return f"{n / 1e3:.2f} K"
