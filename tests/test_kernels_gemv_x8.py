"""The decode-step pass (`kernels.gemv_x8`: eight weight rows against one activation row) gives each
row the bits of the one-row pass, so a token decoded alone rounds as it does inside a verified
block's commit; and both stay within quantization error of the float formulation.

A row alone takes the eight-row pass (Q4_K and Q5_K on AVX-512BW hosts, where it measured faster
on this machine: `Matrices._x8`, `kernels.x8_choice`; forced here with CLOVER_X8=on); the same
row in a batch of two takes `idot_rows`' two-row pass, whose bits equal its one-row pass
(tests/test_kernels_int.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clover_runtime.kernels import set_threads
from clover_runtime.kernels.gemv_x8 import fused_form
from clover_runtime.kernels.intdot import vnni
from clover_runtime.kernels.matmul import prepare
from clover_runtime.quants import dequantize_rows, quantize
from gguf.constants import GGMLQuantizationType as T
from novnni_form import novnni_products


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


def _extreme_k(t, n_out: int, n_in: int) -> np.ndarray:
    """K-quant rows whose every weight is the format's largest value (Q4_K's nibbles 15, Q5_K's 31,
    Q6_K's stored 63) and every scale and minimum its largest (63; Q6_K's 127): each sum of four
    products meets x = +-127 at up to 4 x 63 x 127, the most the VNNI form's 16-bit step holds."""
    size = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}[t]
    blocks = np.full((n_out * n_in // 256, size), 0xFF, np.uint8)
    if t == T.Q6_K:
        blocks[:, 192:208] = 127
        blocks[:, 208:210] = np.array([2e-3], np.float16).view(np.uint8)
    else:
        blocks[:, 0:4] = np.array([2e-3, 1e-3], np.float16).view(np.uint8)  # d, dmin
    return blocks.reshape(-1)


@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_K, T.Q6_K])
def test_the_largest_sums_keep_their_bits(threads, t):
    n_out, n_in = 128, 512  # runs of 8 rows or more at 1 and 2 threads: the eight-row pass
    raw = _extreme_k(t, n_out, n_in)
    m = prepare(raw, t, n_out, n_in, 1)
    x = np.full((2, n_in), 3.0, np.float32)
    x[:, 256:] = -3.0  # every activation quantizes to exactly +-127
    alone = m.matmul(x[:1])
    assert np.array_equal(alone[0], m.matmul(x)[0])
    reference = x[:1].astype(np.float64) @ dequantize_rows(raw, t, n_in, slice(0, n_out)).astype(np.float64).T
    np.testing.assert_allclose(alone, reference, rtol=1e-5, atol=1e-3)


def _products(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each matrix of `data` times its first activation row alone (the eight-row pass where the
    type has it) and times three rows (the one-row pass), at one thread."""
    out = {}
    set_threads(1)
    try:
        for key in [k for k in data if k.startswith("w")]:
            t, n_out, n_in = key[1:].split("-")
            m = prepare(data[key], T[t], int(n_out), int(n_in), 1)
            x = data["x" + n_in]
            out[key + "-alone"], out[key + "-three"] = m.matmul(x[:1]), m.matmul(x)
    finally:
        set_threads(None)
    return out


@pytest.mark.skipif(not (fused_form(T.Q4_K) and vnni()), reason="this host has no VNNI form to compare")
def test_the_vnni_forms_give_the_two_step_forms_bits(tmp_path: Path, monkeypatch) -> None:
    """On VNNI hosts the K-quant passes sum a part's products by fours (`vpdpbusd`), elsewhere by
    pairs then by the scale (`vpmaddubsw`, `vpmaddwd`): the same integers, so the same bits, in
    the eight-row pass and the one-row pass. The second form runs in a process of its own
    (CLOVER_SIMD=novnni, its own kernel cache)."""
    rng = np.random.default_rng(21)
    data: dict[str, np.ndarray] = {}
    for t in (T.Q4_K, T.Q5_K, T.Q6_K):
        for n_out, n_in in ((64, 256), (96, 2048), (128, 512)):  # runs of 8+ rows at 1 thread
            data[f"w{t.name}-{n_out}-{n_in}"] = _matrix(rng, t, n_out, n_in)[0]
        data[f"w{t.name}-136-512"] = _extreme_k(t, 136, 512)
    for n_in in (256, 512, 2048):
        data[f"x{n_in}"] = (rng.standard_normal((3, n_in)) * 4).astype(np.float32)
    other = novnni_products(tmp_path, "test_kernels_gemv_x8", data, CLOVER_X8="on")
    monkeypatch.setenv("CLOVER_X8", "on")
    here = _products(data)
    assert set(here) == set(other) and len(here) == 24
    for key, value in here.items():
        np.testing.assert_array_equal(value, other[key], err_msg=key)


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
