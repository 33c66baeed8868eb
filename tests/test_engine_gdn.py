"""The chunked (WY / UT-transform) gated delta rule against the per-token recurrence.

Both are checked against a plain per-head loop written here from docs/architecture.md §4 step 5, in
float64, so the two engine forms are not only compared with each other.
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.engine import gdn


def _inputs(n: int, nk: int = 2, nv: int = 4, dk: int = 16, dv: int = 12, seed: int = 0):  # noqa: ANN202
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, nk, dk)).astype(np.float32)
    k = rng.standard_normal((n, nk, dk)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((n, nv, dv)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (n, nv)).astype(np.float32)
    # decays from ~1 (g near 0) to total forgetting (g = -40), as ssm_a · softplus(...) produces
    g = -np.exp(rng.uniform(-6.0, 3.7, (n, nv))).astype(np.float32)
    s0 = rng.standard_normal((nv, dk, dv)).astype(np.float32)
    return q, k, v, beta, g, s0


def _slow(q, k, v, beta, g, s0):  # noqa: ANN001, ANN202
    n, nk, _ = q.shape
    nv = v.shape[1]
    S = [s0[h].astype(np.float64) for h in range(nv)]
    out = np.zeros(v.shape)
    for t in range(n):
        for h in range(nv):
            kk, qq = k[t, h % nk].astype(np.float64), q[t, h % nk].astype(np.float64)
            S[h] = np.exp(float(g[t, h])) * S[h]
            e = v[t, h] - S[h].T @ kk
            S[h] = S[h] + np.outer(kk, beta[t, h] * e)
            out[t, h] = S[h].T @ qq
    return out, np.array(S)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("n, chunk", [(1, 64), (7, 64), (150, 64), (150, 7), (64, 64), (129, 32)])
def test_chunked_equals_recurrent(n: int, chunk: int) -> None:
    q, k, v, beta, g, s0 = _inputs(n, seed=n + chunk)
    want_o, want_s = _slow(q, k, v, beta, g, s0)
    rec_o, rec_s = gdn.recurrent(q, k, v, beta, g, s0.copy())
    chk_o, chk_s = gdn.chunked(q, k, v, beta, g, s0, chunk=chunk)
    assert _rel(rec_o, want_o) < 2e-5 and _rel(rec_s, want_s) < 2e-5
    assert _rel(chk_o, want_o) < 2e-5 and _rel(chk_s, want_s) < 2e-5
    assert _rel(chk_o, rec_o) < 2e-5 and _rel(chk_s, rec_s) < 2e-5


def test_chunked_leaves_input_state_alone() -> None:
    q, k, v, beta, g, s0 = _inputs(40)
    before = s0.copy()
    gdn.chunked(q, k, v, beta, g, s0)
    assert np.array_equal(s0, before)


def test_tiled_value_heads_read_key_head_h_mod_k() -> None:
    """With one token and S = 0: o_h = β_h (k_κ·q_κ) v_h with κ = h % k_heads."""
    q, k, v, beta, g, _ = _inputs(1, nk=2, nv=6)
    s0 = np.zeros((6, 16, 12), np.float32)
    o, _ = gdn.recurrent(q, k, v, beta, g, s0)
    for h in range(6):
        kappa = h % 2
        want = beta[0, h] * float(k[0, kappa] @ q[0, kappa]) * v[0, h]
        assert np.allclose(o[0, h], want, rtol=1e-5, atol=1e-6)
