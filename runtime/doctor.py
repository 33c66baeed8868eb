"""The facts behind `clover doctor`: this machine, clover's directories, and whether the default
model fits, estimated from its header (cached copy) or from the published shape."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import paths
from .hub.refs import DEFAULT_MODEL
from .system_info import SystemInfo, probe


@dataclass
class DirReport:
    path: str
    exists: bool
    writable: bool
    free_bytes: int | None
    detail: str = ""


@dataclass(frozen=True)
class GpuOffload:
    """What `-ngl` could use here, as facts: torch's version (None: not installed), the device torch
    would pick (None: no CUDA device; MPS is opt-in), or the `problem` that stops it."""

    torch: str | None
    device: str | None = None
    name: str = ""
    free_bytes: int | None = None
    problem: str = ""


@dataclass
class DoctorReport:
    system: SystemInfo
    numba_cache: DirReport
    hf_cache: DirReport
    default_model: str
    default_model_source: str
    fit: dict[str, Any] = field(default_factory=dict)
    gpu_offload: GpuOffload = field(default_factory=lambda: GpuOffload(None))
    cpu_torch: str | None = None  # torch's version when it is a CPU-only build while nvidia-smi sees a GPU
    threading_layer: str = ""  # numba's, as clover chose it (`kernels.jit.choose_threading_layer`)
    kernels_serialized: bool = False  # True on `workqueue`: parallel slots take turns in the kernels

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "system": self.system.to_dict(),
            "numba_cache": asdict(self.numba_cache),
            "hf_cache": asdict(self.hf_cache),
            "default_model": self.default_model,
            "default_model_source": self.default_model_source,
            "fit": self.fit,
            "gpu_offload": asdict(self.gpu_offload),
            "cpu_torch": self.cpu_torch,
            "threading_layer": self.threading_layer,
            "kernels_serialized": self.kernels_serialized,
        }


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def dir_report(path: Path, detail: str = "") -> DirReport:
    """Whether clover can use a directory (creating it later if needed) and its free disk."""
    base = _nearest_existing(path)
    try:
        free = shutil.disk_usage(base).free
    except OSError:
        free = None
    return DirReport(str(path), path.exists(), os.access(base, os.W_OK), free, detail)


def _numba_detail(path: Path) -> str:
    if not path.exists():
        return "empty: the first run compiles the kernels (seconds), later runs load them"
    n = sum(1 for _ in path.rglob("*.nbi"))
    return f"{n} compiled kernel(s) cached"


def _published_shape_header(tmp: Path) -> Any:
    """The default model's header rebuilt from its published shape (sparse file, no data)."""
    from .gguf_file import open_gguf
    from .synth import SynthSpec, write_model

    path = write_model(tmp / "published-shape.gguf", SynthSpec.real_shape(quant="Q4_K_M"), sparse=True)
    return open_gguf(path)


def default_model_fit(n_ctx: int | None = None) -> tuple[str, dict[str, Any]]:
    """(where the numbers came from, the fit report as JSON) for the default model; `n_ctx` as `-c`
    means everywhere (`memory_fit.context_for`: None the default, 0 as much as fits)."""
    from .memory_fit import context_for, fit_report
    from .model_summary import summarize

    source = "the published shape (not downloaded yet)"
    cached = _cached_default()
    with tempfile.TemporaryDirectory(prefix="clover-doctor-") as tmp:
        if cached is not None:
            from .gguf_file import open_gguf

            model = open_gguf(cached)
            source = f"cached file {cached}"
        else:
            model = _published_shape_header(Path(tmp))
        try:
            summary = summarize(model)
            ctx = context_for(n_ctx, summary.config, model.tensor_bytes)
            report = fit_report(summary.config, model.tensor_bytes, ctx, tensors=model.tensors)
            return source, report.to_json()
        finally:
            model.close()


def _cached_default() -> Path | None:
    from .hub import resolve_model

    try:
        return Path(resolve_model(DEFAULT_MODEL, offline=True))
    except Exception:  # noqa: BLE001 - "not cached" in any form means: estimate from the shape
        return None


def gpu_offload_status() -> GpuOffload:
    """Whether `-ngl` can work here: torch installed or not, and the device it would use."""
    from .errors import CloverError
    from .torch_backend import require_torch

    try:
        torch = require_torch()
    except CloverError as exc:
        return GpuOffload(None, problem=exc.message)
    from .torch_backend.device import resolve_device

    try:
        info = resolve_device("auto")
    except CloverError as exc:
        return GpuOffload(torch.__version__, problem=exc.message)
    if info is None:
        return GpuOffload(torch.__version__)
    return GpuOffload(torch.__version__, str(info.device), info.name, info.free_bytes)


def threading_layer() -> tuple[str, bool]:
    """(numba threading layer, whether the model's passes are serialised on it); ("", False) without numba."""
    try:
        from .kernels import jit
    except ImportError:
        return "", False
    return jit.THREADING_LAYER, jit.serialized()


def cpu_torch_beside_gpu(system: SystemInfo) -> str | None:
    """torch's version when it is a CPU-only build on a machine whose nvidia-smi lists a GPU."""
    from .torch_backend import cpu_only_build

    return cpu_only_build() if system.gpus else None


def run_doctor(n_ctx: int | None = None) -> DoctorReport:
    numba_dir = paths.numba_cache_dir()
    hf_dir = paths.hf_cache_dir()
    source, fit = default_model_fit(n_ctx)
    system = probe()
    layer, serialized = threading_layer()
    return DoctorReport(
        system=system,
        numba_cache=dir_report(numba_dir, _numba_detail(numba_dir)),
        hf_cache=dir_report(hf_dir),
        default_model=DEFAULT_MODEL,
        default_model_source=source,
        fit=fit,
        gpu_offload=gpu_offload_status(),
        cpu_torch=cpu_torch_beside_gpu(system),
        threading_layer=layer,
        kernels_serialized=serialized,
    )
