"""Per-call setup of weight products: done once at load, not on every forward (issue 13, item 3)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from clover_runtime.loader import load_model
from clover_runtime.quants import dequantize
from engine_models import synth_model, token_ids

numba = pytest.importorskip("numba")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = synth_model(tmp_path_factory.mktemp("engine-weights"), "Q4_K", preset="tiny")
    return load_model(path, backend="numba", n_threads=1)


def test_every_matrix_is_prepared_at_load(model) -> None:  # noqa: ANN001
    matrices = {n for n, i in model.file.tensors.items() if len(i.shape) in (2, 3)}
    assert matrices and model.weights.prepared == matrices


def test_prepared_product_equals_dequantized_weight(model) -> None:  # noqa: ANN001
    name = "blk.0.ffn_gate_shexp.weight"
    info = model.file.tensors[name]
    w = dequantize(model.file.raw(name), info.ggml_type, info.shape).astype(np.float64)
    x = np.random.default_rng(0).standard_normal((3, info.shape[1])).astype(np.float32)
    got = model.weights.matmul(name, x)
    scale = np.abs(x) @ np.abs(w).T
    assert np.all(np.abs(got - x @ w.T) <= 1e-5 * scale)


def test_enter_costs_nothing_once_applied(model) -> None:  # noqa: ANN001
    # It used to rescan /proc/self/maps and reload the BLAS library: ~2-4 ms per call.
    model.weights.enter()
    t0 = time.perf_counter()
    for _ in range(100):
        model.weights.enter()
    assert time.perf_counter() - t0 < 0.1
    assert numba.get_num_threads() == 1


def test_thread_count_still_follows_the_model(model, tmp_path) -> None:  # noqa: ANN001
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here")
    other = load_model(synth_model(tmp_path, "Q8_0", preset="tiny"), backend="numba", n_threads=2)
    ids = token_ids(3, model.config.n_tokens)
    other.forward(ids)
    assert numba.get_num_threads() == 2
    model.forward(ids)
    assert numba.get_num_threads() == 1


@pytest.fixture(scope="module")
def int_model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = synth_model(tmp_path_factory.mktemp("engine-weights-int"), "Q4_K", preset="small")
    return load_model(path, backend="numba", n_threads=1)


def test_products_of_one_input_equal_separate_products(int_model) -> None:  # noqa: ANN001
    # matmuls quantizes the shared input once; each product must be what matmul gives alone
    w = int_model.weights
    names = ["blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_beta.weight", "blk.0.ssm_alpha.weight"]
    assert w.integer_tensors & set(names)
    x = np.random.default_rng(1).standard_normal((3, w.info(names[0]).shape[1])).astype(np.float32)
    for got, name in zip(w.matmuls(names, x), names, strict=True):
        np.testing.assert_array_equal(got, w.matmul(name, x))


def test_expert_products_sharing_routes_equal_separate_products(int_model) -> None:  # noqa: ANN001
    w, cfg = int_model.weights, int_model.config
    gate, up, down = (f"blk.1.ffn_{p}_exps.weight" for p in ("gate", "up", "down"))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, w.info(gate).shape[-1])).astype(np.float32)
    ids = np.stack([rng.choice(cfg.n_expert, cfg.n_expert_used, replace=False) for _ in range(5)])
    routes = w.routes(ids, cfg.n_expert)
    g, u = w.expert_products([w.matrix(gate), w.matrix(up)], x, ids, routes)  # the layers' bound handles
    np.testing.assert_array_equal(g, w.moe_matmul(gate, x, ids))
    np.testing.assert_array_equal(u, w.moe_matmul(up, x, ids))
    act = (g * u).astype(np.float32)  # one input per routed slot
    np.testing.assert_array_equal(w.moe_matmul(down, act, ids, routes), w.moe_matmul(down, act, ids))
    with pytest.raises(ValueError, match="expert ids must lie"):
        w.routes(ids + cfg.n_expert, cfg.n_expert)
