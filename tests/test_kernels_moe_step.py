"""A decode row's one-call MoE (`kernels.moe_step`) gives the bits the step-by-step path gives that
row inside a batch (routing, grouped expert products, SwiGLU, the shared expert, the weighted
sum: a verified block's commit), and stays within quantization error of a float64 MoE written
from the model document."""

from __future__ import annotations

import numpy as np
import pytest

moe_step = pytest.importorskip("clover_runtime.kernels.moe_step")
from clover_runtime.kernels import moe_rows, prepare, set_threads  # noqa: E402
from clover_runtime.kernels.matmul import Routes  # noqa: E402
from clover_runtime.quants import dequantize_rows, quantize  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402

HIDDEN, FF, SHARED_FF, N_EXPERT, K = 512, 256, 256, 16, 4


@pytest.fixture(params=[(1, "on"), (1, "off"), (2, "on")], ids=["1t-x8", "1t-one-row", "2t-x8"])
def threads(request, monkeypatch):
    n, x8 = request.param
    monkeypatch.setenv("CLOVER_X8", x8)
    set_threads(n)
    yield n
    set_threads(None)


def _stack(rng, t, count, n_out, n_in):
    w = (rng.standard_normal((count * n_out, n_in)) * rng.uniform(0.3, 2.0, (count * n_out, 1))).astype(np.float32)
    raw = np.frombuffer(quantize(w, t), np.uint8).copy()
    dense = dequantize_rows(raw, t, n_in, slice(0, count * n_out)).astype(np.float64).reshape(count, n_out, n_in)
    return prepare(raw, t, n_out, n_in, count), dense


def _step_by_step(x, logits, gu, dn, sgu, sdn, gate_inp):
    """`engine.moe.moe`'s steps for every row of x together."""
    ids, weights = moe_rows.route(logits, K)
    routes = Routes(ids, N_EXPERT)
    g = gu.moe(x, ids, routes)
    act = moe_rows.swiglu(g[..., :FF], g[..., FF:])
    down = dn.moe(act, ids, routes)
    shared = None
    if sdn is not None:
        s = sgu.matmul(x)
        shared = sdn.matmul(moe_rows.swiglu(s[:, None, :SHARED_FF], s[:, None, SHARED_FF:])[:, 0])
    return moe_rows.mix(weights, down, shared, x, gate_inp if sdn is not None else None), np.unique(ids)


def _silu(v):
    return v / (1 + np.exp(-v))


def _float64_moe(x, logits, gu, dn, sgu, sdn, gate_inp):
    """The document's MoE in float64 on the dequantized weights (the routing taken as given)."""
    x = x.astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    top = np.argsort(-p, kind="stable")[:K]
    w = p[top] / p[top].sum()
    out = np.zeros(HIDDEN)
    for e, we in zip(top, w, strict=True):
        h = gu[e] @ x
        out += we * (dn[e] @ (_silu(h[:FF]) * h[FF:]))
    if sdn is not None:
        s = sgu[0] @ x
        sh = sdn[0] @ (_silu(s[:SHARED_FF]) * s[SHARED_FF:])
        out += sh / (1 + np.exp(-(x @ gate_inp))) if gate_inp is not None else sh
    return out


@pytest.mark.parametrize("types, shared, gated", [
    ((T.Q4_K, T.Q6_K, T.Q4_K, T.Q6_K), True, True),  # the Q4_K_M mix
    ((T.Q4_K, T.Q4_K, T.Q4_K, T.Q4_K), True, False),
    ((T.Q5_K, T.Q8_0, None, None), False, False),
    ((T.Q4_0, T.Q4_0, T.Q8_0, T.Q4_0), True, True),
])
def test_a_row_in_one_call_has_its_bits_in_a_batch(threads, types, shared, gated):
    rng = np.random.default_rng(sum(int(t or 0) for t in types) + 3 * shared + gated)
    gu, gu64 = _stack(rng, types[0], N_EXPERT, 2 * FF, HIDDEN)
    dn, dn64 = _stack(rng, types[1], N_EXPERT, HIDDEN, FF)
    sgu = sdn = sgu64 = sdn64 = None
    if shared:
        sgu, sgu64 = _stack(rng, types[2], 1, 2 * SHARED_FF, HIDDEN)
        sdn, sdn64 = _stack(rng, types[3], 1, HIDDEN, SHARED_FF)
    gate_inp = (rng.standard_normal(HIDDEN) * 0.05).astype(np.float32) if gated else None
    x = rng.standard_normal((3, HIDDEN)).astype(np.float32)
    logits = (rng.standard_normal((3, N_EXPERT)) * 2).astype(np.float32)
    plan = moe_step.Plan.build(K, gu, dn, sgu, sdn, gate_inp)
    assert plan is not None
    batch, batch_used = _step_by_step(x, logits, gu, dn, sgu, sdn, gate_inp)
    used = []
    for r in range(3):
        out, u = plan.run(x[r:r + 1], logits[r:r + 1])
        assert out.shape == (1, HIDDEN) and out.dtype == np.float32
        np.testing.assert_array_equal(out[0], batch[r])
        used.append(u)
        want = _float64_moe(x[r], logits[r].astype(np.float64), gu64, dn64, sgu64, sdn64,
                            None if gate_inp is None else gate_inp.astype(np.float64))
        assert np.abs(out[0] - want).max() < 0.03 * np.abs(want).max()
    np.testing.assert_array_equal(np.unique(np.concatenate(used)), batch_used)
    assert all(np.array_equal(u, np.sort(u)) and len(u) == K for u in used)


def test_only_integer_products_with_gate_and_up_together_have_a_plan():
    rng = np.random.default_rng(1)
    gu, _ = _stack(rng, T.Q4_K, N_EXPERT, 2 * FF, HIDDEN)
    dn, _ = _stack(rng, T.Q4_K, N_EXPERT, HIDDEN, FF)
    assert moe_step.Plan.build(K, gu, dn, None, None, None) is not None
    exact = prepare(np.frombuffer(quantize(np.ones((N_EXPERT * HIDDEN, FF), np.float32), T.Q4_K), np.uint8),
                    T.Q4_K, HIDDEN, FF, N_EXPERT, exact=True)  # float kernels: the step-by-step path
    assert moe_step.Plan.build(K, gu, exact, None, None, None) is None
    f16 = prepare(np.zeros(N_EXPERT * HIDDEN * FF * 2, np.uint8), T.F16, HIDDEN, FF, N_EXPERT)
    assert moe_step.Plan.build(K, gu, f16, None, None, None) is None
