"""The exact (float) compiled kernels against the numpy path: dequantize (clover_runtime.quants) then a
float matmul. The integer kernels, the default for quantized types, have their own tests
(test_kernels_int.py).

The dequantizer itself is checked against gguf-py in test_quants_roundtrip. All calls share one
compiled specialization, so a cold numba cache compiles once (~10 s on CI), not once per test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clover_runtime.kernels import matmul, moe_matmul, set_threads
from clover_runtime.quants import SUPPORTED_TYPES, dequantize, dequantize_rows, quantize, type_name
from gguf.constants import GGMLQuantizationType as T

RTOL = 1e-5  # relative to the size of the terms summed (|x|·|W|ᵀ), the scale of float32 round-off


def _close(y: np.ndarray, ref: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    scale = np.abs(x) @ np.abs(w).T
    assert y.dtype == np.float32 and y.shape == ref.shape
    assert np.all(np.abs(y - ref) <= RTOL * scale + 1e-30), np.max(np.abs(y - ref) / scale)


def _n_in(t: int) -> int:
    # K-quants: three super-blocks; legacy and float types: a row that is not a multiple of the
    # 256-weight decode group, so the last group is partial.
    return 768 if t in (T.Q4_K, T.Q5_K, T.Q6_K) else 352


def _weights(t: int, n_matrices: int, n_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n_matrices, n_out, _n_in(t))) * rng.uniform(0.01, 1, (n_matrices, n_out, 1)))
    raw = quantize(w.astype(np.float32), t).reshape(-1)
    raw.flags.writeable = False  # as tensor data from a read-only mmap
    return raw, dequantize(raw, t, w.shape)


@pytest.mark.parametrize("t", sorted(SUPPORTED_TYPES), ids=type_name)
@pytest.mark.parametrize("n", [1, 7, 20])  # 7: the 4-, 2- and 1-row kernels; 20: decode + BLAS
def test_matmul_equals_dequantize_then_matmul(t, n):
    n_out = 40
    raw, w = _weights(t, 1, n_out, seed=n)
    x = np.random.default_rng(100 + n).standard_normal((n, _n_in(t))).astype(np.float32)
    y = matmul(raw, t, n_out, _n_in(t), x, exact=True)
    _close(y, x.astype(np.float64) @ w[0].T.astype(np.float64), x, w[0])


@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K, T.Q5_K, T.Q8_0, T.Q4_0, T.F32], ids=lambda t: t.name)
def test_moe_matmul_equals_per_expert_reference(t):
    n_expert, n_out, n, k = 6, 24, 20, 3
    raw, _ = _weights(t, n_expert, n_out, seed=5)
    n_in = _n_in(t)
    rng = np.random.default_rng(6)
    # expert 4 meets all 20 rows (decode + BLAS), experts 0-3 about 10 each (8-, 2- and 1-row
    # kernels), expert 5 none
    ids = np.stack([np.r_[4, rng.choice(4, k - 1, replace=False)] for _ in range(n)])
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    xs = rng.standard_normal((n, k, n_in)).astype(np.float32)
    y_shared = moe_matmul(raw, t, n_out, n_in, x, ids, exact=True)
    y_slots = moe_matmul(raw, t, n_out, n_in, xs, ids, exact=True)
    assert y_shared.shape == y_slots.shape == (n, k, n_out)
    for i in range(n):
        for j in range(k):
            e = ids[i, j]
            w = dequantize_rows(raw, t, n_in, slice(e * n_out, (e + 1) * n_out))  # the per-expert path
            _close(y_shared[i, j][None], (x[i].astype(np.float64) @ w.T)[None], x[i][None], w)
            _close(y_slots[i, j][None], (xs[i, j].astype(np.float64) @ w.T)[None], xs[i, j][None], w)


@pytest.mark.parametrize("exact", [False, True], ids=["integer", "exact"])
def test_thread_count_does_not_change_results(exact):
    raw, _ = _weights(T.Q4_K, 4, 64, seed=9)
    ids = np.array([[0, 3], [3, 1], [2, 0]])
    x = np.random.default_rng(10).standard_normal((3, 768)).astype(np.float32)
    try:
        set_threads(1)
        one = moe_matmul(raw, T.Q4_K, 64, 768, x, ids, exact=exact)
        set_threads(2)
        two = moe_matmul(raw, T.Q4_K, 64, 768, x, ids, exact=exact)
    finally:
        set_threads(None)
    np.testing.assert_array_equal(one, two)  # each output is computed by one item, in one order


def test_bad_inputs_are_refused():
    raw, _ = _weights(T.Q8_0, 2, 8, seed=1)
    x = np.zeros((1, 352), np.float32)
    with pytest.raises(ValueError, match="expert ids must lie in 0..1"):
        moe_matmul(raw, T.Q8_0, 8, 352, x, np.array([[2]]))
    with pytest.raises(ValueError, match="not whole 8x352 matrices"):
        matmul(raw[:-1], T.Q8_0, 8, 352, x)
    with pytest.raises(ValueError, match="x must be"):
        matmul(raw[: raw.size // 2], T.Q8_0, 8, 352, np.zeros((1, 351), np.float32))


def test_kernel_cache_goes_to_the_per_user_cache_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(CLOVER_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    code = "import numba, clover_runtime.kernels as k; print(numba.config.CACHE_DIR); print(k.kernel_cache_dir())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    cache, base = (Path(line) for line in out.stdout.splitlines())
    assert base == tmp_path / "home" / "cache" / "numba"
    assert cache.parent == base and cache.is_dir()  # one subdirectory per version of the sources
