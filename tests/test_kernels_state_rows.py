"""The chunked Gated DeltaNet's state passes (`kernels.state_rows`) against float64 sums written
from their definitions, at widths that take every column group (32, 16, then single columns),
and four rows a pass against one: each column's chain of multiply-adds is the same, so the bits
are too."""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.kernels.jit import njit
from clover_runtime.kernels.state_rows import chunk_sums, chunk_update


@njit
def _sums(S, K, Q, four, U, QS):
    i = 0
    while four and K.shape[0] - i >= 4:
        chunk_sums(4, S, K, Q, i, U, QS)
        i += 4
    while i < K.shape[0]:
        chunk_sums(1, S, K, Q, i, U, QS)
        i += 1


@njit
def _update(S, total, W, U, n):
    chunk_update(S, total, W, U, n)


@pytest.mark.parametrize("width", [128, 57, 16, 5])
def test_chunk_sums_are_the_state_read_by_each_row(width: int) -> None:
    rng = np.random.default_rng(width)
    depth, rows = 24, 11
    S = rng.standard_normal((depth, width)).astype(np.float32)
    K, Q = (rng.standard_normal((rows, depth)).astype(np.float32) for _ in range(2))
    got = {}
    for four in (True, False):
        U, QS = np.full((rows, width), np.nan, np.float32), np.full((rows, width), np.nan, np.float32)
        _sums(S, K, Q, four, U, QS)
        got[four] = (U, QS)
    for out, x in zip(got[True], (K, Q), strict=True):
        np.testing.assert_allclose(out, x.astype(np.float64) @ S.astype(np.float64), rtol=1e-5, atol=1e-5)
    for a, b in zip(got[True], got[False], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("width", [128, 57, 5])
@pytest.mark.parametrize("n", [0, 1, 9])
def test_chunk_update_decays_the_state_and_adds_each_row(width: int, n: int) -> None:
    rng = np.random.default_rng(10 * width + n)
    depth, chunk = 20, 12
    S = rng.standard_normal((depth, width)).astype(np.float32)
    W = rng.standard_normal((chunk, depth)).astype(np.float32)
    U = rng.standard_normal((chunk, width)).astype(np.float32)
    W[n:] = np.nan  # rows past n are never read
    U[n:] = np.nan
    total = np.float32(0.75)
    want = 0.75 * S.astype(np.float64) + W[:n].T.astype(np.float64) @ U[:n].astype(np.float64)
    _update(S, total, W, U, n)
    np.testing.assert_allclose(S, want, rtol=1e-5, atol=1e-5)
