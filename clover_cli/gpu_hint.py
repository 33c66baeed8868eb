"""The line that tells a user with an NVIDIA card that their torch cannot use it (PyPI's Windows
torch is a CPU-only build), with the command that installs the CUDA build."""

from __future__ import annotations

from typing import Any


def cpu_torch_line(torch_version: str, gpu_name: str) -> str:
    from clover_runtime.torch_backend import CUDA_TORCH_INSTALL

    return (f"torch {torch_version} is a CPU-only build, so {gpu_name} is not used; "
            f"for GPU offload install the CUDA build: {CUDA_TORCH_INSTALL}")


def warn_cpu_torch(offload: Any, gpus: list) -> None:
    """Warn when `-ngl auto` would offload, nvidia-smi lists `gpus`, and torch is a CPU build (an
    explicit `-ngl N` fails with the same advice instead; `--device cpu` asked for the CPU)."""
    if offload is None or not offload.wanted or offload.explicit or not gpus:
        return
    from clover_runtime.torch_backend import cpu_only_build

    from . import console

    version = cpu_only_build()
    if version is not None:
        console.warn(cpu_torch_line(version, gpus[0].name))
