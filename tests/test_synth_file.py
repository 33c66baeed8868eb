"""Synthetic GGUF files: header, tensor table and variants, checked against gguf.GGUFReader."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from clover_runtime.gguf_file import open_gguf
from clover_runtime.model_config import describe, has_clover_tensors, supports_exact_diffusion
from clover_runtime.synth import SynthSpec, write_model
from clover_runtime.text.vocab import default_chat_template
from gguf import GGUFReader, GGUFValueType
from synth_models import model_path, tiny_model_path

ARCH_KEYS = (
    "block_count", "full_attention_interval", "embedding_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base", "ssm.group_count",
    "ssm.time_step_rank", "ssm.state_size", "ssm.inner_size", "ssm.conv_kernel", "expert_count",
    "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length", "context_length",
)


def _reader_value(field):
    if field.types[0] == GGUFValueType.ARRAY:
        return list(field.contents())
    return field.contents()


def _assert_matches_reader(path):
    """Our parser and gguf's reader agree on every key, tensor type, shape and offset."""
    ours = open_gguf(path)
    reader = GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert set(fields) == set(ours.metadata)
    for key, field in fields.items():
        got = ours.metadata[key]
        want = _reader_value(field)
        if isinstance(got, np.ndarray):
            got = got.tolist()
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-7), key
        else:
            assert got == want, key
    assert [t.name for t in reader.tensors] == list(ours.tensors)
    for t in reader.tensors:
        info = ours.tensors[t.name]
        assert info.ggml_type == int(t.tensor_type), t.name
        assert info.ne == tuple(int(d) for d in t.shape), t.name
        assert info.offset == t.data_offset, t.name
        assert info.n_bytes == t.n_bytes, t.name
    return ours


