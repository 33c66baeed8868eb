"""The test session's one kernel cache (tests/conftest.py): a CLI subprocess in a fresh HOME loads
the kernels this process compiled instead of compiling them again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from clover_runtime.kernels import matmul
from clover_runtime.quants import quantize
from gguf.constants import GGMLQuantizationType as T

# Runs one Q8_0 product, then prints numba's cache directory and the cache hits and misses
# (a miss is a compile) of every compiled function in the kernel modules (float or integer path).
PROBE = """
import importlib, sys, numba, numpy as np
from clover_runtime.quants import quantize
from gguf.constants import GGMLQuantizationType as T
mm = importlib.import_module("clover_runtime.kernels.matmul")
w = np.random.default_rng(0).standard_normal((8, 352)).astype(np.float32)
mm.matmul(quantize(w, T.Q8_0).reshape(-1), T.Q8_0, 8, 352, np.ones((1, 352), np.float32))
mods = [m for n, m in list(sys.modules.items()) if n.startswith("clover_runtime.kernels")]
ds = {id(f): f for m in mods for f in vars(m).values() if isinstance(f, numba.core.registry.CPUDispatcher)}
ds = list(ds.values())
print(numba.config.CACHE_DIR)
print(sum(sum(d.stats.cache_hits.values()) for d in ds), sum(sum(d.stats.cache_misses.values()) for d in ds))
"""


def test_a_fresh_home_subprocess_loads_the_sessions_compiled_kernels(tmp_path: Path) -> None:
    w = np.random.default_rng(0).standard_normal((8, 352)).astype(np.float32)
    matmul(quantize(w, T.Q8_0).reshape(-1), T.Q8_0, 8, 352, np.ones((1, 352), np.float32))  # compiled here
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOVER_", "XDG_"))}
    env.update(HOME=str(tmp_path), USERPROFILE=str(tmp_path), LOCALAPPDATA=str(tmp_path / "AppData" / "Local"))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    cache_dir, counts = out.stdout.splitlines()[-2:]
    hits, misses = (int(n) for n in counts.split())
    assert Path(cache_dir) == Path(os.environ["NUMBA_CACHE_DIR"])
    assert hits >= 1 and misses == 0, (hits, misses)
