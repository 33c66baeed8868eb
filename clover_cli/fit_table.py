"""Rendering of tables, and of the memory-fit report that inspect, pull, run, serve and doctor share.

Rich tables on a terminal; aligned plain text when piped, so scripts can grep the output.
Rendering only: the numbers come from `clover_runtime.memory_fit.fit_report`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import console as _console
from .advice import fit_advice_text

if TYPE_CHECKING:
    from clover_runtime.memory_fit import FitReport, FitVerdict, MemoryEstimate, SystemMemory
    from rich.console import Console

Column = tuple[str, str]  # (header, "left" | "right")
Cell = Any  # a str (always literal text, never markup, control characters escaped) or a rich Text


def human_bytes(n: int | float | None) -> str:
    """1,536 -> '1.5 KiB'; two decimals from GiB up, so small models still show a difference."""
    if n is None:
        return "?"
    n = float(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def is_plain(con: Console) -> bool:
    return not con.is_terminal


def lit(con: Console, text: str = "") -> None:
    """Print text as given, control characters escaped (it may come from a file): no markup, emoji
    codes, highlighting or wrapping."""
    con.print(_console.safe(text, lines=True), markup=False, highlight=False, emoji=False, soft_wrap=True)


def print_table(con: Console, columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *,
                title: str | None = None, plain: bool | None = None) -> None:
    """A rich table on a terminal; space-aligned columns (two spaces apart) otherwise."""
    plain = is_plain(con) if plain is None else plain
    if plain:
        if title:
            lit(con, title)
        texts = [[_console.safe(c) for c in r] for r in rows]
        widths = [max([len(h)] + [len(r[i]) for r in texts]) for i, (h, _) in enumerate(columns)]

        def line(cells: Sequence[str]) -> str:
            parts = [c.rjust(w) if j == "right" else c.ljust(w)
                     for c, w, (_, j) in zip(cells, widths, columns, strict=True)]
            return "  " + "  ".join(parts).rstrip()

        lit(con, line([h for h, _ in columns]))
        for r in texts:
            lit(con, line(r))
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(_console.safe(title)) if title else None, title_justify="left", header_style="bold")
    for header, justify in columns:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(*(Text(_console.safe(c)) if isinstance(c, str) else c for c in r))
    con.print(table)


def print_pairs(con: Console, pairs: Sequence[tuple[str, Cell]], *, title: str | None = None,
                plain: bool | None = None) -> None:
    """Label/value lines: a borderless grid on a terminal, `label  value` lines when piped."""
    plain = is_plain(con) if plain is None else plain
    if plain:
        if title:
            lit(con, title)
        width = max((len(k) for k, _ in pairs), default=0)
        for k, v in pairs:
            lit(con, f"{_console.safe(k).ljust(width)}  {_console.safe(v)}")
        return
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold cyan")
    grid.add_column()
    for k, v in pairs:
        grid.add_row(Text(_console.safe(k)), Text(_console.safe(v)) if isinstance(v, str) else v)
    if title:
        con.print(Text(_console.safe(title), style="bold"))
    con.print(grid)


_VERDICT_STYLE = {"fits": "green", "fits with paging": "yellow", "does not fit": "red"}


def render_fit(report: FitReport, con: Console | None = None, *, plain: bool | None = None,
               limits: bool = True) -> None:
    """The breakdown table for the chosen -c and the standard contexts, then verdict and advice.

    `limits=False` leaves out the largest-context line (for a report that did not compute it).
    """
    from rich.text import Text

    con = con or _console.out()
    plain = is_plain(con) if plain is None else plain
    est = report.estimate
    sysm = report.system
    title = (f"memory fit: -c {est.n_ctx} per sequence, -np {est.n_parallel}, KV cache {est.cache_type} "
             f"({human_bytes(est.kv_per_token)}/token), ubatch {est.ubatch}; "
             f"RAM {human_bytes(sysm.ram_available)} available of {human_bytes(sysm.ram_total)}, "
             f"margin {human_bytes(report.margin)}")
    if est.ctx_checkpoints:
        each = est.checkpoints // (est.ctx_checkpoints * est.n_parallel)
        title += f"; prompt cache {est.ctx_checkpoints} checkpoints/sequence ({human_bytes(each)} each)"
    columns: list[Column] = [("context", "right"), ("weights", "right"), ("KV cache", "right"),
                             ("GDN state", "right"), ("checkpoints", "right"), ("compute", "right"),
                             ("total", "right"),
                             ("verdict", "left")]
    rows = []
    for r in report.rows:
        e = r.estimate
        mark = "*" if r.chosen else " "
        verdict = Text(r.verdict, style=_VERDICT_STYLE[r.verdict])
        rows.append([f"{mark}{r.n_ctx:,}", human_bytes(e.weights), human_bytes(e.kv_cache),
                     human_bytes(e.gdn_state), human_bytes(e.checkpoints), human_bytes(e.compute),
                     human_bytes(e.total), verdict])
    print_table(con, columns, rows, title=title, plain=plain)
    v = report.verdict
    lines = [("verdict", v.message)]
    if limits:
        best = f"{report.largest_context:,}" if report.largest_context else "none"
        lines.append(("largest context", f"{best} fully in RAM (model context {report.context_length:,}; "
                      f"with weights paging: {report.largest_context_paging:,})"))
    for a in v.advice:
        lines.append(("advice", fit_advice_text(a)))
    for g in v.gpus:
        lines.append(("gpu", gpu_fit_text(g)))
    if plain:
        print_pairs(con, lines, plain=True)
    else:
        con.print(Text(_console.safe(v.message), style=f"bold {_VERDICT_STYLE[v.verdict]}"))
        for k, text in lines[1:]:
            con.print(Text.assemble((f"{k}: ", "dim"), _console.safe(text)))


def print_fit_table(estimate: MemoryEstimate, system: SystemMemory, verdict: FitVerdict,
                    con: Console | None = None, *, plain: bool | None = None) -> None:
    """One setting's breakdown, verdict and advice; to stderr by default (run/serve diagnostics)."""
    from clover_runtime.memory_fit import DEFAULT_MARGIN, FitReport, FitRow

    report = FitReport(estimate, verdict, [FitRow(estimate.n_ctx, estimate, verdict.verdict, True)], 0, 0,
                       system, estimate.n_ctx, DEFAULT_MARGIN)
    render_fit(report, con or _console.err(), plain=plain, limits=False)


