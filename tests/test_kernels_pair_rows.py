"""The many-row Q8_0/Q4_0/Q4_K/Q5_K pass (`kernels.pair_rows`: two weight rows a 512-bit register)
gives every activation row the bits of a one-row product, on both of its integer forms (`vpdpbusd`
on AVX-512 VNNI hosts, sign-flipped `vpmaddubsw` elsewhere), so a verified commit still equals
AR's steps. Its agreement with an independent formulation is tests/test_kernels_int.py's.

The second form is compiled in a second process with CLOVER_SIMD=novnni and its own kernel cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clover_runtime.kernels import matmul, moe_matmul
from clover_runtime.kernels.intdot import vnni
from clover_runtime.kernels.pair_rows import pair_form
from clover_runtime.quants import quantize
from gguf.constants import GGMLQuantizationType as T
from novnni_form import novnni_products

TYPES = (T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K)
# (out, in): odd and even row counts, 1 to 16 blocks of 32, 1 to 3 blocks of 256
SHAPES = {T.Q8_0: ((37, 96), (40, 512), (9, 32), (64, 128)), T.Q4_0: ((37, 96), (40, 512), (9, 32), (64, 128)),
          T.Q4_K: ((37, 256), (40, 512), (9, 768), (6, 256)), T.Q5_K: ((37, 256), (40, 512), (9, 768), (6, 256))}
ROWS = (2, 5, 13, 32)
N_EXPERT = 4


def _extreme_q8_0(rng: np.random.Generator, n_out: int, n_in: int) -> np.ndarray:
    """Q8_0 rows whose bytes reach -128 and 127 (no quantizer writes -128, a file may)."""
    raw = quantize(rng.standard_normal((n_out, n_in)).astype(np.float32), T.Q8_0).reshape(-1, 34).copy()
    raw[:, 2:] = rng.choice(np.array([-128, -127, 0, 1, 127], np.int8), raw[:, 2:].shape).view(np.uint8)
    return raw.reshape(-1)


def _inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    data: dict[str, np.ndarray] = {}
    for t in TYPES:
        for n_out, n_in in SHAPES[t]:
            w = rng.standard_normal((n_out, n_in)) * rng.uniform(0.01, 1, (n_out, 1))
            data[f"w{t.name}-{n_out}-{n_in}"] = quantize(w.astype(np.float32), t).reshape(-1)
            e = rng.standard_normal((N_EXPERT, n_out, n_in)) * rng.uniform(0.01, 1, (N_EXPERT, n_out, 1))
            data[f"e{t.name}-{n_out}-{n_in}"] = quantize(e.astype(np.float32), t).reshape(-1)
    data["extreme"] = _extreme_q8_0(rng, 40, 512)
    for n_in in sorted({n_in for t in TYPES for _, n_in in SHAPES[t]}):
        for n in ROWS:
            x = rng.standard_normal((n, n_in)) * rng.uniform(0.1, 3, (n, 1))
            x[:, 5] *= 40
            data[f"x{n}-{n_in}"] = x.astype(np.float32)
            data[f"ids{n}-{n_in}"] = np.stack([rng.permutation(N_EXPERT)[:2] for _ in range(n)]).astype(np.int64)
    return data


def _products(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for t in TYPES:
        for n_out, n_in in SHAPES[t]:
            for n in ROWS:
                x, ids = data[f"x{n}-{n_in}"], data[f"ids{n}-{n_in}"]
                out[f"{t.name}-{n_out}-{n_in}-{n}"] = matmul(data[f"w{t.name}-{n_out}-{n_in}"], t, n_out, n_in, x)
                out[f"{t.name}-moe-{n_out}-{n_in}-{n}"] = moe_matmul(data[f"e{t.name}-{n_out}-{n_in}"], t, n_out,
                                                                     n_in, x, ids)
    for n in ROWS:
        out[f"extreme-{n}"] = matmul(data["extreme"], T.Q8_0, 40, 512, data[f"x{n}-512"])
    return out


def test_many_rows_give_each_row_the_one_row_bits() -> None:
    data = _inputs(np.random.default_rng(11))
    many = _products(data)
    checked = 0
    for t in TYPES:
        for n_out, n_in in SHAPES[t]:
            for n in ROWS:
                x, ids = data[f"x{n}-{n_in}"], data[f"ids{n}-{n_in}"]
                w, e = data[f"w{t.name}-{n_out}-{n_in}"], data[f"e{t.name}-{n_out}-{n_in}"]
                one = np.concatenate([matmul(w, t, n_out, n_in, x[i:i + 1]) for i in range(n)])
                np.testing.assert_array_equal(many[f"{t.name}-{n_out}-{n_in}-{n}"], one, err_msg=f"{t.name} {n} rows")
                one = np.concatenate([moe_matmul(e, t, n_out, n_in, x[i:i + 1], ids[i:i + 1]) for i in range(n)])
                np.testing.assert_array_equal(many[f"{t.name}-moe-{n_out}-{n_in}-{n}"], one,
                                              err_msg=f"{t.name} experts {n} rows")
                checked += 2
    for n in ROWS:
        x = data[f"x{n}-512"]
        one = np.concatenate([matmul(data["extreme"], T.Q8_0, 40, 512, x[i:i + 1]) for i in range(n)])
        np.testing.assert_array_equal(many[f"extreme-{n}"], one, err_msg=f"bytes of -128, {n} rows")
    assert checked == 2 * sum(len(SHAPES[t]) for t in TYPES) * len(ROWS)


def test_the_extreme_bytes_are_the_products_of_their_values() -> None:
    """Bytes of -128 (beyond what `abs` or the +128 offset keep in a byte) still multiply as -128."""
    rng = np.random.default_rng(3)
    raw = _extreme_q8_0(rng, 8, 64)
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float64).reshape(8, 2)
    w = blocks[:, 2:].view(np.int8).astype(np.float64).reshape(8, 2, 32) * d[:, :, None]
    x = np.zeros((6, 64), np.float32)
    x[:, ::7] = 127.0  # every quantized activation exactly -127, 0 or 127: no rounding in x
    x[1::2, ::7] = -127.0
    y = matmul(raw, T.Q8_0, 8, 64, x)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.reshape(8, 64).T, rtol=1e-5)


@pytest.mark.skipif(not (pair_form(T.Q8_0) and vnni()), reason="this host has no VNNI form to compare")
def test_the_vnni_form_gives_the_sign_flip_forms_bits(tmp_path: Path) -> None:
    data = _inputs(np.random.default_rng(11))
    other = novnni_products(tmp_path, "test_kernels_pair_rows", data)
    here = _products(data)
    assert set(here) == set(other)
    for key, value in here.items():
        np.testing.assert_array_equal(value, other[key], err_msg=key)
