"""The products of a test module computed in a second process that compiles the kernels' two-step
(non-VNNI) form: CLOVER_SIMD=novnni, its own numba cache (compiled code is cached per form)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

_SCRIPT = '''
import importlib
import sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from clover_runtime.kernels.intdot import vnni
data = dict(np.load(sys.argv[1]))
out = importlib.import_module(sys.argv[4])._products(data)
out["vnni"] = np.array(vnni())
np.savez(sys.argv[2], **out)
'''


def novnni_products(tmp_path: Path, module: str, data: dict[str, np.ndarray], **env: str) -> dict[str, np.ndarray]:
    """`module._products(data)` (module: a test module's name) in the two-step form, with the
    extra environment `env`. Fails unless that process really ran the two-step form."""
    np.savez(tmp_path / "in.npz", **data)
    full = {**os.environ, **env, "CLOVER_SIMD": "novnni", "NUMBA_CACHE_DIR": str(tmp_path / "kernels")}
    subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz"),
                    str(Path(__file__).parent), module], env=full, check=True, timeout=600)
    other = dict(np.load(tmp_path / "out.npz"))
    assert not bool(other.pop("vnni"))
    return other
