"""The compiled Gated DeltaNet kernels (chunked for prefill, token by token for decode) against the
per-token recurrence written from docs/architecture.md §4."""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.kernels import gdn_chunked, gdn_mixer, gdn_recurrent

RTOL = 1e-5


def _inputs(T: int, hk: int, hv: int, dk: int, dv: int, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, hk, dk))
    k = rng.standard_normal((T, hk, dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, hv, dv))
    a = rng.standard_normal((T, hv))
    g = -rng.uniform(0.05, 2.0, hv) * np.log1p(np.exp(a + 0.5))  # ssm_a · softplus(a + dt), ≤ 0
    beta = 1 / (1 + np.exp(-rng.standard_normal((T, hv))))
    S0 = rng.standard_normal((hv, dk, dv)) * 0.5
    return [x.astype(np.float32) for x in (q, k, v, g, beta, S0)]


def _per_token(q, k, v, g, beta, S0):
    """The recurrence one token at a time, in float64: the oracle."""
    T, hk, _ = q.shape
    hv = v.shape[1]
    S = S0.astype(np.float64).copy()
    o = np.zeros(v.shape)
    for t in range(T):
        for h in range(hv):
            kk, qq = k[t, h % hk].astype(np.float64), q[t, h % hk].astype(np.float64)
            S[h] *= np.exp(float(g[t, h]))
            e = v[t, h] - S[h].T @ kk
            S[h] += np.outer(kk, beta[t, h] * e)
            o[t, h] = S[h].T @ qq
    return o, S


def _close(got, want):
    assert got.dtype == np.float32
    scale = np.max(np.abs(want))
    assert np.max(np.abs(got - want)) <= RTOL * scale, np.max(np.abs(got - want)) / scale


@pytest.mark.parametrize("T", [1, 37, 150])  # one token; less than a chunk; two chunks and a remainder
def test_chunked_equals_per_token_recurrence(T):
    q, k, v, g, beta, S0 = _inputs(T, hk=2, hv=4, dk=32, dv=24, seed=T)
    o, S = gdn_chunked(q, k, v, g, beta, S0)
    ref_o, ref_S = _per_token(q, k, v, g, beta, S0)
    _close(o, ref_o)
    _close(S, ref_S)


def test_state_carries_across_calls_and_input_state_is_untouched():
    q, k, v, g, beta, S0 = _inputs(90, hk=1, hv=2, dk=16, dv=16, seed=3)
    before = S0.copy()
    o1, S1 = gdn_chunked(q[:50], k[:50], v[:50], g[:50], beta[:50], S0, chunk=16)
    o2, S2 = gdn_chunked(q[50:], k[50:], v[50:], g[50:], beta[50:], S1, chunk=16)
    ref_o, ref_S = _per_token(q, k, v, g, beta, S0)
    _close(np.concatenate([o1, o2]), ref_o)
    _close(S2, ref_S)
    np.testing.assert_array_equal(S0, before)


def test_bad_shapes_are_refused():
    q, k, v, g, beta, S0 = _inputs(4, hk=2, hv=4, dk=8, dv=8, seed=1)
    with pytest.raises(ValueError, match="state must be"):
        gdn_chunked(q, k, v, g, beta, S0[:3])
    with pytest.raises(ValueError, match="inconsistent shapes"):
        gdn_chunked(q, k, v, g[:3], beta, S0)


@pytest.mark.parametrize("T", [1, 2, 8])  # decode, and the few rows of a short commit
def test_token_by_token_kernel_equals_the_recurrence(T):
    q, k, v, g, beta, S0 = _inputs(T, hk=2, hv=4, dk=32, dv=24, seed=10 + T)
    before = S0.copy()
    o, S = gdn_recurrent(q, k, v, g, beta, S0)
    ref_o, ref_S = _per_token(q, k, v, g, beta, S0)
    _close(o, ref_o)
    _close(S, ref_S)
    np.testing.assert_array_equal(S0, before)  # a new state unless told to write in place
    o2, S2 = gdn_recurrent(q, k, v, g, beta, S0, S0)  # in place: the decode path's own state
    assert S2 is S0
    _close(o2, ref_o)
    _close(S0, ref_S)


def test_token_by_token_kernel_continues_a_state_and_refuses_bad_shapes():
    q, k, v, g, beta, S0 = _inputs(6, hk=1, hv=2, dk=16, dv=16, seed=4)
    S = S0.copy()
    outs = [gdn_recurrent(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], S, S)[0] for t in range(6)]
    ref_o, ref_S = _per_token(q, k, v, g, beta, S0)
    _close(np.concatenate(outs), ref_o)
    _close(S, ref_S)
    with pytest.raises(ValueError, match="state must be"):
        gdn_recurrent(q, k, v, g, beta, S0[:1])
    with pytest.raises(ValueError, match="S_out"):
        gdn_recurrent(q, k, v, g, beta, S0, np.empty((2, 16, 8), np.float32))