def gpu_fit_text(g: Any) -> str:
    """A GPU's fit (`memory_fit.GpuFit`) in llama.cpp's flags: `-ngl 99`, else `-ngl 99 --n-cpu-moe N`
    (or `--cpu-moe`), else `-ngl N`."""
    from clover_runtime.sizes import size_text

    head = f"GPU {g.index} {g.name}: {size_text(g.free)} free of {size_text(g.total)}"
    if not g.detailed:
        return f"{head}; every weight {'would' if g.fits_all else 'would not'} fit there (-ngl 99 with the gpu extra)"
    if not g.n_gpu_layers:
        return f"{head}; too small for any layer of this model"
    at = f" at -c {g.n_ctx}" if g.n_ctx else ""
    state = f" + {size_text(g.state_bytes)} of cache and state" if g.state_bytes else ""
    on_gpu = f"{size_text(g.device_bytes)} of weights{state} on the GPU"
    if not g.all_layers:
        return f"{head}; -ngl {g.n_gpu_layers} fits{at} ({on_gpu})"
    if not g.n_cpu_moe:
        return f"{head}; -ngl 99 fits{at} ({on_gpu})"
    flag = "--cpu-moe" if g.n_cpu_moe >= g.n_layer else f"--n-cpu-moe {g.n_cpu_moe}"
    return f"{head}; -ngl 99 {flag} fits{at} ({on_gpu}, {size_text(g.host_bytes)} of weights in RAM)"
