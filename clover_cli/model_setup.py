"""Resolving a MODEL argument and checking it fits memory before anything is loaded.

Shared by `run`, `serve` and `bench`: the same identifiers as `clover pull`, the same refusal with
the fit table when the context cannot fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class PreparedModel:
    path: Path
    model_id: str
    n_ctx: int  # per sequence
    config: Any
    verdict: Any
    sampling: Any  # what the file recommends, llama.cpp's defaults elsewhere (decoding.recommended_sampling)


def resolve(model: str | None, *, file: str | None = None, offline: bool = False, token: str | None = None) -> Path:
    """The runtime's one resolver (a local path as is, the cache, else a download) with its progress
    drawn on stderr."""
    from clover_runtime.hub import resolve_model

    from .hub_progress import HubProgress

    with HubProgress() as progress:  # a model neither cached nor reachable: `advice` words the way out
        return resolve_model(model, file=file, offline=offline, token=token, reporter=progress)


def prepare(model: str | None, *, ctx: int | None, parallel: int = 1, offline: bool = False, file: str | None = None,
            token: str | None = None, ctx_checkpoints: int | None = None, offload: Any = None) -> PreparedModel:
    """Resolve the model, pick the per-sequence context (`memory_fit.context_for`: None the default,
    0 as much as fits) and refuse with the fit table when it does not fit this machine, counting
    `ctx_checkpoints` prompt-cache checkpoints per sequence (None: the default). With an `offload`
    request (`-ngl`), the weights that go to the GPU do not count against RAM."""
    from clover_runtime import memory_fit
    from clover_runtime.decoding import recommended_sampling
    from clover_runtime.errors import CloverError
    from clover_runtime.gguf_file import open_gguf
    from clover_runtime.model_config import describe_tensors

    from . import console
    from .advice import fit_hint
    from .gpu_hint import warn_cpu_torch

    path = resolve(model, file=file, offline=offline, token=token)
    with open_gguf(path) as model_file:
        cfg = describe_tensors(model_file.metadata, model_file.tensors)
        weight_bytes = int(model_file.tensor_bytes)
        sampling = recommended_sampling(model_file.metadata)
        tensors = dict(model_file.tensors)
    system = memory_fit.probe_system()
    warn_cpu_torch(offload, system.gpus)
    tensors_bytes = weight_bytes
    if offload is not None:
        from clover_runtime.offload import weights_in_ram

        weight_bytes = weights_in_ram(tensors, cfg.n_layer, weight_bytes, offload, system.gpus)
    n_ctx = memory_fit.context_for(ctx, cfg, weight_bytes, parallel, system)
    if ctx == 0:
        console.info(f"context: {n_ctx} tokens per sequence (the model allows {cfg.context_length}; set it with -c)")
    if n_ctx > cfg.context_length:
        raise CloverError(f"-c {n_ctx} is larger than the model's context length {cfg.context_length}")
    checkpoints = memory_fit.DEFAULT_CTX_CHECKPOINTS if ctx_checkpoints is None else ctx_checkpoints
    estimate = memory_fit.estimate(cfg, weight_bytes, n_ctx, parallel, ctx_checkpoints=checkpoints)
    verdict = memory_fit.assess(estimate, system, tensors=tensors, n_layer=cfg.n_layer,
                                layer_state=memory_fit.layer_state_bytes(cfg, estimate))
    if verdict.verdict == "does not fit":
        from .fit_table import print_fit_table

        print_fit_table(estimate, system, verdict)
        raise CloverError(verdict.message, fit_hint(verdict.advice) or "lower -c, or use a smaller quant")
    if verdict.verdict == "fits with paging":
        console.warn(f"{verdict.message} (expect slow generation)")
    if offload is not None and offload.wanted and weight_bytes < tensors_bytes:
        from .fit_table import gpu_fit_text

        for g in verdict.gpus:  # the per-GPU fit, in -ngl terms, where a GPU takes weights
            console.info(f"gpu: {gpu_fit_text(g)}")
    from clover_runtime.hub import DEFAULT_MODEL

    model_id = path.name if Path(model or "").exists() else (model or DEFAULT_MODEL)
    return PreparedModel(path, model_id, n_ctx, cfg, verdict, sampling)


COMPILING = "compiling kernels (first run only)…"
_compiled_here = {"said": False}  # the message shows once per process, not again for each new quant type


def compile_first_run(model: Any, *, spinner: bool = True) -> None:
    """On a first run, compile the kernels before the first reply under a spinner with the seconds
    spent on stderr (a line when stderr is not a terminal, or without `spinner`) instead of a silent
    pause inside the first forward. A later model in the same process (bench over several quant
    types) compiles only its new kernels, a shorter pause, without saying so again."""
    from clover_runtime.kernel_warmup import compile_kernels, needs_compile

    from . import console

    if not needs_compile(model):
        return
    if _compiled_here["said"]:
        compile_kernels(model)
        return
    _compiled_here["said"] = True
    con = console.err()
    if not (spinner and con.is_terminal):
        console.info(COMPILING)
        compile_kernels(model)
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn

    with Progress(SpinnerColumn("dots"), TextColumn(COMPILING), TextColumn("{task.elapsed:.0f} s", style="dim"),
                  console=con, transient=True) as progress:
        progress.add_task("compile", total=None)
        compile_kernels(model)


def placement_text(model: Any) -> str:
    """Where the weights of a loaded model run, in one line ("CPU only", or the GPU's share)."""
    from clover_runtime.offload import describe

    group = model.weights.device_group
    if group is None:
        return describe(None, "", model.config.n_layer)
    return describe(group.placement, group.info.name, model.config.n_layer)