def _mixer_reference(u, ring, taps, z, b, a, dt, ssm_a, S0, norm_w, eps, hk):
    """The mixer step by step in float64: conv over [ring; u], SiLU, split and L2-normalise q/k,
    β = σ(b), g = ssm_a·softplus(a + dt), the per-token recurrence, RMSNorm(o)·SiLU(z)."""
    n, C = u.shape
    hv, dk, dv = S0.shape
    xx = np.concatenate([ring, u]).astype(np.float64)
    K = taps.shape[1]
    x = np.stack([sum(xx[t + j] * taps[:, j] for j in range(K)) for t in range(n)])
    x = x / (1 + np.exp(-x))
    q = x[:, :hk * dk].reshape(n, hk, dk)
    k = x[:, hk * dk:2 * hk * dk].reshape(n, hk, dk)
    q = q / np.sqrt((q ** 2).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt((k ** 2).sum(-1, keepdims=True) + 1e-6)
    v = x[:, 2 * hk * dk:].reshape(n, hv, dv)
    beta = 1 / (1 + np.exp(-b.astype(np.float64)))
    g = ssm_a * np.log1p(np.exp(a.astype(np.float64) + dt))
    o, S = _per_token(q, k, v, g, beta, S0)
    o = o / np.sqrt((o ** 2).mean(-1, keepdims=True) + eps) * norm_w * (z / (1 + np.exp(-z.astype(np.float64))))
    return o.reshape(n, hv * dv), xx[-(K - 1):], S


@pytest.mark.parametrize("n", [1, 3, 8])
def test_fused_mixer_equals_the_step_by_step_layer(n):
    rng = np.random.default_rng(20 + n)
    hk, hv, dk, dv, K = 2, 4, 16, 8, 4
    C = 2 * hk * dk + hv * dv
    f32 = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    u, ring, taps, z = f32(n, C), f32(K - 1, C), f32(C, K, scale=0.5), f32(n, hv, dv)
    b, a, dt = f32(n, hv), f32(n, hv), f32(hv)
    ssm_a = -rng.uniform(0.1, 2.0, hv).astype(np.float32)
    S0, norm_w = f32(hv, dk, dv, scale=0.5), f32(dv)
    want_y, want_ring, want_S = _mixer_reference(u, ring, taps, z, b, a, dt, ssm_a, S0, norm_w, 1e-6, hk)
    before = (ring.copy(), S0.copy())
    y, new_ring, S = gdn_mixer(u, ring, taps, z, b, a, dt, ssm_a, S0, norm_w, 1e-6, hk)
    _close(y, want_y)
    _close(new_ring, want_ring)
    _close(S, want_S)
    np.testing.assert_array_equal(ring, before[0])  # untouched unless told to write in place
    np.testing.assert_array_equal(S0, before[1])
    y2, r2, S2 = gdn_mixer(u, ring, taps, z, b, a, dt, ssm_a, S0, norm_w, 1e-6, hk, S_out=S0, ring_out=ring)
    assert r2 is ring and S2 is S0
    np.testing.assert_array_equal(S2, S)  # in place or not, the same bits
    np.testing.assert_array_equal(y2, y)
    _close(y2, want_y)
    _close(ring, want_ring)
    _close(S0, want_S)
    with pytest.raises(ValueError, match="inconsistent"):
        gdn_mixer(u, ring, taps, z[:, :2], b, a, dt, ssm_a, S0, norm_w, 1e-6, hk)


def test_fused_mixer_gives_the_same_bits_wherever_its_scratch_lands():
    """Two kernel threads, one input, 3000 calls with the heap stirred between them: every output
    is bit-identical (a sum in a loop that also stored took the vector or the scalar form by how
    close malloc put the scratch arrays, and 7-22 of 3000 calls differed by an ulp; a verified
    commit must round as AR's steps do, call after call)."""
    from clover_runtime.kernels.jit import current_threads, set_threads

    rng = np.random.default_rng(5)
    hk, hv, dk, dv, K = 2, 4, 32, 32, 4
    C = 2 * hk * dk + hv * dv
    f32 = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    u, ring, taps, z = f32(1, C), f32(K - 1, C), f32(C, K, scale=0.5), f32(1, hv, dv)
    b, a, dt = f32(1, hv), f32(1, hv), f32(hv)
    ssm_a = -rng.uniform(0.1, 2.0, hv).astype(np.float32)
    S0, norm_w = f32(hv, dk, dv, scale=0.5), f32(dv)
    before = current_threads()
    set_threads(2)
    try:
        want = gdn_mixer(u, ring, taps, z, b, a, dt, ssm_a, S0, norm_w, 1e-6, hk)[0]
        held: list[np.ndarray] = []
        differing = 0
        for _ in range(3000):
            held.append(np.empty(int(rng.integers(1, 400)), np.float32))
            if len(held) > 50:
                held.pop(int(rng.integers(0, len(held))))
            differing += not np.array_equal(want, gdn_mixer(u, ring, taps, z, b, a, dt, ssm_a, S0, norm_w, 1e-6, hk)[0])
    finally:
        set_threads(before)
    assert differing == 0, f"{differing} of 3000 calls rounded differently"
