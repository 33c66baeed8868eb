"""The integer kernels' 512-bit form (AVX-512BW hosts) gives the same bits as the 256-bit form: both
sum the same integers, only grouped differently, and the float steps stay block by block.

The 256-bit form is compiled in a second process with CLOVER_SIMD=avx2 and its own kernel cache
(compiled code is cached per form); both forms are checked against an independent formulation by
tests/test_kernels_int.py on whatever host runs them, and here against each other, bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clover_runtime.kernels import matmul, moe_matmul
from clover_runtime.kernels.intdot import x86_avx512
from clover_runtime.quants import quantize
from gguf.constants import GGMLQuantizationType as T

TYPES = (T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)
ROWS = (1, 3, 8, 13)
N_OUT, N_IN, N_EXPERT = 40, 512, 4

_PRODUCTS = '''
import sys
import numpy as np
from clover_runtime.kernels import matmul, moe_matmul
from clover_runtime.kernels.intdot import x86_avx512
from gguf.constants import GGMLQuantizationType as T
data = np.load(sys.argv[1])
out = {"avx512": np.array(x86_avx512())}
for t in (T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K):
    for n in (1, 3, 8, 13):
        x = data[f"x{n}"]
        out[f"{t.name}-{n}"] = matmul(data[f"w{t.name}"], t, 40, 512, x)
        out[f"{t.name}-moe-{n}"] = moe_matmul(data[f"e{t.name}"], t, 40, 512, x, data[f"ids{n}"])
np.savez(sys.argv[2], **out)
'''


def _inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    data: dict[str, np.ndarray] = {}
    for t in TYPES:
        w = rng.standard_normal((N_OUT, N_IN)) * rng.uniform(0.01, 1, (N_OUT, 1))
        data[f"w{t.name}"] = quantize(w.astype(np.float32), t).reshape(-1)
        e = rng.standard_normal((N_EXPERT, N_OUT, N_IN)) * rng.uniform(0.01, 1, (N_EXPERT, N_OUT, 1))
        data[f"e{t.name}"] = quantize(e.astype(np.float32), t).reshape(-1)
    for n in ROWS:
        x = rng.standard_normal((n, N_IN)) * rng.uniform(0.1, 3, (n, 1))
        x[:, 5] *= 40
        data[f"x{n}"] = x.astype(np.float32)
        data[f"ids{n}"] = np.stack([rng.permutation(N_EXPERT)[:2] for _ in range(n)]).astype(np.int64)
    return data


@pytest.mark.skipif(not x86_avx512(), reason="this host runs the 256-bit form only")
def test_512_bit_kernels_give_the_256_bit_kernels_bits(tmp_path: Path) -> None:
    data = _inputs(np.random.default_rng(5))
    np.savez(tmp_path / "in.npz", **data)
    env = {**os.environ, "CLOVER_SIMD": "avx2", "NUMBA_CACHE_DIR": str(tmp_path / "kernels")}
    subprocess.run([sys.executable, "-c", _PRODUCTS, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                   env=env, check=True, timeout=600)
    narrow = np.load(tmp_path / "out.npz")
    assert not bool(narrow["avx512"])  # the other process really ran the 256-bit form
    compared = 0
    for t in TYPES:
        for n in ROWS:
            x = data[f"x{n}"]
            wide = matmul(data[f"w{t.name}"], t, N_OUT, N_IN, x)
            np.testing.assert_array_equal(wide, narrow[f"{t.name}-{n}"], err_msg=f"{t.name}, {n} rows")
            wide = moe_matmul(data[f"e{t.name}"], t, N_OUT, N_IN, x, data[f"ids{n}"])
            np.testing.assert_array_equal(wide, narrow[f"{t.name}-moe-{n}"], err_msg=f"{t.name} experts, {n} rows")
            compared += 2
    assert compared == 2 * len(TYPES) * len(ROWS)
