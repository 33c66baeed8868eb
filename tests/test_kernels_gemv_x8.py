"""The decode-step pass (`kernels.gemv_x8`: eight weight rows against one activation row) gives each
row the bits of the one-row pass, so a token decoded alone rounds as it does inside a verified
block's commit; and both stay within quantization error of the float formulation.

A row alone takes the eight-row pass (Q4_K and Q5_K on AVX-512BW hosts, where it measured faster
on this machine: `Matrices._x8`, `kernels.x8_choice`; forced here with CLOVER_X8=on); the same
row in a batch of two takes `idot_rows`' two-row pass, whose bits equal its one-row pass
(tests/test_kernels_int.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.kernels import set_threads
from clover_runtime.kernels.gemv_x8 import fused_form
from clover_runtime.kernels.matmul import prepare
from clover_runtime.quants import dequantize_rows, quantize
from gguf.constants import GGMLQuantizationType as T


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request, monkeypatch):
    monkeypatch.setenv("CLOVER_X8", "on")  # the eight-row pass wherever the type has it
    set_threads(request.param)
    yield request.param
    set_threads(None)


def _matrix(rng, t, n_out, n_in, count=1):
    w = (rng.standard_normal((count * n_out, n_in)) * rng.uniform(0.2, 3.0, (count * n_out, 1))).astype(np.float32)
    raw = np.frombuffer(quantize(w, t), np.uint8).copy()
    return raw, prepare(raw, t, n_out, n_in, count)


@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0])
@pytest.mark.parametrize("n_out, n_in", [(64, 256), (37, 2048), (8, 512), (200, 768)])
def test_a_row_alone_has_its_bits_in_a_batch(threads, t, n_out, n_in):
    rng = np.random.default_rng(n_out * 7 + n_in)
    raw, m = _matrix(rng, t, n_out, n_in)
    x = (rng.standard_normal((2, n_in)) * 4).astype(np.float32)
    alone = m.matmul(x[:1])
    batch = m.matmul(x)
    assert np.array_equal(alone[0], batch[0])
    reference = x[:1].astype(np.float64) @ dequantize_rows(raw, t, n_in, slice(0, n_out)).astype(np.float64).T
    scale = np.abs(reference).max()
    assert np.abs(alone - reference).max() < 0.02 * scale


@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_K, T.Q6_K])
def test_expert_rows_alone_have_their_bits_in_a_batch(threads, t):
    """An expert that one row routes to takes the eight-row pass; the same row's product with an
    expert shared by two rows takes the batched one: each equals a product of that row alone."""
    rng = np.random.default_rng(5)
    n_out, n_in = 96, 1024
    _, m = _matrix(rng, t, n_out, n_in, count=4)
    x = rng.standard_normal((2, n_in)).astype(np.float32)
    ids = np.array([[0, 2], [1, 2]])  # experts 0 and 1 one row each, expert 2 both rows
    y = m.moe(x, ids)
    for i in range(2):
        alone = m.moe(x[i:i + 1], ids[i:i + 1])[0]
        assert np.array_equal(alone, y[i])


def test_k_quants_take_the_eight_row_form_where_it_measured_faster(monkeypatch):
    """The eight-row pass is offered for Q4_K and Q5_K on AVX-512 hosts and taken where this
    machine's startup measurement found it faster at the thread count (or CLOVER_X8 says)."""
    from clover_runtime.kernels import x8_choice
    from clover_runtime.kernels.intdot import x86_avx512

    assert fused_form(T.Q4_K) == fused_form(T.Q5_K) == x86_avx512()
    assert not fused_form(T.Q6_K)
    _, m = _matrix(np.random.default_rng(0), T.Q4_K, 16, 256)
    try:
        for n in (1, 2):
            set_threads(n)
            monkeypatch.delenv("CLOVER_X8", raising=False)
            measured = m._x8()
            assert measured == (x86_avx512() and x8_choice._choice[n])  # kept per thread count
            monkeypatch.setenv("CLOVER_X8", "on")
            assert m._x8() == x86_avx512()
            monkeypatch.setenv("CLOVER_X8", "off")
            assert not m._x8()
    finally:
        set_threads(None)


def test_the_startup_measurement_times_both_passes():
    from clover_runtime.kernels import x8_choice

    eight, one = x8_choice.measure(rounds=1)
    assert eight > 0 and one > 0


def test_prefetches_near_an_experts_end_go_to_the_next_expert_read():
    """The eight-row pass asks for the lines of the rows a thread reads next once its prefetches
    reach its expert's end: the first item of the next expert in the work list, only from the
    items whose prefetches can reach that end, and nowhere after the last expert."""
    from clover_runtime.kernels.gemv_x8 import LEAD_BYTES, ROWS
    from clover_runtime.kernels.intmatmul import _next_rows
    from clover_runtime.kernels.moe_rows import work_items

    rb, n_out = 288, 2048  # an expert's 512-wide down rows: 576 KB an expert
    expert_bytes = rb * n_out
    experts = np.array([3, 7, 5], np.int64)
    item_e, row0, row1 = work_items(experts, n_out, 64)
    then = [_next_rows(item_e, row0, row1, it, expert_bytes, rb) for it in range(len(item_e))]
    for it, got in enumerate(then):
        e = int(item_e[it])
        reaches = expert_bytes - int(row1[it]) * rb <= LEAD_BYTES + 2 * ROWS * rb
        if not reaches or e == experts[-1]:
            assert got == -1
        else:
            following = experts[list(experts).index(e) + 1]
            assert got == following * expert_bytes  # that expert's first row
    assert sum(g >= 0 for g in then) >= 2  # some items of each of the first two experts look ahead