def test_tiny_header_has_every_key_and_matches_the_reader():
    spec = SynthSpec.tiny()
    f = _assert_matches_reader(tiny_model_path())
    meta, a = f.metadata, spec.arch
    assert meta["general.architecture"] == "clover-moe"
    for key in ARCH_KEYS:
        assert f"{a}.{key}" in meta, key
    want = {
        "block_count": 4, "full_attention_interval": 4, "embedding_length": 64, "attention.head_count": 4,
        "attention.head_count_kv": 2, "attention.key_length": 32, "attention.value_length": 32,
        "rope.dimension_count": 8, "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.state_size": 16,
        "ssm.inner_size": 64, "ssm.conv_kernel": 4, "expert_count": 8, "expert_used_count": 2,
        "expert_feed_forward_length": 32, "expert_shared_feed_forward_length": 32,
    }
    for key, value in want.items():
        assert meta[f"{a}.{key}"] == value, key
    assert meta[f"{a}.rope.freq_base"] == pytest.approx(1e7)
    assert meta[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert meta["general.file_type"] == 0
    assert meta["general.quantization_version"] == 2
    assert meta["general.name"] == "clover-synth"
    assert meta[f"{a}.diffusion.block_length"] == 32
    assert meta[f"{a}.diffusion.threshold"] == pytest.approx(0.9)
    assert meta[f"{a}.diffusion.shift_logits"] is True
    tokens = meta["tokenizer.ggml.tokens"]
    assert tokens[meta["tokenizer.ggml.mask_token_id"]] == "<|mask|>"
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "qwen35"
    assert len(meta["tokenizer.ggml.merges"]) > 100
    assert meta["tokenizer.chat_template"] == default_chat_template()


def test_tiny_model_is_described_as_specified():
    with open_gguf(tiny_model_path()) as f:
        cfg = describe(f)
        assert cfg.layer_is_attention == (False, False, False, True)
        assert (cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == (64, 4, 2, 32)
        assert (cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_state, cfg.ssm_v_dim) == (2, 4, 16, 16)
        assert (cfg.n_expert, cfg.n_expert_used, cfg.expert_ff, cfg.shared_ff) == (8, 2, 32, 32)
        assert cfg.n_vocab >= cfg.n_tokens and cfg.n_vocab % 64 == 0
        assert cfg.diffusion.mask_token_id is not None and cfg.diffusion.mask_token_id < cfg.n_tokens
        assert has_clover_tensors(cfg, f.tensors) and supports_exact_diffusion(cfg, f.tensors)
        assert f.tensors["blk.0.ssm_bd_scale"].shape == (4,)
        assert f.tensors["blk.0.ssm_conv1d_right.weight"].shape == (cfg.ssm_conv_dim, 3)
        assert "output.weight" in f.tensors


@pytest.mark.parametrize(
    "variant",
    [
        dict(fused_qkv=True, fused_gate_up=True, tied_output=True),
        dict(clover_tensors=False, diffusion_keys=False, arch="qwen35moe", chat_template=False),
        dict(arch="qwen3next", n_layer=8, quant="Q8_0"),
    ],
    ids=["fused-tied", "plain-qwen35moe", "qwen3next-8-layers"],
)
def test_variants_open_and_describe(variant):
    spec = SynthSpec.tiny(**variant)
    f = _assert_matches_reader(model_path(spec))
    cfg = describe(f)
    assert cfg.arch == spec.arch and cfg.n_layer == spec.n_layer
    names = set(f.tensors)
    attn = [i for i in range(spec.n_layer) if spec.is_attention(i)]
    assert cfg.attention_layers == attn
    for i in attn:
        assert (f"blk.{i}.attn_qkv.weight" in names) == spec.fused_qkv
        assert (f"blk.{i}.attn_v.weight" in names) == (not spec.fused_qkv)
    assert ("blk.0.ffn_gate_up_exps.weight" in names) == spec.fused_gate_up
    assert ("output.weight" in names) == (not spec.tied_output)
    assert has_clover_tensors(cfg, f.tensors) == spec.clover_tensors
    assert (cfg.diffusion.mask_token_id is not None) == spec.diffusion_keys
    assert any(k.startswith(f"{spec.arch}.diffusion.") for k in f.metadata) == spec.diffusion_keys
    assert ("tokenizer.chat_template" in f.metadata) == spec.chat_template


def _f32(f, name):
    t = f.tensors[name]
    return f.raw(name).view(np.float32).reshape(t.shape)


def test_fused_tensors_hold_the_split_values():
    split = open_gguf(tiny_model_path())
    fused = open_gguf(tiny_model_path(fused_qkv=True, fused_gate_up=True, tied_output=True))
    qkv = _f32(fused, "blk.3.attn_qkv.weight")
    parts = [_f32(split, f"blk.3.attn_{x}.weight") for x in "qkv"]
    np.testing.assert_array_equal(qkv, np.concatenate(parts, axis=0))
    gate_up = _f32(fused, "blk.1.ffn_gate_up_exps.weight")
    gate, up = _f32(split, "blk.1.ffn_gate_exps.weight"), _f32(split, "blk.1.ffn_up_exps.weight")
    np.testing.assert_array_equal(gate_up, np.concatenate([gate, up], axis=1))
    np.testing.assert_array_equal(_f32(fused, "token_embd.weight"), _f32(split, "token_embd.weight"))


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_spec_and_seed_give_the_same_bytes(tmp_path):
    spec = SynthSpec.tiny(quant="Q4_K_M", fused_gate_up=True)
    a = write_model(tmp_path / "a.gguf", spec)
    b = write_model(tmp_path / "b.gguf", spec)
    c = write_model(tmp_path / "c.gguf", spec.with_(seed=1))
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)
    assert a.stat().st_size == c.stat().st_size


def test_tensors_override_is_stored_exactly_in_f32_and_closely_in_q8_0(tmp_path):
    spec = SynthSpec.tiny()
    rng = np.random.default_rng(7)
    n_vocab = open_gguf(tiny_model_path()).tensors["token_embd.weight"].shape[0]
    embd = rng.standard_normal((n_vocab, 64)).astype(np.float32)
    down = rng.standard_normal((8, 64, 32)).astype(np.float32)
    ov = {"token_embd.weight": embd, "blk.2.ffn_down_exps.weight": down}
    f = open_gguf(write_model(tmp_path / "o.gguf", spec, tensors_override=ov))
    np.testing.assert_array_equal(_f32(f, "token_embd.weight"), embd)
    np.testing.assert_array_equal(_f32(f, "blk.2.ffn_down_exps.weight"), down)
    base = open_gguf(tiny_model_path())
    np.testing.assert_array_equal(_f32(f, "blk.2.ffn_up_exps.weight"), _f32(base, "blk.2.ffn_up_exps.weight"))

    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    q = open_gguf(write_model(tmp_path / "q.gguf", spec.with_(quant="Q8_0"), tensors_override=ov))
    t = q.tensors["blk.2.ffn_down_exps.weight"]
    assert t.ggml_type == int(GGMLQuantizationType.Q8_0)
    got = dequantize(q.raw(t.name).reshape(8, 64, -1), GGMLQuantizationType.Q8_0)
    np.testing.assert_allclose(got, down, atol=np.abs(down).max() / 127 * 0.51 + 1e-6)


def test_tensors_override_rejects_unknown_names_and_wrong_shapes(tmp_path):
    spec = SynthSpec.tiny()
    with pytest.raises(ValueError, match="no tensor 'blk.9.attn_q.weight'"):
        write_model(tmp_path / "x.gguf", spec, tensors_override={"blk.9.attn_q.weight": np.zeros((256, 64))})
    with pytest.raises(ValueError, match="shape"):
        write_model(tmp_path / "x.gguf", spec, tensors_override={"output_norm.weight": np.zeros(65)})
    assert not (tmp_path / "x.gguf").exists()
    assert not list(tmp_path.iterdir())
