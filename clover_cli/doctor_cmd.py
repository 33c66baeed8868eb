"""`clover doctor`: is this machine ready for clover, and does the default model fit it?"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from . import console
from .options import CTX_HELP, ctx_option

if TYPE_CHECKING:
    from clover_runtime.doctor import GpuOffload


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _threads_text(layer: str, serialized: bool) -> str:
    if not layer:
        return "numba not available"
    if serialized:
        return (f"numba {layer} layer (no TBB or OpenMP found): parallel slots (-np) take turns in the kernels; "
                "pip install tbb, or the VC++ runtime on Windows, runs them at once")
    return f"numba {layer} layer (parallel slots run at once)"


def command(
    ctx_size: int | None = ctx_option(CTX_HELP + " The default model is checked at this context."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Report Python, platform, CPU features, RAM, GPU, caches, free disk, and whether the default model fits.

    Example:

        clover doctor -c 32768
    """
    from clover_runtime.doctor import run_doctor

    from .advice import fit_advice_text
    from .fit_table import print_pairs

    report = run_doctor(ctx_size)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    s = report.system
    gpus = ", ".join(f"{g['name']} ({_gib(g['free'])} free of {_gib(g['total'])})" for g in s.gpus)
    gpus = gpus or "none found"
    fit = report.fit
    verdict = fit.get("verdict", {})
    rows = [
        ("Python", s.python),
        ("Platform", s.platform),
        ("CPU", f"{s.cpu} ({s.physical_cores} cores, {s.logical_cores} threads)"),
        ("CPU features", " ".join(s.cpu_features) or "none of note"),
        ("RAM", f"{_gib(s.ram_available)} available of {_gib(s.ram_total)}"),
        ("GPU", gpus),
        ("GPU offload", gpu_offload_text(report.gpu_offload)),
        ("Kernel threads", _threads_text(report.threading_layer, report.kernels_serialized)),
        ("Kernel cache", f"{report.numba_cache.path} ({report.numba_cache.detail})"),
        ("Model cache", f"{report.hf_cache.path} ({_gib(report.hf_cache.free_bytes)} free"
                        f"{'' if report.hf_cache.writable else ', NOT writable'})"),
        ("Default model", report.default_model),
        ("  estimated from", report.default_model_source),
        (f"  at -c {fit.get('n_ctx', ctx_size)}", verdict.get('message', '?')),
    ]
    largest = fit.get("largest_context")
    if largest is not None:
        rows.append(("  largest context", f"{largest:,} tokens" if largest else "none"))
    rows.append(("Try now", 'clover run demo "What is 48 + 36?" (the model that ships with clover, no download)'))
    con = console.out()
    print_pairs(con, rows, title="clover doctor")
    for line in verdict.get("advice", []) or []:
        con.print(f"  advice: {fit_advice_text(line)}", markup=False)
    if report.cpu_torch is not None and s.gpus:
        from .gpu_hint import cpu_torch_line

        console.warn(cpu_torch_line(report.cpu_torch, s.gpus[0]["name"]))


def gpu_offload_text(g: GpuOffload) -> str:
    """The runtime's facts about GPU offload in the flags that change it."""
    if g.torch is None:
        return f"not available: {g.problem}"
    if g.problem:
        return f"torch {g.torch}: {g.problem}"
    if g.device is None:
        return (f"torch {g.torch}, no CUDA device (--device mps opts in to Apple's GPU; "
                "--device cpu runs torch on the CPU)")
    free = f", {g.free_bytes / (1 << 30):.1f} GiB free" if g.free_bytes is not None else ""
    return f"torch {g.torch}: {g.name} ({g.device}{free})"
