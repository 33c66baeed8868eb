"""Options that mean the same in every command that takes them (module top: typer only)."""

from __future__ import annotations

from typing import Any

import typer

DEFAULT_CTX = 16384  # equals clover_runtime.memory_fit.DEFAULT_CTX (a test checks), kept here so --help stays light

CTX_HELP = (f"Context per sequence in tokens (default {DEFAULT_CTX}, capped at the model's; "
            "0 = the largest that fits this machine, at most the model's).")


def ctx_option(help_text: str = CTX_HELP, *, annotated: bool = False) -> Any:
    """-c/--ctx-size: per-sequence context, the same default and the same 0 in run, serve, inspect,
    doctor and pull (serve's total is -c × -np). `annotated`: for `Annotated[...]` signatures, where
    the default sits after the `=` instead of first in the call."""
    first = () if annotated else (None,)
    return typer.Option(*first, "-c", "--ctx-size", min=0, envvar="CLOVER_CTX_SIZE", show_default=False,
                        help=help_text, rich_help_panel=CONTEXT)


# --help groups, in the order help_text prints them (llama.cpp's --help groups its flags the same way)
MODEL = "model"
CHAT = "chat"
CONTEXT = "context"
SAMPLING = "sampling"
DIFFUSION = "diffusion"
TESTS = "tests"
OUTPUT = "output"
SERVER = "server"
PLACEMENT = "placement (GPU offload needs the gpu extra: torch)"
PANELS = (MODEL, TESTS, CHAT, CONTEXT, SAMPLING, DIFFUSION, OUTPUT, SERVER, PLACEMENT)


def _gpu_option(default: Any, annotated: bool, *names: str, env: str, **kw: Any) -> Any:
    """One of llama.cpp's GPU flags, the same in run, serve and bench (grouped in --help)."""
    first = () if annotated else (default,)
    return typer.Option(*first, *names, envvar="CLOVER_" + env, rich_help_panel=PLACEMENT, **kw)


def ngl_option(*, annotated: bool = False) -> Any:
    """-ngl: llama.cpp's layer count on the GPU (auto: as many as fit when a GPU is present)."""
    return _gpu_option(None, annotated, "-ngl", "--n-gpu-layers", "--gpu-layers", env="N_GPU_LAYERS",
                       show_default=False, metavar="N",
                       help="Layers on the GPU: a count, auto (default: as many as fit when a GPU is present) "
                            "or all; 0 keeps everything on the CPU.")


def cpu_moe_option(*, annotated: bool = False) -> Any:
    return _gpu_option(False, annotated, "-cmoe", "--cpu-moe", env="CPU_MOE",
                       help="Keep every layer's routed experts in system memory (run on the CPU).")


def mmap_option(*, annotated: bool = False) -> Any:
    """--mmap/--no-mmap: llama.cpp's switch; unset, clover decides (`resident.keep_in_memory`)."""
    first = () if annotated else (None,)
    return typer.Option(*first, "--mmap/--no-mmap", envvar="CLOVER_MMAP", rich_help_panel=PLACEMENT,
                        show_default=False,
                        help="Use the weights from the mapped file, or read them into memory (huge pages; "
                             "faster decode). Default: into memory when they fit easily.")


def n_cpu_moe_option(*, annotated: bool = False) -> Any:
    return _gpu_option(0, annotated, "-ncmoe", "--n-cpu-moe", env="N_CPU_MOE", min=0,
                       help="Keep the routed experts of the first N layers in system memory.")


def device_option(*, annotated: bool = False) -> Any:
    return _gpu_option("auto", annotated, "-dev", "--device", env="DEVICE",
                       help="auto, cuda, cuda:N, mps, or cpu (torch on the CPU); llama.cpp's CUDA0 works too.")


def main_gpu_option(*, annotated: bool = False) -> Any:
    return _gpu_option(0, annotated, "-mg", "--main-gpu", env="MAIN_GPU", min=0,
                       help="The CUDA device index to use.")


def offload_request(ngl: str | None, cpu_moe: bool, n_cpu_moe: int, device: str, main_gpu: int,
                    mmap: bool | None = None) -> Any:
    """The runtime's OffloadRequest from the flags; a bad -ngl is a usage error (exit 2). A pasted
    llama.cpp line's `-ngl 99` on a machine without a GPU (or without torch) warns and runs on the
    CPU, as llama.cpp does; only an explicit --device that cannot be met stays an error."""
    from clover_runtime.offload import OffloadRequest, parse_gpu_layers

    from .usage import UsageError

    try:
        n = parse_gpu_layers(ngl)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    in_memory = None if mmap is None else not mmap
    request = OffloadRequest(n, cpu_moe, n_cpu_moe, device, main_gpu, in_memory=in_memory)
    if n > 0 and device == "auto":
        missing = _no_gpu(request)
        if missing:
            from . import console

            console.warn(f"-ngl {ngl} ignored: {missing}; running on the CPU")
            return OffloadRequest(0, cpu_moe, n_cpu_moe, device, main_gpu, in_memory=in_memory)
    return request


def _no_gpu(request: Any) -> str | None:
    """Why `request` cannot put layers on a GPU here (no torch, a broken torch, no device), or None
    when it can."""
    from clover_runtime.errors import CloverError, NoGpu
    from clover_runtime.torch_backend import require_torch

    try:
        require_torch()
    except CloverError as exc:
        return exc.message
    from clover_runtime.torch_backend.group import request_device

    try:
        request_device(request)
    except NoGpu as exc:
        if exc.cpu_torch is not None:  # a CPU-only torch beside an NVIDIA GPU: say how to fix it
            return f"{exc.message.removeprefix('-ngl: ')}; {exc.hint}"
        return exc.message.removeprefix("-ngl: ")
    return None
