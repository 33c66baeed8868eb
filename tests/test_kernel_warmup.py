"""The first run says it is compiling kernels (issue 13, startup): the marker that records a set of
tensor types as compiled, and `clover run` printing the message only while it is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clover_runtime.kernel_warmup import compile_kernels, needs_compile
from clover_runtime.loader import load_model
from synth_models import tiny_model_path

MESSAGE = "compiling kernels (first run only)"


def _marker_for(model) -> Path:
    folder = Path(os.environ["NUMBA_CACHE_DIR"])
    types = "-".join(str(t) for t in sorted({int(i.ggml_type) for i in model.file.tensors.values()}))
    return folder / f"compiled-int-{types}"


def test_compile_kernels_marks_the_types_compiled() -> None:
    # Q4_0, not the Q8_0 file of the next test: under two test workers the two could otherwise
    # run at once on the same marker (this one creating what that one needs absent)
    with load_model(tiny_model_path("Q4_0"), backend="numba") as model:
        marker = _marker_for(model)
        marker.unlink(missing_ok=True)
        assert needs_compile(model)
        compile_kernels(model)
        assert marker.exists() and not needs_compile(model)
    with load_model(tiny_model_path("Q4_0"), backend="numpy") as model:
        assert not needs_compile(model)  # nothing to compile on the reference path


def test_clover_run_says_so_on_the_first_run_only(tmp_path: Path) -> None:
    path = tiny_model_path("Q8_0")
    with load_model(path, backend="numba") as model:
        _marker_for(model).unlink(missing_ok=True)
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    cmd = [sys.executable, "-m", "clover_cli", "run", str(path), "hi", "-n", "2", "--no-think", "--decode", "ar"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, input="")
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, input="")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert MESSAGE in first.stderr and MESSAGE not in first.stdout
    assert MESSAGE not in second.stderr
    assert first.stdout == second.stdout
