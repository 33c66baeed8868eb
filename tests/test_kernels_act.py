"""The compiled activations (kernels.act) against sigmoid and SiLU in float64."""

from __future__ import annotations

import numpy as np
import pytest

act = pytest.importorskip("clover_runtime.kernels.act")


@pytest.mark.parametrize("shape", [(1, 7), (3, 5000), (40, 4096)])  # tail only; one chunk; several chunks
def test_activations_match_float64(shape):
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 12).astype(np.float32)
    x.flat[:4] = [0.0, -0.0, 88.5, -88.5]
    ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    for got, want in ((act.sigmoid(x), ref), (act.silu(x), x * ref)):
        assert got.shape == x.shape and got.dtype == np.float32
        assert np.all(np.abs(got - want) <= 1e-6 * np.abs(want) + 1e-30)


def test_extremes_stay_finite_and_saturate():
    x = np.array([-1e30, -1e4, 1e4, 1e30], np.float32)
    s = act.sigmoid(x)
    assert np.all(np.isfinite(s)) and s[0] < 1e-30 and s[1] < 1e-30 and s[2] == 1 and s[3] == 1
    np.testing.assert_allclose(act.silu(x)[2:], x[2:])
    assert np.all(np.abs(act.silu(x)[:2]) < 1e-20)


def test_a_row_alone_rounds_as_in_a_large_batch():
    x = (np.random.default_rng(3).standard_normal((40, 4096)) * 6).astype(np.float32)  # the parallel form
    for fn in (act.sigmoid, act.silu):
        big = fn(x)
        for r in (0, 17, 39):  # the one-thread form, at other vector offsets than in the batch
            np.testing.assert_array_equal(fn(x[r:r + 1, 1:]), big[r:r + 1, 1:])
