"""The compiled cache attention (kernels.attend_cache) against softmax attention in float64."""

from __future__ import annotations

import numpy as np
import pytest

kernels = pytest.importorskip("clover_runtime.kernels")


def _reference(q, K, V, limits):
    n, heads, d = q.shape
    g = heads // K.shape[0]
    out = np.zeros((n, heads, V.shape[2]))
    for r in range(n):
        for h in range(heads):
            m = limits[r]
            if m == 0:
                continue
            s = K[h // g, :m].astype(np.float64) @ q[r, h].astype(np.float64) / np.sqrt(d)
            p = np.exp(s - s.max())
            out[r, h] = p @ V[h // g, :m] / p.sum()
    return out


@pytest.mark.parametrize(("n", "m", "threads"), [(1, 5, 1), (1, 3000, 2), (4, 1100, 2), (3, 700, 1)])
def test_cache_attention_matches_softmax(n, m, threads):
    rng = np.random.default_rng(n * 1000 + m)
    kvh, heads, d, dv, cap = 2, 8, 64, 48, m + 37  # the cache has room past the rows in use
    K = rng.standard_normal((kvh, cap, d)).astype(np.float32) * 2
    V = rng.standard_normal((kvh, cap, dv)).astype(np.float32)
    q = rng.standard_normal((n, heads, d)).astype(np.float32)
    limits = m - n + 1 + np.arange(n)  # causal rows at the end of the cache
    kernels.set_threads(threads)
    try:
        got = kernels.attend_cache(q, K, V, limits)
    finally:
        kernels.set_threads(None)
    want = _reference(q, K, V, limits)
    assert got.shape == (n, heads, dv) and got.dtype == np.float32
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_has_its_bits_alone_and_among_rows(threads):
    """Each row's scores and weighted values are summed in position order whatever rows share the
    call and wherever its length cuts a tile of positions (a verified commit rounds as AR does)."""
    rng = np.random.default_rng(7)
    K = rng.standard_normal((2, 400, 64)).astype(np.float32)
    V = rng.standard_normal((2, 400, 32)).astype(np.float32)
    q = rng.standard_normal((3, 8, 64)).astype(np.float32)
    limits = np.array([63, 130, 257])  # inside the first tile, past the second, one past the fifth
    kernels.set_threads(threads)
    try:
        together = kernels.attend_cache(q, K, V, limits)
        for r in range(3):
            alone = kernels.attend_cache(q[r:r + 1], K, V, limits[r:r + 1])
            assert np.array_equal(alone[0], together[r]), r
    finally:
        kernels.set_threads(None)


def test_a_row_seeing_nothing_gets_zeros_and_bad_inputs_are_refused():
    K = np.ones((1, 8, 4), np.float32)
    V = np.ones((1, 8, 4), np.float32)
    q = np.ones((2, 2, 4), np.float32)
    out = kernels.attend_cache(q, K, V, np.array([0, 3]))
    assert np.all(out[0] == 0) and np.allclose(out[1], 1)
    with pytest.raises(ValueError, match="limits"):
        kernels.attend_cache(q, K, V, np.array([0, 9]))
    with pytest.raises(ValueError, match="inconsistent"):
        kernels.attend_cache(q, K[:, :, :3], V, np.array([1, 1]))


def test_rope_rotates_pairs_as_the_document_says():
    from clover_runtime.kernels.attention import rope

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 32)).astype(np.float32)  # rotate the first 24 dims (12 pairs), keep 8
    positions = np.array([0, 7, 40000])
    inv = 1e7 ** (-np.arange(12, dtype=np.float64) * 2.0 / 24)
    got = rope(x, positions, inv)
    ang = positions[:, None, None] * inv[None, None, :]
    x64 = x.astype(np.float64)
    x1, x2 = x64[..., :12], x64[..., 12:24]
    c, s = np.cos(ang), np.sin(ang)
    want = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x64[..., 24:]], -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0], x[0])  # position 0: no rotation
    np.testing.assert_array_equal(got[..., 24:], x[..., 24:])
    np.testing.assert_array_equal(rope(x[1:2], positions[1:2], inv), got[1:2])
    np.testing.assert_array_equal(rope(x, positions, inv[:0]), x)
