"""What this machine is: the facts `clover doctor` and `clover bench` report."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .processes import creation_kwargs

_INTERESTING_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                      "avx_vnni", "amx_tile", "neon", "asimd", "sve")


@dataclass
class SystemInfo:
    python: str
    platform: str
    machine: str
    cpu: str
    cpu_features: list[str]
    physical_cores: int
    logical_cores: int
    ram_total: int
    ram_available: int
    gpus: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def cpu_name() -> str:
    """The CPU's marketing name where the OS tells it."""
    if sys.platform.startswith("linux"):
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
            m = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
            if m:
                return m.group(1).strip()
        except OSError:
            pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=2, **creation_kwargs())
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """SIMD features that matter for the kernels (from /proc/cpuinfo, else LLVM's host view)."""
    flags: set[str] = set()
    if sys.platform.startswith("linux"):
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
            m = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.MULTILINE)
            if m:
                flags = set(m.group(1).split())
        except OSError:
            pass
    if not flags:
        try:
            import llvmlite.binding as llvm

            feats = llvm.get_host_cpu_features()
            flags = {name.replace("-", "_") for name, on in feats.items() if on}
            flags |= {"avx512_vnni"} if "avx512vnni" in flags else set()
        except Exception:  # noqa: BLE001 - a report, never a failure
            flags = set()
    return [f for f in _INTERESTING_FLAGS if f in flags]


def probe() -> SystemInfo:
    import psutil

    from .memory_fit import nvidia_gpus

    vm = psutil.virtual_memory()
    return SystemInfo(
        python=platform.python_version(),
        platform=platform.platform(),
        machine=platform.machine(),
        cpu=cpu_name(),
        cpu_features=cpu_features(),
        physical_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        logical_cores=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        ram_total=vm.total,
        ram_available=vm.available,
        gpus=[g._asdict() for g in nvidia_gpus()],
    )
