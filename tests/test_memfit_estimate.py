"""Memory-fit arithmetic against hand-computed bytes from docs/architecture.md §6, and the verdict /
largest-context logic against machines described exactly (SystemMemory values chosen by the test)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clover_runtime.gguf_file import open_gguf
from clover_runtime.memory_fit import (
    FITS,
    NO_FIT,
    PAGING,
    FitAdvice,
    GiB,
    GpuMemory,
    SystemMemory,
    assess,
    estimate,
    fit_report,
    gdn_state_bytes,
    gpu_fit,
    kv_bytes_per_token,
    largest_context,
    nvidia_gpus,
    parse_nvidia_smi,
    probe_system,
    size_text,
    table_contexts,
)
from clover_runtime.model_config import describe
from clover_runtime.synth import SynthSpec
from inspect_helpers import real_shape_path, write_model

from clover_cli.advice import fit_advice_text, fit_hint
from clover_cli.fit_table import gpu_fit_text


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with open_gguf(real_shape_path(tmp_path_factory.getbasetemp())) as m:
        return describe(m), m.tensor_bytes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_model(Path(tmp_path_factory.mktemp("memfit")) / "tiny.gguf")
    with open_gguf(path) as m:
        return describe(m), m.tensor_bytes


def test_kv_cache_per_token_real_shape(real):
    cfg, _ = real
    assert kv_bytes_per_token(cfg, "f16") == 10 * 2 * 2 * 256 * 2 == 20 * 1024
    assert kv_bytes_per_token(cfg, "q8_0") == 10 * 2 * (2 * 256 // 32) * 34
    assert estimate(cfg, 0, 131072, cache_type="f16").kv_cache == int(2.5 * GiB)  # the doc's 2.5 GiB at 131,072
    assert estimate(cfg, 0, 131072).kv_cache == 5 * GiB  # what clover's float32 cache takes


def test_gdn_state_real_shape(real):
    cfg, _ = real
    state = 30 * 32 * 128 * 128 * 4
    ring = 30 * 3 * (2 * 16 * 128 + 32 * 128) * 4
    assert gdn_state_bytes(cfg) == state + ring
    assert 62e6 < state < 64e6  # "≈ 63 MB"


def test_estimate_scales_per_sequence(real):
    cfg, weights = real
    one = estimate(cfg, weights, 8192)
    four = estimate(cfg, weights, 8192, n_parallel=4)
    assert one.weights == four.weights == weights
    assert four.kv_cache == 4 * one.kv_cache == 4 * 8192 * 40960
    assert four.gdn_state == 4 * one.gdn_state
    assert four.compute >= one.compute
    assert one.checkpoints == 8 * one.gdn_state and four.checkpoints == 4 * one.checkpoints  # prompt cache
    assert one.total == one.weights + one.kv_cache + one.gdn_state + one.checkpoints + one.compute


def test_compute_buffer_covers_logits_and_scores(real):
    cfg, weights = real
    small, big = estimate(cfg, weights, 4096), estimate(cfg, weights, 131072)
    assert big.compute > small.compute
    assert small.compute >= 32 * 248_320 * 4  # a 32-row diffusion block's logits
    assert big.compute >= 512 * 16 * 131072 * 4  # one prefill chunk's attention scores
    assert estimate(cfg, weights, 4096, n_parallel=8).compute >= 8 * 32 * 248_320 * 4


def test_assess_verdicts(tiny):
    cfg, weights = tiny
    est = estimate(cfg, 10 * GiB, 4096)  # pretend weights of 10 GiB
    exact = SystemMemory(64 * GiB, est.total + GiB)
    assert assess(est, exact).verdict == FITS
    paging = assess(est, SystemMemory(64 * GiB, est.total + GiB - 1))
    assert paging.verdict == PAGING and FitAdvice("smaller_quant", weights=10 * GiB) in paging.advice
    none = assess(est, SystemMemory(64 * GiB, est.without_weights + GiB - 1))
    assert none.verdict == NO_FIT and not none.fits


def test_largest_context_is_exact_multiple_of_256(real):
    cfg, weights = real
    at_8192 = estimate(cfg, weights, 8192).total
    sysm = SystemMemory(64 * GiB, at_8192 + GiB)
    assert largest_context(cfg, weights, sysm) == 8192
    assert largest_context(cfg, weights, SystemMemory(64 * GiB, at_8192 + GiB - 1)) == 8192 - 256
    assert largest_context(cfg, weights, SystemMemory(1 << 50, 1 << 50)) == 131072
    assert largest_context(cfg, weights, SystemMemory(GiB, GiB)) == 0
    paging = SystemMemory(64 * GiB, estimate(cfg, weights, 4096).without_weights + GiB)
    assert largest_context(cfg, weights, paging) == 0
    assert largest_context(cfg, weights, paging, paging=True) == 4096
    assert largest_context(cfg, weights, sysm, n_parallel=2) < 8192


def test_fit_report_table_and_advice(real):
    cfg, weights = real
    sysm = SystemMemory(32 * GiB, estimate(cfg, weights, 8192).total + GiB)
    rep = fit_report(cfg, weights, 20000, system=sysm)
    assert [r.n_ctx for r in rep.rows] == [4096, 16384, 20000, 32768, 65536, 131072]
    assert [r.chosen for r in rep.rows].count(True) == 1
    assert rep.largest_context == 8192
    assert rep.verdict.verdict == PAGING
    assert rep.verdict.advice[0] == FitAdvice("shorter_context", n_ctx=8192)
    assert fit_advice_text(rep.verdict.advice[0]) == ("a shorter context: -c 8192 fits entirely in RAM (too short "
                                                      "for agent clients such as Hermes Agent, which need -c 65536)")
    assert rep.to_json()["table"][2]["n_ctx"] == 20000


def test_shorter_context_advice_mentions_agent_clients_only_below_64k(real):
    cfg, weights = real
    roomy = SystemMemory(256 * GiB, estimate(cfg, weights, 98304).total + GiB)
    rep = fit_report(cfg, weights, 131072, system=roomy)
    assert fit_advice_text(rep.verdict.advice[0]) == "a shorter context: -c 98304 fits entirely in RAM"
    assert len(fit_hint(rep.verdict.advice).splitlines()) == 1
    assert fit_advice_text(rep.to_json()["verdict"]["advice"][0]) == fit_advice_text(rep.verdict.advice[0])


def test_table_contexts_capped():
    assert table_contexts(131072, 16384) == [4096, 16384, 32768, 65536, 131072]
    assert table_contexts(40000, 1024) == [1024, 4096, 16384, 32768, 40000]
    assert table_contexts(262144, 4096) == [4096, 16384, 32768, 65536, 131072]


def test_gpu_notes(tiny):
    cfg, weights = tiny
    est = estimate(cfg, weights, 1024)
    v = assess(est, SystemMemory(8 * GiB, 4 * GiB, [GpuMemory("Big", 80 * GiB, 70 * GiB),
                                                       GpuMemory("Small", GiB, 0)]))
    assert [(g.name, g.detailed, g.fits_all) for g in v.gpus] == [("Big", False, True), ("Small", False, False)]
    assert gpu_fit_text(v.gpus[0]).startswith("GPU 0 Big: 70.0 GiB free of 80.0 GiB; every weight would fit")
    assert "would not fit" in gpu_fit_text(v.gpus[1])


def test_gpu_notes_in_llama_cpp_flags_for_the_real_layout() -> None:
    """The Q4_K_M layout (21 GiB, 19.5 GiB of routed experts) on the cards people run it on."""
    from clover_runtime.synth.writer import plan_model

    plans = plan_model(SynthSpec.real_shape())
    tensors = {p.name: p for p in plans}
    cfg_weights = sum(p.n_bytes for p in plans)

    def note(total_gib: int, free_gib: float) -> str:
        gpu = GpuMemory("Card", total_gib * GiB, int(free_gib * GiB))
        return gpu_fit_text(gpu_fit(0, gpu, tensors, 40))

    on_gpu = size_text(cfg_weights - tensors["token_embd.weight"].n_bytes)
    assert note(80, 79) == f"GPU 0 Card: 79.0 GiB free of 80.0 GiB; -ngl 99 fits ({on_gpu} of weights on the GPU)"
    sixteen = note(16, 15.5)
    m = re.fullmatch(r"GPU 0 Card: 15\.5 GiB free of 16\.0 GiB; -ngl 99 --n-cpu-moe (\d+) fits "
                     r"\(([\d.]+) GiB of weights on the GPU, ([\d.]+) GiB of weights in RAM\)", sixteen)
    assert m, sixteen
    assert 0 < int(m[1]) < 40 and float(m[2]) <= 15.0
    assert "-ngl 99 --cpu-moe fits" in note(2, 1.9)
    assert note(1, 0.6).endswith("too small for any layer of this model")


def test_offloaded_layers_bring_their_cache_and_state_to_the_gpu(real) -> None:
    """At -c 16384 the 16 GB card also holds the K/V caches and GDN states (with the prompt
    cache's snapshots) of the layers it runs, so it keeps more layers' experts in RAM than the
    weights alone would say, and a long context can push a layer off an exactly-sized card."""
    from clover_runtime.memory_fit import layer_state_bytes
    from clover_runtime.offload import fit_experts, place
    from clover_runtime.synth.writer import plan_model

    cfg, weights = real
    tensors = {p.name: p for p in plan_model(SynthSpec.real_shape())}
    est = estimate(cfg, weights, 16384)
    state = layer_state_bytes(cfg, est)
    assert sum(state.values()) == est.kv_cache + est.gdn_state + est.checkpoints
    assert state[3] == kv_bytes_per_token(cfg) // cfg.n_attention_layers * 16384  # an attention layer
    free = 16 * GiB
    bare, full = fit_experts(tensors, 40, free), fit_experts(tensors, 40, free, layer_state=state)
    assert bare is not None and full is not None
    assert full.state_bytes == sum(state.values()) and full.device_total <= free - (512 << 20)
    assert full.n_cpu_moe >= bare.n_cpu_moe
    tight = place(tensors, 40, 99, n_cpu_moe=bare.n_cpu_moe)
    card = GpuMemory("Card", free, tight.device_bytes + (512 << 20))  # room for the weights only
    fit = gpu_fit(0, card, tensors, 40, state, 16384)
    assert fit.all_layers and fit.n_cpu_moe > bare.n_cpu_moe and fit.state_bytes == sum(state.values())
    note = gpu_fit_text(fit)
    assert f"--n-cpu-moe {bare.n_cpu_moe} " not in note and " at -c 16384 " in note, note
    assert "of cache and state on the GPU" in note
    from clover_runtime.offload import fit_layers

    layers = fit_layers(tensors, 40, free, layer_state=state)
    assert layers.state_bytes == sum(b for i, b in state.items() if i >= 40 - layers.n_gpu_layers)
    assert layers.device_total <= free - (512 << 20) < place(tensors, 40, layers.n_gpu_layers + 1,
                                                             layer_state=state).device_total


def test_parse_nvidia_smi():
    text = "NVIDIA H200, 143771, 143000\nNVIDIA GeForce RTX 4090, 24564, [N/A]\n\nTesla T4, 15360, 15101\n"
    assert parse_nvidia_smi(text) == [GpuMemory("NVIDIA H200", 143771 << 20, 143000 << 20),
                                      GpuMemory("Tesla T4", 15360 << 20, 15101 << 20)]
    assert parse_nvidia_smi("") == []


def test_probe_this_machine():
    sysm = probe_system()
    assert 0 < sysm.ram_available <= sysm.ram_total
    gpus = nvidia_gpus(timeout=5)  # whatever this machine has; never raises
    assert all(g.free <= g.total for g in gpus)


def test_single_setting_table_for_run_and_serve(real):
    """The short form other commands print before refusing to start."""
    import io

    from rich.console import Console

    from clover_cli.fit_table import print_fit_table

    cfg, weights = real
    est = estimate(cfg, weights, 65536, n_parallel=4, cache_type="f16")
    sysm = SystemMemory(16 * GiB, 8 * GiB)
    verdict = assess(est, sysm)
    buf = io.StringIO()
    print_fit_table(est, sysm, verdict, Console(file=buf, width=200))
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("memory fit: -c 65536 per sequence, -np 4, KV cache f16 (20.0 KiB/token)")
    row = lines[2].split()
    assert row[0] == "*65,536" and " ".join(row[-3:]) == "does not fit"
    assert f"{4 * 65536 * 20480 / GiB:.2f}" == row[3] == "5.00"  # KV cache column in GiB
    assert lines[3] == f"verdict  {verdict.message}"
    hint = fit_hint(verdict.advice)
    assert hint is not None and hint.startswith("try a smaller quant")
    assert "advice   fewer parallel sequences: -np 4 multiplies the KV cache and state" in lines
