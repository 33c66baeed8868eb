"""Tiny Qwen3.5-MoE models in transformers' naming, and a converter from them to GGUF.

Written from docs/architecture.md §2-3 (not from the engine): HF tensor names -> GGUF names, the
`1 + w` offset on every RMSNorm weight except the GDN output norm, `ssm_a = -exp(A_log)`, and
GDN value heads moved from transformers' grouped order (value head j reads key head
j // (v_heads / k_heads)) to GGUF's tiled order (value head h reads key head h % k_heads).

`random_weights` needs only numpy; `build_hf_model` imports torch/transformers when called.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from clover_runtime.quants import quantize
from gguf import GGMLQuantizationType, GGUFWriter

QUANT_IDS = {t.name: int(t) for t in GGMLQuantizationType}
ALL_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M")


@dataclass(frozen=True)
class TinyShape:
    """Hyper-parameters of a tiny model of the Clover trunk."""

    vocab: int = 320  # embedding rows
    n_tokens: int = 320  # real tokens (ids past this are padding, masked by the engine)
    hidden: int = 64
    n_layer: int = 4
    interval: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    rope_dim: int = 8
    rope_base: float = 10000.0
    k_heads: int = 2
    v_heads: int = 4
    k_dim: int = 16
    v_dim: int = 16
    conv_kernel: int = 4
    n_expert: int = 8
    n_used: int = 2
    expert_ff: int = 32
    shared_ff: int = 48
    eps: float = 1e-6
    context: int = 4096

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    def is_attention(self, i: int) -> bool:
        return (i + 1) % self.interval == 0

    def with_(self, **kw: object) -> TinyShape:
        return replace(self, **kw)


# Every matrix's row length a multiple of 256, so every quant type (K-quants too) applies.
QUANT_SHAPE = TinyShape(vocab=384, n_tokens=370, hidden=256, head_dim=64, rope_dim=16, n_head=4, n_head_kv=2,
                        k_heads=2, v_heads=4, k_dim=32, v_dim=64, expert_ff=256, shared_ff=256)


def random_weights(shape: TinyShape, seed: int = 0, tied: bool = False) -> dict[str, np.ndarray]:
    """Random float32 weights named as transformers' Qwen3_5MoeForCausalLM state dict names them.

    Scales keep activations O(1) and the logits well spread, so argmax and routing have margins.
    """
    rng = np.random.default_rng(seed)
    s = shape

    def lin(out: int, inp: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((out, inp)) * gain / np.sqrt(inp)).astype(np.float32)

    def norm(n: int) -> np.ndarray:  # HF stores w with the model computing (1 + w)
        return (rng.standard_normal(n) * 0.2).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((s.vocab, s.hidden)).astype(np.float32),
        "model.norm.weight": norm(s.hidden),
    }
    if not tied:
        w["lm_head.weight"] = lin(s.vocab, s.hidden, 4.0)
    for i in range(s.n_layer):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(s.hidden)
        w[p + "post_attention_layernorm.weight"] = norm(s.hidden)
        if s.is_attention(i):
            a = p + "self_attn."
            w[a + "q_proj.weight"] = lin(2 * s.n_head * s.head_dim, s.hidden)
            w[a + "k_proj.weight"] = lin(s.n_head_kv * s.head_dim, s.hidden)
            w[a + "v_proj.weight"] = lin(s.n_head_kv * s.head_dim, s.hidden)
            w[a + "o_proj.weight"] = lin(s.hidden, s.n_head * s.head_dim)
            w[a + "q_norm.weight"] = norm(s.head_dim)
            w[a + "k_norm.weight"] = norm(s.head_dim)
        else:
            g = p + "linear_attn."
            w[g + "in_proj_qkv.weight"] = lin(s.conv_dim, s.hidden)
            w[g + "in_proj_z.weight"] = lin(s.v_heads * s.v_dim, s.hidden)
            w[g + "in_proj_b.weight"] = lin(s.v_heads, s.hidden)
            w[g + "in_proj_a.weight"] = lin(s.v_heads, s.hidden)
            w[g + "dt_bias"] = rng.standard_normal(s.v_heads).astype(np.float32)
            w[g + "A_log"] = np.log(rng.uniform(0.2, 4.0, s.v_heads)).astype(np.float32)
            conv = rng.standard_normal((s.conv_dim, 1, s.conv_kernel)) * 0.5
            w[g + "conv1d.weight"] = conv.astype(np.float32)
            w[g + "norm.weight"] = (1.0 + rng.standard_normal(s.v_dim) * 0.2).astype(np.float32)
            w[g + "out_proj.weight"] = lin(s.hidden, s.v_heads * s.v_dim)
        m = p + "mlp."
        w[m + "gate.weight"] = lin(s.n_expert, s.hidden, 3.0)
        w[m + "experts.gate_up_proj"] = np.stack([lin(2 * s.expert_ff, s.hidden) for _ in range(s.n_expert)])
        w[m + "experts.down_proj"] = np.stack([lin(s.hidden, s.expert_ff) for _ in range(s.n_expert)])
        w[m + "shared_expert.gate_proj.weight"] = lin(s.shared_ff, s.hidden)
        w[m + "shared_expert.up_proj.weight"] = lin(s.shared_ff, s.hidden)
        w[m + "shared_expert.down_proj.weight"] = lin(s.hidden, s.shared_ff)
        w[m + "shared_expert_gate.weight"] = lin(1, s.hidden)
    return w


def tiled_heads(shape: TinyShape) -> np.ndarray:
    """perm[h] = the transformers value head that becomes GGUF value head h."""
    r = shape.v_heads // shape.k_heads
    h = np.arange(shape.v_heads)
    return (h % shape.k_heads) * r + h // shape.k_heads


def _head_rows(shape: TinyShape) -> np.ndarray:
    perm = tiled_heads(shape)
    return (perm[:, None] * shape.v_dim + np.arange(shape.v_dim)[None, :]).reshape(-1)


def to_gguf_tensors(hf: dict[str, np.ndarray], shape: TinyShape, *, fused_qkv: bool = False,
                    fused_gate_up: bool = False, tied: bool = False) -> dict[str, np.ndarray]:
    """GGUF-named float32 tensors (numpy shapes) from transformers-named weights."""
    s = shape
    vrows = _head_rows(s)
    perm = tiled_heads(s)
    out = {"token_embd.weight": hf["model.embed_tokens.weight"],
           "output_norm.weight": hf["model.norm.weight"] + 1.0}
    if not tied:
        out["output.weight"] = hf["lm_head.weight"]
    for i in range(s.n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = hf[p + "input_layernorm.weight"] + 1.0
        out[b + "post_attention_norm.weight"] = hf[p + "post_attention_layernorm.weight"] + 1.0
        if s.is_attention(i):
            a = p + "self_attn."
            q, k, v = hf[a + "q_proj.weight"], hf[a + "k_proj.weight"], hf[a + "v_proj.weight"]
            if fused_qkv:
                out[b + "attn_qkv.weight"] = np.concatenate([q, k, v])
            else:
                out[b + "attn_q.weight"], out[b + "attn_k.weight"], out[b + "attn_v.weight"] = q, k, v
            out[b + "attn_output.weight"] = hf[a + "o_proj.weight"]
            out[b + "attn_q_norm.weight"] = hf[a + "q_norm.weight"] + 1.0
            out[b + "attn_k_norm.weight"] = hf[a + "k_norm.weight"] + 1.0
        else:
            g = p + "linear_attn."
            nqk = 2 * s.k_heads * s.k_dim
            qkv = hf[g + "in_proj_qkv.weight"]
            out[b + "attn_qkv.weight"] = np.concatenate([qkv[:nqk], qkv[nqk:][vrows]])
            out[b + "attn_gate.weight"] = hf[g + "in_proj_z.weight"][vrows]
            out[b + "ssm_beta.weight"] = hf[g + "in_proj_b.weight"][perm]
            out[b + "ssm_alpha.weight"] = hf[g + "in_proj_a.weight"][perm]
            out[b + "ssm_dt.bias"] = hf[g + "dt_bias"][perm]
            out[b + "ssm_a"] = -np.exp(hf[g + "A_log"][perm])
            conv = hf[g + "conv1d.weight"][:, 0, :]
            out[b + "ssm_conv1d.weight"] = np.concatenate([conv[:nqk], conv[nqk:][vrows]])
            out[b + "ssm_norm.weight"] = hf[g + "norm.weight"]
            out[b + "ssm_out.weight"] = hf[g + "out_proj.weight"][:, vrows]
        m = p + "mlp."
        out[b + "ffn_gate_inp.weight"] = hf[m + "gate.weight"]
        gu = hf[m + "experts.gate_up_proj"]
        if fused_gate_up:
            out[b + "ffn_gate_up_exps.weight"] = gu
        else:
            out[b + "ffn_gate_exps.weight"] = gu[:, :s.expert_ff]
            out[b + "ffn_up_exps.weight"] = gu[:, s.expert_ff:]
        out[b + "ffn_down_exps.weight"] = hf[m + "experts.down_proj"]
        out[b + "ffn_gate_inp_shexp.weight"] = hf[m + "shared_expert_gate.weight"].reshape(-1)
        out[b + "ffn_gate_shexp.weight"] = hf[m + "shared_expert.gate_proj.weight"]
        out[b + "ffn_up_shexp.weight"] = hf[m + "shared_expert.up_proj.weight"]
        out[b + "ffn_down_shexp.weight"] = hf[m + "shared_expert.down_proj.weight"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def clover_tensors(shape: TinyShape, seed: int = 1) -> dict[str, np.ndarray]:
    """Random Clover-only GDN preview tensors (our GGUF names) for every GDN layer."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(shape.n_layer):
        if shape.is_attention(i):
            continue
        b = f"blk.{i}."
        right = rng.standard_normal((shape.conv_dim, 3)) * 0.3
        out[b + "ssm_conv1d_right.weight"] = right.astype(np.float32)
        out[b + "ssm_bd_scale"] = rng.uniform(2.0, 6.0, shape.v_heads).astype(np.float32)
        out[b + "ssm_bd_hist_bias"] = rng.standard_normal(shape.v_heads).astype(np.float32)
        out[b + "ssm_bd_hist_c"] = rng.uniform(0.1, 1.0, shape.v_heads).astype(np.float32)
    return out


