"""Two server slots run the real kernels at once from two threads (issue 41): the results equal the
one-thread results, on the threading layer clover picks and on numba's `workqueue` fallback (which
aborts the process on concurrent parallel kernels unless clover serialises the passes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synth_models import small_model_path

_SCRIPT = textwrap.dedent("""
    import sys, threading
    import numpy as np
    from clover_runtime import load_model
    from clover_runtime.kernels import jit

    model = load_model(sys.argv[1], n_threads=2, backend="numba")
    prompts = [[(7 * i + 3) % 200 for i in range(40)], [(11 * i + 5) % 200 for i in range(33)]]
    want = [model.forward(p) for p in prompts]
    got = [[], []]
    barrier = threading.Barrier(2)

    def slot(k):
        from clover_runtime.kernels import set_threads
        set_threads(2)
        barrier.wait()
        for _ in range(4):
            got[k].append(model.forward(prompts[k]))

    threads = [threading.Thread(target=slot, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(2):
        assert len(got[k]) == 4, k
        for g in got[k]:
            np.testing.assert_array_equal(g, want[k])
    print("layer", jit.THREADING_LAYER, "serialized", jit.serialized())
""")


def _run(model: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(model)], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.timeout(900)
def test_two_slots_run_the_kernels_at_once_with_the_single_thread_results() -> None:
    model = small_model_path("Q8_0")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    res = _run(model, env)
    assert res.returncode == 0, res.stdout + res.stderr
    layer = res.stdout.split()[1]
    assert layer in ("tbb", "omp", "workqueue"), res.stdout
    assert res.stdout.split()[3] == str(layer == "workqueue"), res.stdout


@pytest.mark.timeout(900)
def test_on_the_workqueue_layer_the_passes_are_serialised() -> None:
    """numba's own fallback layer: without the pass lock it terminates the process ("Concurrent
    access has been detected")."""
    model = small_model_path("Q8_0")
    res = _run(model, {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split() == ["layer", "workqueue", "serialized", "True"], res.stdout
