"""Synthetic models in every quant: stored types follow the mix, and gguf's dequantizer gives back
the float32 weights the generator intended, within each format's error."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from clover_runtime.gguf_file import open_gguf
from clover_runtime.model_config import describe
from clover_runtime.quants import quantize
from clover_runtime.synth import SynthSpec, WeightStream
from clover_runtime.synth.weights import storage_type
from clover_runtime.synth.writer import plan_model
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from synth_models import model_path

# Worst relative RMS error (over all tensors) allowed per stored type: about 1.4x what a
# correct encoder gives on Gaussian weights; any layout mistake gives errors near 1.4.
REL_RMS = {
    T.F32: 0.0, T.F16: 5e-4, T.BF16: 4e-3, T.Q8_0: 1e-2, T.Q4_0: 0.12, T.Q4_1: 0.11, T.Q5_0: 0.06,
    T.Q5_1: 0.055, T.Q4_K: 0.10, T.Q5_K: 0.052, T.Q6_K: 0.026,
}
F32_SUFFIXES = ("norm.weight", "ssm_a", "ssm_dt.bias", "ssm_conv1d.weight", "ssm_conv1d_right.weight",
                "ffn_gate_inp.weight", "ssm_bd_scale", "ssm_bd_hist_bias", "ssm_bd_hist_c",
                "ffn_gate_inp_shexp.weight")


def _check_against_intended(spec: SynthSpec) -> dict[str, int]:
    f = open_gguf(model_path(spec))
    describe(f)
    stream = WeightStream(spec)
    types = {}
    for plan in plan_model(spec):
        info = f.tensors[plan.name]
        assert info.ggml_type == plan.ggml_type and info.shape == plan.shape, plan.name
        raw = f.raw(plan.name).reshape(*plan.shape[:-1], -1)
        got = dequantize(raw, T(info.ggml_type)).reshape(plan.shape)
        want = stream.intended(plan)
        err = np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2))
        assert err <= REL_RMS[T(info.ggml_type)], f"{plan.name} {T(info.ggml_type).name}: rel RMS {err:.4f}"
        types[plan.name] = info.ggml_type
    return types


@pytest.mark.parametrize(
    "quant", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
)
def test_whole_file_quant_round_trips(quant):
    types = _check_against_intended(SynthSpec.small(quant=quant, n_layer=2, full_attention_interval=2))
    for name, t in types.items():
        if name.endswith(F32_SUFFIXES):
            assert t == T.F32, name
        else:
            assert t == T[quant], name


def test_q4_k_m_mix_follows_llama_cpp_choices():
    spec = SynthSpec.small(quant="Q4_K_M", n_layer=4)
    types = _check_against_intended(spec)
    expect_q6 = ("attn_v.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")
    for name, t in types.items():
        if name.endswith(F32_SUFFIXES):
            want = T.F32
        elif name == "output.weight" or name.endswith(expect_q6):
            want = T.Q6_K
        elif name.endswith("attn_qkv.weight"):
            want = T.Q5_K
        else:
            want = T.Q4_K
        assert t == want, f"{name}: {T(t).name}, expected {want.name}"
    assert types["token_embd.weight"] == T.Q4_K
    assert types["blk.3.attn_v.weight"] == T.Q6_K


def test_tiny_k_quants_fall_back_per_tensor_like_llama_cpp():
    # tiny rows are 64 or 32 long: Q4_K -> Q5_0, Q6_K -> Q8_0 (llama.cpp's fallbacks); a 48-wide
    # expert row fits no 32-block either, so ffn_down_exps falls back to F16.
    spec = SynthSpec.tiny(quant="Q4_K_M", expert_ff=48, shared_ff=48)
    types = _check_against_intended(spec)
    assert types["token_embd.weight"] == T.Q5_0
    assert types["output.weight"] == T.Q8_0
    assert types["blk.3.attn_v.weight"] == T.Q8_0
    assert types["blk.0.ffn_down_exps.weight"] == T.F16
    plans = {p.name: p for p in plan_model(spec)}
    down = plans["blk.0.ffn_down_exps.weight"]
    assert down.wanted_type == T.Q6_K and down.fell_back
    assert not plans["blk.0.ssm_a"].fell_back
    assert storage_type(T.Q5_K, 96) == T.Q5_1
    assert storage_type(T.Q4_0, 48) == T.F16
    assert storage_type(T.Q4_K, 512) == T.Q4_K


@pytest.mark.parametrize("quant", [T.Q4_K, T.Q8_0, T.BF16])
def test_pooled_tensors_encode_exactly_as_their_floats(quant):
    """Large tensors are gathered from quantized units; that must equal encoding the gathered floats."""
    spec = SynthSpec.small(fused_gate_up=True)
    plan = next(p for p in plan_model(spec) if p.name == "blk.0.ffn_gate_up_exps.weight")
    pooled = WeightStream(spec, pool_min=0)
    chunks = list(pooled.encoded_chunks(replace(plan, ggml_type=int(quant), wanted_type=int(quant))))
    floats = pooled.intended(plan)
    np.testing.assert_array_equal(np.concatenate([c.reshape(-1) for c in chunks]),
                                  quantize(floats, int(quant)).reshape(-1))
    # The pooled values still look like the unpooled ones: same scale, distinct experts.
    direct = WeightStream(spec).intended(plan)
    assert np.std(floats) == pytest.approx(np.std(direct), rel=0.05)
    assert not np.array_equal(floats[0], floats[1])
    assert not np.array_equal(floats, direct)