def tensor_type(name: str, array: np.ndarray, quant: str) -> str:
    """Storage type of one tensor: vectors and conv taps stay F32; Q4_K_M is Q4_K with Q6_K for
    the V/output projections, expert down projections and the LM head (llama.cpp's pattern)."""
    if array.ndim < 2 or "ssm_conv1d" in name:
        return "F32"
    if quant == "Q4_K_M":
        six = ("attn_v.", "attn_qkv.", "ffn_down", "output.weight", "ssm_out.")
        return "Q6_K" if any(t in name for t in six) else "Q4_K"
    return quant


def write_gguf(path: Path, tensors: dict[str, np.ndarray], shape: TinyShape, *, quant: str = "F32",
               arch: str = "qwen35moe", name: str = "tiny-oracle") -> Path:
    """Write a GGUF file with the metadata clover reads; matrices stored as `quant`."""
    s = shape
    writer = GGUFWriter(str(path), arch)
    writer.add_name(name)
    u32 = writer.add_uint32
    u32(f"{arch}.block_count", s.n_layer)
    u32(f"{arch}.full_attention_interval", s.interval)
    u32(f"{arch}.context_length", s.context)
    u32(f"{arch}.embedding_length", s.hidden)
    u32(f"{arch}.attention.head_count", s.n_head)
    u32(f"{arch}.attention.head_count_kv", s.n_head_kv)
    u32(f"{arch}.attention.key_length", s.head_dim)
    u32(f"{arch}.attention.value_length", s.head_dim)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", s.eps)
    u32(f"{arch}.rope.dimension_count", s.rope_dim)
    writer.add_float32(f"{arch}.rope.freq_base", s.rope_base)
    u32(f"{arch}.ssm.group_count", s.k_heads)
    u32(f"{arch}.ssm.time_step_rank", s.v_heads)
    u32(f"{arch}.ssm.state_size", s.k_dim)
    u32(f"{arch}.ssm.inner_size", s.v_heads * s.v_dim)
    u32(f"{arch}.ssm.conv_kernel", s.conv_kernel)
    u32(f"{arch}.expert_count", s.n_expert)
    u32(f"{arch}.expert_used_count", s.n_used)
    u32(f"{arch}.expert_feed_forward_length", s.expert_ff)
    u32(f"{arch}.expert_shared_feed_forward_length", s.shared_ff)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"<t{i}>" for i in range(s.n_tokens)])
    for tname, arr in tensors.items():
        t = tensor_type(tname, arr, quant)
        if t == "F32":
            writer.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))
        else:
            writer.add_tensor(tname, quantize(arr, QUANT_IDS[t]), raw_dtype=GGMLQuantizationType[t])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_config(shape: TinyShape, tied: bool = False):  # noqa: ANN201 (transformers type, imported lazily)
    from transformers import Qwen3_5MoeTextConfig

    s = shape
    return Qwen3_5MoeTextConfig(
        vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.n_layer, num_attention_heads=s.n_head,
        num_key_value_heads=s.n_head_kv, head_dim=s.head_dim, linear_conv_kernel_dim=s.conv_kernel,
        linear_key_head_dim=s.k_dim, linear_value_head_dim=s.v_dim, linear_num_key_heads=s.k_heads,
        linear_num_value_heads=s.v_heads, moe_intermediate_size=s.expert_ff,
        shared_expert_intermediate_size=s.shared_ff, num_experts_per_tok=s.n_used, num_experts=s.n_expert,
        rms_norm_eps=s.eps, max_position_embeddings=s.context, tie_word_embeddings=tied,
        layer_types=["full_attention" if s.is_attention(i) else "linear_attention" for i in range(s.n_layer)],
        rope_parameters={"rope_type": "default", "rope_theta": s.rope_base,
                         "partial_rotary_factor": s.rope_dim / s.head_dim},
    )


def build_hf_model(shape: TinyShape, weights: dict[str, np.ndarray], tied: bool = False):  # noqa: ANN201
    """transformers' Qwen3_5MoeForCausalLM holding exactly `weights` (float32, eager attention, eval)."""
    import torch
    from transformers import Qwen3_5MoeForCausalLM

    model = Qwen3_5MoeForCausalLM(hf_config(shape, tied)).to(torch.float32)
    state = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise AssertionError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.config._attn_implementation = "eager"
    return model.eval()
