"""The compiled MoE row glue (kernels.moe_rows) and RMSNorm (kernels.norm) against float64
formulations written from the model document, and a row alone against the same row in a batch."""

from __future__ import annotations

import numpy as np
import pytest

rows = pytest.importorskip("clover_runtime.kernels.moe_rows")
norm = pytest.importorskip("clover_runtime.kernels.norm")

RNG = np.random.default_rng(7)


def _softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("n", [1, 5, 40])  # the serial and the parallel form
def test_route_picks_the_top_k_and_renormalises(n):
    logits = (RNG.standard_normal((n, 256)) * 3).astype(np.float32)
    ids, weights = rows.route(logits, 8)
    p = _softmax64(logits)
    want = np.argsort(-p, axis=1, kind="stable")[:, :8]
    assert ids.dtype == np.int64 and weights.dtype == np.float32
    np.testing.assert_array_equal(ids, want)
    top = np.take_along_axis(p, want, axis=1)
    np.testing.assert_allclose(weights, top / top.sum(axis=1, keepdims=True), rtol=1e-5)


def test_route_breaks_ties_by_the_lower_id_and_survives_bad_rows():
    logits = np.zeros((3, 16), np.float32)
    logits[0, [3, 9, 12]] = 5.0
    logits[2, :] = np.nan
    ids, weights = rows.route(logits, 4)
    assert list(ids[0]) == [3, 9, 12, 0]
    assert list(ids[1]) == [0, 1, 2, 3]
    np.testing.assert_allclose(weights[1], 0.25)
    assert np.all((ids[2] >= 0) & (ids[2] < 16)) and len(set(ids[2])) == 4  # a NaN row still names real experts


def test_group_orders_slots_by_expert_stably():
    ids = RNG.integers(0, 32, size=(9, 4))
    counts, order, starts, used = rows.group(ids, 32)
    flat = ids.reshape(-1)
    np.testing.assert_array_equal(counts, np.bincount(flat, minlength=32))
    np.testing.assert_array_equal(order, np.argsort(flat, kind="stable"))
    np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(counts)]))
    np.testing.assert_array_equal(used, np.unique(flat))
    with pytest.raises(ValueError, match="0..31"):
        rows.group(ids + 1 - ids.min() + 31, 32)


def test_swiglu_equals_silu_times_up():
    gu = (RNG.standard_normal((20, 8, 2 * 48)) * 4).astype(np.float64)
    g32 = gu.astype(np.float32)
    got = rows.swiglu(g32[..., :48], g32[..., 48:])  # views of a fused gate | up
    gate, up = gu[..., :48], gu[..., 48:]
    want = gate / (1 + np.exp(-gate)) * up
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    alone = np.ascontiguousarray(g32[3:4])
    np.testing.assert_array_equal(rows.swiglu(alone[..., :48].copy(), alone[..., 48:].copy()), got[3:4])
    with pytest.raises(ValueError, match="alike"):
        rows.swiglu(g32[..., :48], g32[..., :40])


@pytest.mark.parametrize("n", [1, 17])
def test_mix_sums_the_experts_and_the_gated_shared_expert(n):
    w = RNG.random((n, 8)).astype(np.float32)
    down = RNG.standard_normal((n, 8, 64)).astype(np.float32)
    shared = RNG.standard_normal((n, 64)).astype(np.float32)
    h = RNG.standard_normal((n, 96)).astype(np.float32)
    gate = RNG.standard_normal(96).astype(np.float32)
    d64 = down.astype(np.float64)
    experts = np.einsum("nk,nkd->nd", w.astype(np.float64), d64)
    g = 1 / (1 + np.exp(-(h.astype(np.float64) @ gate.astype(np.float64))))
    np.testing.assert_allclose(rows.mix(w, down), experts, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rows.mix(w, down, shared), experts + shared, rtol=1e-5, atol=1e-5)
    got = rows.mix(w, down, shared, h, gate)
    np.testing.assert_allclose(got, experts + g[:, None] * shared, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rows.mix(w[-1:], down[-1:], shared[-1:], h[-1:], gate), got[-1:])


@pytest.mark.parametrize("shape", [(1, 2048), (3, 4, 128), (40, 256)])
def test_rms_norm_matches_float64(shape):
    x = (RNG.standard_normal(shape) * 5).astype(np.float32)
    weight = RNG.standard_normal(shape[-1]).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 ** 2, axis=-1, keepdims=True) + 1e-6)
    got = norm.rms_norm(x, weight, 1e-6)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want * weight, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.rms_norm(x, None, 1e-6), want, rtol=1e-5, atol=1e-6)
    flat = x.reshape(-1, shape[-1])
    np.testing.assert_array_equal(norm.rms_norm(flat[-1:], weight, 1e-6), got.reshape(-1, shape[-1])[-1:])
    assert np.all(norm.rms_norm(np.zeros((2, 8), np.float32), None, 1e-6) == 0)


def test_work_items_cover_each_experts_rows_in_runs():
    item_expert, row0, row1 = rows.work_items(np.array([3, 7, 250]), 100, 16)
    per = 7  # 6 runs of 16 and one of 4
    np.testing.assert_array_equal(item_expert, np.repeat([3, 7, 250], per))
    np.testing.assert_array_equal(row0, np.tile(np.arange(0, 100, 16), 3))
    np.testing.assert_array_equal(row1, np.minimum(row0 + 16, 100))
