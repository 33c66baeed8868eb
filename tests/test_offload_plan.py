"""GPU placement without torch or a GPU: llama.cpp's `-ngl`, `--cpu-moe` and `--n-cpu-moe` over
the tensors of the real Clover-35B-A3B layout (Q4_K_M, planned by the synthetic-model writer),
and the fit against a simulated 16 GB card."""

from __future__ import annotations

import pytest
from clover_runtime.offload import (
    AUTO,
    DEVICE_RESERVE,
    fit_experts,
    fit_layers,
    is_routed_expert,
    layer_of,
    parse_gpu_layers,
    place,
)
from clover_runtime.synth import SynthSpec
from clover_runtime.synth.writer import plan_model

GIB = 1 << 30
N_LAYER = 40


@pytest.fixture(scope="module")
def sizes() -> dict:
    """The writer's plan of the real file: each entry has the shape and bytes a header gives."""
    return {p.name: p for p in plan_model(SynthSpec.real_shape())}


def _matrices(sizes: dict) -> set[str]:
    return {n for n, t in sizes.items() if len(t.shape) in (2, 3)}


def test_ngl_counts_layers_from_the_last_and_the_head_comes_above_the_layer_count(sizes) -> None:
    assert not place(sizes, N_LAYER, 0).any
    ten = place(sizes, N_LAYER, 10)
    assert {layer_of(n) for n in ten.device_tensors} == set(range(30, 40))
    assert "output.weight" not in place(sizes, N_LAYER, 40).device_tensors
    everything = place(sizes, N_LAYER, 99)
    assert everything.device_tensors == _matrices(sizes) - {"token_embd.weight"}
    assert everything.n_gpu_layers == N_LAYER + 1
    total = sum(t.n_bytes for t in sizes.values())
    assert everything.device_bytes + everything.host_bytes == total  # untied: the embedding stays behind
    assert everything.device_bytes == sum(sizes[n].n_bytes for n in everything.device_tensors)


def test_cpu_moe_keeps_every_routed_expert_in_system_memory(sizes) -> None:
    p = place(sizes, N_LAYER, 99, cpu_moe=True)
    experts = {n for n in sizes if is_routed_expert(n)}
    assert experts and not experts & p.device_tensors and p.n_cpu_moe == N_LAYER
    assert p.device_bytes < 2 * GIB, "attention, GDN, router, shared experts and the head: about 1.5 GiB"
    assert p.host_bytes > 19 * GIB
    some = place(sizes, N_LAYER, 99, n_cpu_moe=30)
    kept = {layer_of(n) for n in experts - some.device_tensors}
    assert kept == set(range(30)) and some.n_cpu_moe == 30


def test_auto_puts_as_many_layers_as_fit_a_16_gb_card(sizes) -> None:
    free = 16 * GIB
    p = fit_layers(sizes, N_LAYER, free)
    assert 0 < p.n_gpu_layers < N_LAYER and p.device_bytes <= free - DEVICE_RESERVE
    assert place(sizes, N_LAYER, p.n_gpu_layers + 1).device_bytes > free - DEVICE_RESERVE
    assert fit_layers(sizes, N_LAYER, 64 * GIB).n_gpu_layers == N_LAYER + 1
    assert not fit_layers(sizes, N_LAYER, 256 << 20).any


def test_fewest_expert_layers_on_the_cpu_for_a_16_gb_card(sizes) -> None:
    free = 16 * GIB
    p = fit_experts(sizes, N_LAYER, free)
    assert p is not None and 0 < p.n_cpu_moe < N_LAYER and p.device_bytes <= free - DEVICE_RESERVE
    tighter = place(sizes, N_LAYER, 99, n_cpu_moe=p.n_cpu_moe - 1)
    assert tighter.device_bytes > free - DEVICE_RESERVE
    assert fit_experts(sizes, N_LAYER, 1 * GIB) is None


@pytest.mark.parametrize(("text", "value"), [(None, AUTO), ("auto", AUTO), ("-1", AUTO), ("0", 0), ("99", 99),
                                             ("all", 1 << 30), (" 12 ", 12)])
def test_ngl_values(text, value) -> None:  # noqa: ANN001
    assert parse_gpu_layers(text) == value


def test_ngl_rejects_words() -> None:
    with pytest.raises(ValueError, match="-ngl takes a layer count, auto or all, not 'lots'"):
        parse_gpu_layers("lots")


def test_planned_placement_for_the_ram_check(sizes) -> None:
    """What the check before loading counts in RAM: the weights a placement leaves behind."""
    from clover_runtime.offload import OffloadRequest, planned_placement

    assert planned_placement(sizes, N_LAYER, OffloadRequest(0), 16 * GIB) is None  # -ngl 0
    assert planned_placement(sizes, N_LAYER, OffloadRequest(), None) is None  # auto, no GPU seen
    auto = planned_placement(sizes, N_LAYER, OffloadRequest(), 16 * GIB)
    assert auto == fit_layers(sizes, N_LAYER, 16 * GIB)
    experts = planned_placement(sizes, N_LAYER, OffloadRequest(99, cpu_moe=True), None)
    assert experts == place(sizes, N_LAYER, 99, cpu_moe=True)
    assert experts.host_bytes < sum(t.n_bytes for t in sizes.values()) - GIB  # 1.3+ GiB leaves RAM
