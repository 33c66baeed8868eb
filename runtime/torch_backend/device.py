"""Which torch device runs the offloaded weights, in what precision, and how much memory it has.

Names follow torch ("cuda", "cuda:1", "mps", "cpu") and llama.cpp ("CUDA0", "MTL0", "CPU");
"auto" is the first CUDA device, else none: Apple's MPS is opt-in (`--device mps`) until a Mac run of
the backend has passed. "cpu" is torch on the CPU: the same code path as a GPU, which is what the
tests run.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CloverError
from . import require_torch

_LLAMA_NAMES = re.compile(r"^(cuda|mtl|metal|cpu)(\d*)$", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceInfo:
    """A torch device with its display name, memory (bytes; None when torch cannot say) and the
    activation dtype products use there."""

    device: Any  # torch.device
    name: str
    total_bytes: int | None
    free_bytes: int | None
    dtype: Any  # torch.dtype


def _normalise(spec: str, main_gpu: int) -> str:
    s = spec.strip().lower()
    m = _LLAMA_NAMES.match(s)
    if m:
        kind, index = m.group(1), m.group(2)
        if kind == "cpu":
            return "cpu"
        if kind in ("mtl", "metal"):
            return "mps"
        return f"cuda:{index or main_gpu}"
    return s


def gpu_likely() -> bool:
    """A cheap look for a GPU `auto` would use, before importing torch (a second or more): an NVIDIA
    driver (MPS is never picked by `auto`)."""
    from ..processes import nvidia_smi

    if sys.platform == "darwin":
        return False
    if os.name == "nt":
        return nvidia_smi() is not None
    return Path("/dev/nvidiactl").exists() or nvidia_smi() is not None


def resolve_device(spec: str = "auto", main_gpu: int = 0) -> DeviceInfo | None:
    """The device for `spec`, or None when `spec` is "auto" and there is no CUDA GPU."""
    torch = require_torch()
    want = _normalise(spec, main_gpu)
    if want == "auto":
        if not torch.cuda.is_available():
            return None  # MPS only by `--device mps`
        want = f"cuda:{main_gpu}"
    try:
        device = torch.device(want)
    except (RuntimeError, ValueError):
        raise CloverError(f"unknown device '{spec}' (use cuda, cuda:N, mps, cpu or auto)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CloverError(f"device '{spec}': torch sees no CUDA GPU")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise CloverError(f"device '{spec}': there are {torch.cuda.device_count()} CUDA device(s)")
        free, total = torch.cuda.mem_get_info(index)
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return DeviceInfo(torch.device("cuda", index), torch.cuda.get_device_name(index), total, free, dtype)
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise CloverError(f"device '{spec}': MPS is not available on this machine")
        return DeviceInfo(device, "Apple MPS", None, None, torch.float16)
    if device.type == "cpu":
        return DeviceInfo(device, "torch CPU", None, None, torch.float32)
    raise CloverError(f"unsupported device '{spec}' (use cuda, cuda:N, mps, cpu or auto)")
