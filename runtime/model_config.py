"""The typed description of a Clover-architecture model, read from GGUF metadata.

Every number comes from metadata (never from constants) so tiny test models and the real
35B model run through the same code. The same module knows which tensors the architecture
needs, with which shapes, and checks a file against that list before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ModelFileError
from .gguf_file import GGUFModelFile
from .gguf_header import TensorInfo

SUPPORTED_ARCHITECTURES = ("clover-moe", "qwen35moe", "qwen3next")
CLOVER_ONLY_SUFFIXES = ("ssm_conv1d_right.weight", "ssm_bd_scale", "ssm_bd_hist_bias", "ssm_bd_hist_c")
CLOVER_RIGHT_TAPS = 3


@dataclass(frozen=True)
class DiffusionConfig:
    """Block-diffusion settings stored in the file (our defaults where the vendor is silent)."""

    block_length: int
    threshold: float
    shift_logits: bool
    mask_token_id: int | None
    keys_present: tuple[str, ...]


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of one hybrid Gated-DeltaNet / gated-attention MoE model."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    rms_eps: float
    rope_dim: int
    rope_base: float
    full_attention_interval: int
    layer_is_attention: tuple[bool, ...]
    ssm_k_heads: int
    ssm_v_heads: int
    ssm_state: int  # key (and value) dimension per GDN head
    ssm_inner: int  # v_heads * v_dim
    ssm_conv_kernel: int
    n_expert: int
    n_expert_used: int
    expert_ff: int
    shared_ff: int
    n_vocab: int  # rows of the embedding (may be padded past the real tokens)
    n_tokens: int  # entries in the tokenizer's vocabulary
    context_length: int
    diffusion: DiffusionConfig
    name: str = ""

    @property
    def ssm_v_dim(self) -> int:
        return self.ssm_inner // self.ssm_v_heads

    @property
    def ssm_conv_dim(self) -> int:
        return 2 * self.ssm_k_heads * self.ssm_state + self.ssm_inner

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, a in enumerate(self.layer_is_attention) if a]

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i, a in enumerate(self.layer_is_attention) if not a]

    @property
    def n_attention_layers(self) -> int:
        return sum(self.layer_is_attention)

    @property
    def n_gdn_layers(self) -> int:
        return self.n_layer - self.n_attention_layers


# Sane ranges for every number clover reads, checked before anything is sized from it (a hostile or
# corrupt file must fail with one line naming the key, not allocate gigabytes or loop for minutes).
# Layer and expert caps follow llama.cpp (LLAMA_MAX_LAYERS 512, LLAMA_MAX_EXPERTS 512); the others
# are far beyond any real model.
MAX_LAYERS = 512
MAX_EXPERTS = 512
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_EMBD = 1 << 17
MAX_FF = 1 << 20
MAX_CONTEXT = (1 << 32) - 1  # a uint32; the memory fit, not this check, refuses what cannot fit
MAX_CONV_KERNEL = 64
MAX_BLOCK_LENGTH = 4096
_MISSING = object()


def _kind(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, np.ndarray)):
        return "an array"
    if isinstance(value, (float, np.floating)):
        return f"the float {value!r}" if np.isfinite(value) else f"{value!r}"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def meta_int(meta: Mapping[str, Any], key: str, lo: int, hi: int, default: Any = _MISSING) -> int:
    """An integer metadata value within [lo, hi], or ModelFileError naming the key."""
    value = meta.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ModelFileError(f"missing metadata key '{key}'")
        value = default
    if not _is_int(value):
        raise ModelFileError(f"metadata key '{key}' must be an integer, not {_kind(value)}")
    if not lo <= int(value) <= hi:
        raise ModelFileError(f"metadata key '{key}' is {int(value)}, outside the sane range {lo}..{hi}")
    return int(value)


def meta_float(meta: Mapping[str, Any], key: str, lo: float, hi: float, default: Any = _MISSING, *,
               open_low: bool = False) -> float:
    """A finite number within [lo, hi] ((lo, hi] with open_low), or ModelFileError naming the key."""
    value = meta.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ModelFileError(f"missing metadata key '{key}'")
        value = default
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ModelFileError(f"metadata key '{key}' must be a number, not {_kind(value)}")
    v = float(value)
    if not np.isfinite(v) or v > hi or v < lo or (open_low and v == lo):
        low = f"({lo:g}" if open_low else f"[{lo:g}"
        raise ModelFileError(f"metadata key '{key}' is {v!r}, outside the sane range {low}, {hi:g}]")
    return v


def meta_str(meta: Mapping[str, Any], key: str, default: Any = _MISSING) -> str:
    value = meta.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ModelFileError(f"missing metadata key '{key}'")
        return default
    if not isinstance(value, str):
        raise ModelFileError(f"metadata key '{key}' must be a string, not {_kind(value)}")
    return value


def _per_layer(meta: Mapping[str, Any], key: str, n_layer: int, layers: list[int], lo: int, hi: int,
               default: Any = _MISSING) -> int:
    """A head count stored once or per layer (0 for layers without it); the value `layers` use."""
    value = meta.get(key, _MISSING)
    if not isinstance(value, (list, np.ndarray)):
        return meta_int(meta, key, lo, hi, default)
    if len(value) != n_layer or not all(_is_int(v) for v in value):
        raise ModelFileError(f"metadata key '{key}' must be one integer per layer ({n_layer})")
    vals = {int(value[i]) for i in layers if int(value[i]) != 0}
    if len(vals) > 1:
        raise ModelFileError(f"per-layer head counts differ across layers: {sorted(vals)}")
    if not vals or not all(lo <= v <= hi for v in vals):
        raise ModelFileError(f"metadata key '{key}' holds {sorted(vals) or [0]}, outside the sane range {lo}..{hi}")
    return vals.pop()


def _layer_kinds(meta: Mapping[str, Any], arch: str, n_layer: int, tensors: Mapping[str, Any]) -> tuple:
    key = f"{arch}.full_attention_interval"
    if key in meta:
        interval = meta_int(meta, key, 1, MAX_LAYERS)
        return interval, tuple((i + 1) % interval == 0 for i in range(n_layer))
    kinds = tuple(f"blk.{i}.attn_q.weight" in tensors or f"blk.{i}.attn_q_norm.weight" in tensors
                  for i in range(n_layer))
    return 0, kinds


def _is_str_list(value: Any) -> bool:
    """A list of strings, checked by the types it holds: one C-level pass over a real vocabulary's
    ~250k entries instead of a Python-level test of each (this runs on every start, twice)."""
    return isinstance(value, list) and all(issubclass(t, str) for t in set(map(type, value)))


def check_tokenizer_metadata(meta: Mapping[str, Any]) -> int:
    """Types of the tokenizer keys clover reads (tokens, merges, token types, special ids, flags,
    template); returns the number of tokens. The tokenizer and template trust these afterwards."""
    tokens = meta.get("tokenizer.ggml.tokens")
    n_tokens = 0
    if tokens is not None:
        if not _is_str_list(tokens):
            raise ModelFileError("metadata key 'tokenizer.ggml.tokens' must be an array of strings")
        n_tokens = len(tokens)
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None and not _is_str_list(merges):
        raise ModelFileError("metadata key 'tokenizer.ggml.merges' must be an array of strings")
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and (not isinstance(types, np.ndarray) or types.dtype.kind not in "iu"
                              or len(types) != n_tokens):
        raise ModelFileError(f"metadata key 'tokenizer.ggml.token_type' must be {n_tokens} integers "
                             "(one per token)")
    for name in ("bos", "eos", "eot", "padding", "mask", "unknown", "seperator"):
        key = f"tokenizer.ggml.{name}_token_id"
        if key in meta:
            meta_int(meta, key, 0, max(n_tokens - 1, 0) if n_tokens else (1 << 31) - 1)
    for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"):
        if key in meta and not isinstance(meta[key], (bool, np.bool_)):
            raise ModelFileError(f"metadata key '{key}' must be a boolean, not {_kind(meta[key])}")
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template", "general.name"):
        if key in meta:
            meta_str(meta, key)
    if "general.file_type" in meta:
        meta_int(meta, "general.file_type", 0, 1 << 16)
    return n_tokens


def config_from_metadata(meta: Mapping[str, Any], tensors: Mapping[str, TensorInfo]) -> ModelConfig:
    """Build the typed description; raise ModelFileError naming what is missing, unknown or out of range.

    Every key is checked for type and a sane range before anything is sized from it."""
    arch = meta_str(meta, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(
            f"unknown architecture '{arch}' (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    n_tokens = check_tokenizer_metadata(meta)
    n_layer = meta_int(meta, f"{arch}.block_count", 1, MAX_LAYERS)
    interval, kinds = _layer_kinds(meta, arch, n_layer, tensors)
    attn_layers = [i for i, a in enumerate(kinds) if a] or list(range(n_layer))
    n_head = _per_layer(meta, f"{arch}.attention.head_count", n_layer, attn_layers, 1, MAX_HEADS)
    n_head_kv = _per_layer(meta, f"{arch}.attention.head_count_kv", n_layer, attn_layers, 1, n_head, n_head)
    if n_head % n_head_kv:
        raise ModelFileError(f"metadata: {n_head} attention heads do not divide into {n_head_kv} KV heads")
    n_embd = meta_int(meta, f"{arch}.embedding_length", 1, MAX_EMBD)
    head_dim = meta_int(meta, f"{arch}.attention.key_length", 1, MAX_HEAD_DIM, max(n_embd // n_head, 1))
    head_dim_v = meta_int(meta, f"{arch}.attention.value_length", 1, MAX_HEAD_DIM, head_dim)
    rope_dim = meta_int(meta, f"{arch}.rope.dimension_count", 0, head_dim, head_dim)
    if rope_dim % 2:
        raise ModelFileError(f"metadata key '{arch}.rope.dimension_count' is {rope_dim}; RoPE needs an even count")
    emb = tensors.get("token_embd.weight")
    n_vocab = emb.shape[0] if emb is not None and len(emb.shape) == 2 else n_tokens
    if n_vocab == 0:
        raise ModelFileError("cannot tell the vocabulary size: no token_embd.weight and no tokenizer tokens")
    ssm_k_heads = meta_int(meta, f"{arch}.ssm.group_count", 1, MAX_HEADS)
    ssm_v_heads = meta_int(meta, f"{arch}.ssm.time_step_rank", 1, MAX_HEADS)
    ssm_inner = meta_int(meta, f"{arch}.ssm.inner_size", 1, MAX_FF)
    if ssm_inner % ssm_v_heads or ssm_v_heads % ssm_k_heads:
        raise ModelFileError(f"bad GDN shape: inner size {ssm_inner} over {ssm_v_heads} value heads "
                             f"and {ssm_k_heads} key heads")
    n_expert = meta_int(meta, f"{arch}.expert_count", 1, MAX_EXPERTS)
    return ModelConfig(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        rms_eps=meta_float(meta, f"{arch}.attention.layer_norm_rms_epsilon", 0.0, 1.0, 1e-6, open_low=True),
        rope_dim=rope_dim,
        rope_base=meta_float(meta, f"{arch}.rope.freq_base", 0.0, 1e12, 10000.0, open_low=True),
        full_attention_interval=interval,
        layer_is_attention=kinds,
        ssm_k_heads=ssm_k_heads,
        ssm_v_heads=ssm_v_heads,
        ssm_state=meta_int(meta, f"{arch}.ssm.state_size", 1, MAX_HEAD_DIM),
        ssm_inner=ssm_inner,
        ssm_conv_kernel=meta_int(meta, f"{arch}.ssm.conv_kernel", 1, MAX_CONV_KERNEL),
        n_expert=n_expert,
        n_expert_used=meta_int(meta, f"{arch}.expert_used_count", 1, n_expert),
        expert_ff=meta_int(meta, f"{arch}.expert_feed_forward_length", 1, MAX_FF),
        shared_ff=meta_int(meta, f"{arch}.expert_shared_feed_forward_length", 0, MAX_FF, 0),
        n_vocab=n_vocab,
        n_tokens=n_tokens,
        context_length=meta_int(meta, f"{arch}.context_length", 1, MAX_CONTEXT),
        diffusion=diffusion_from_metadata(meta, arch, n_vocab),
        name=meta_str(meta, "general.name", ""),
    )


DIFFUSION_DEFAULT_BLOCK = 32
DIFFUSION_DEFAULT_THRESHOLD = 0.9


def default_shift_logits(arch: str) -> bool:
    """Decision (vendor silent): row r predicts position r+1 unless the file says otherwise."""
    return arch in ("clover-moe", "qwen35moe", "qwen3next")


def diffusion_from_metadata(meta: Mapping[str, Any], arch: str, n_vocab: int | None = None) -> DiffusionConfig:
    """Read the diffusion keys (type- and range-checked), falling back to our documented defaults."""
    keys = {
        "block_length": (f"{arch}.diffusion.block_length", "diffusion.block_length"),
        "threshold": (f"{arch}.diffusion.threshold", "diffusion.threshold"),
        "shift_logits": (f"{arch}.diffusion.shift_logits", "diffusion.shift_logits"),
    }
    found: dict[str, str] = {}
    present: list[str] = []
    for field_name, candidates in keys.items():
        for key in candidates:
            if key in meta:
                found[field_name] = key
                present.append(key)
                break
    block = meta_int(meta, found["block_length"], 1, MAX_BLOCK_LENGTH) if "block_length" in found \
        else DIFFUSION_DEFAULT_BLOCK
    threshold = meta_float(meta, found["threshold"], 0.0, 1.0, open_low=True) if "threshold" in found \
        else DIFFUSION_DEFAULT_THRESHOLD
    shift = default_shift_logits(arch)
    if "shift_logits" in found:
        value = meta[found["shift_logits"]]
        if not isinstance(value, (bool, np.bool_)):
            raise ModelFileError(f"metadata key '{found['shift_logits']}' must be a boolean, not {_kind(value)}")
        shift = bool(value)
    mask = None
    if "tokenizer.ggml.mask_token_id" in meta:
        top = n_vocab - 1 if n_vocab else (1 << 31) - 1
        mask = meta_int(meta, "tokenizer.ggml.mask_token_id", 0, top)
        present.append("tokenizer.ggml.mask_token_id")
    return DiffusionConfig(
        block_length=block,
        threshold=threshold,
        shift_logits=shift,
        mask_token_id=mask,
        keys_present=tuple(present),
    )


@dataclass(frozen=True)
class TensorSpec:
    """A tensor the architecture uses: its name, numpy shape, and whether it must be present."""

    name: str
    shape: tuple[int, ...]
    required: bool = True


def _alternatives(cfg: ModelConfig, i: int) -> list[list[TensorSpec]]:
    """Groups of which exactly one variant must be present (fused vs split tensors)."""
    h, p = cfg.n_embd, f"blk.{i}."
    e, f = cfg.n_expert, cfg.expert_ff
    groups = [[
        [TensorSpec(p + "ffn_gate_exps.weight", (e, f, h)), TensorSpec(p + "ffn_up_exps.weight", (e, f, h))],
        [TensorSpec(p + "ffn_gate_up_exps.weight", (e, 2 * f, h))],
    ]]
    if cfg.layer_is_attention[i]:
        q = cfg.n_head * cfg.head_dim * 2
        k = cfg.n_head_kv * cfg.head_dim
        v = cfg.n_head_kv * cfg.head_dim_v
        groups.append([
            [TensorSpec(p + "attn_q.weight", (q, h)), TensorSpec(p + "attn_k.weight", (k, h)),
             TensorSpec(p + "attn_v.weight", (v, h))],
            [TensorSpec(p + "attn_qkv.weight", (q + k + v, h))],
        ])
    return groups  # type: ignore[return-value]


def layer_specs(cfg: ModelConfig, i: int) -> list[TensorSpec]:
    """The always-required tensors of layer i (variants are checked by `check_tensors`)."""
    h, p = cfg.n_embd, f"blk.{i}."
    e, f = cfg.n_expert, cfg.expert_ff
    specs = [
        TensorSpec(p + "attn_norm.weight", (h,)),
        TensorSpec(p + "post_attention_norm.weight", (h,)),
        TensorSpec(p + "ffn_gate_inp.weight", (e, h)),
        TensorSpec(p + "ffn_down_exps.weight", (e, h, f)),
    ]
    if cfg.shared_ff:
        s = cfg.shared_ff
        specs += [
            TensorSpec(p + "ffn_gate_inp_shexp.weight", (h,)),
            TensorSpec(p + "ffn_gate_shexp.weight", (s, h)),
            TensorSpec(p + "ffn_up_shexp.weight", (s, h)),
            TensorSpec(p + "ffn_down_shexp.weight", (h, s)),
        ]
    if cfg.layer_is_attention[i]:
        specs += [
            TensorSpec(p + "attn_q_norm.weight", (cfg.head_dim,)),
            TensorSpec(p + "attn_k_norm.weight", (cfg.head_dim,)),
            TensorSpec(p + "attn_output.weight", (h, cfg.n_head * cfg.head_dim_v)),
        ]
    else:
        nv = cfg.ssm_v_heads
        specs += [
            TensorSpec(p + "attn_qkv.weight", (cfg.ssm_conv_dim, h)),
            TensorSpec(p + "attn_gate.weight", (cfg.ssm_inner, h)),
            TensorSpec(p + "ssm_beta.weight", (nv, h)),
            TensorSpec(p + "ssm_alpha.weight", (nv, h)),
            TensorSpec(p + "ssm_dt.bias", (nv,)),
            TensorSpec(p + "ssm_a", (nv,)),
            TensorSpec(p + "ssm_conv1d.weight", (cfg.ssm_conv_dim, cfg.ssm_conv_kernel)),
            TensorSpec(p + "ssm_norm.weight", (cfg.ssm_v_dim,)),
            TensorSpec(p + "ssm_out.weight", (h, cfg.ssm_inner)),
        ]
    return specs


def clover_only_specs(cfg: ModelConfig, i: int) -> list[TensorSpec]:
    """Clover-only GDN preview tensors of layer i (our GGUF names; shapes of the bd_* are unknown)."""
    p = f"blk.{i}."
    return [
        TensorSpec(p + "ssm_conv1d_right.weight", (cfg.ssm_conv_dim, CLOVER_RIGHT_TAPS)),
        TensorSpec(p + "ssm_bd_scale", ()),
        TensorSpec(p + "ssm_bd_hist_bias", ()),
        TensorSpec(p + "ssm_bd_hist_c", ()),
    ]


def global_specs(cfg: ModelConfig) -> list[TensorSpec]:
    h, v = cfg.n_embd, cfg.n_vocab
    return [
        TensorSpec("token_embd.weight", (v, h)),
        TensorSpec("output_norm.weight", (h,)),
        TensorSpec("output.weight", (v, h), required=False),
    ]


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1) or (1,)


def _check_shape(spec: TensorSpec, info: TensorInfo) -> None:
    if spec.shape and _squeeze(info.shape) != _squeeze(spec.shape):
        raise ModelFileError(
            f"tensor '{spec.name}' has shape {list(info.shape)}, expected {list(spec.shape)}"
        )


def check_tensors(cfg: ModelConfig, tensors: Mapping[str, TensorInfo]) -> None:
    """Raise ModelFileError naming the first missing or mis-shaped tensor."""
    specs = list(global_specs(cfg))
    for i in range(cfg.n_layer):
        specs += layer_specs(cfg, i)
    for spec in specs:
        info = tensors.get(spec.name)
        if info is None:
            if spec.required:
                raise ModelFileError(f"missing tensor '{spec.name}'")
            continue
        _check_shape(spec, info)
    for i in range(cfg.n_layer):
        for group in _alternatives(cfg, i):
            chosen = next((v for v in group if all(s.name in tensors for s in v)), None)
            if chosen is None:
                closest = max(group, key=lambda v: sum(s.name in tensors for s in v))
                missing = next(s.name for s in closest if s.name not in tensors)
                raise ModelFileError(f"missing tensor '{missing}'")
            for spec in chosen:
                _check_shape(spec, tensors[spec.name])
        if not cfg.layer_is_attention[i]:
            right = clover_only_specs(cfg, i)[0]
            if right.name in tensors:
                _check_shape(right, tensors[right.name])


def has_clover_tensors(cfg: ModelConfig, tensors: Mapping[str, TensorInfo]) -> bool:
    """True when every GDN layer carries all Clover-only preview tensors."""
    gdn = cfg.gdn_layers
    return bool(gdn) and all(s.name in tensors for i in gdn for s in clover_only_specs(cfg, i))


def supports_exact_diffusion(cfg: ModelConfig, tensors: Mapping[str, TensorInfo]) -> bool:
    """Exact block diffusion needs the Clover-only tensors, a mask token and the diffusion keys."""
    return has_clover_tensors(cfg, tensors) and cfg.diffusion.mask_token_id is not None and any(
        k.endswith("diffusion.block_length") for k in cfg.diffusion.keys_present
    )


def check_quant_types(tensors: Mapping[str, TensorInfo]) -> None:
    """Raise ModelFileError naming the first tensor stored in a type clover cannot compute with."""
    from .quants import SUPPORTED_TYPES, type_name

    for info in tensors.values():
        if info.ggml_type not in SUPPORTED_TYPES:
            supported = ", ".join(type_name(t) for t in sorted(SUPPORTED_TYPES))
            raise ModelFileError(
                f"tensor '{info.name}' has unsupported quant type {type_name(info.ggml_type)} "
                f"(clover supports {supported})"
            )


def describe_tensors(meta: Mapping[str, Any], tensors: Mapping[str, TensorInfo]) -> ModelConfig:
    """Typed description from a header alone (local or remote), after checking every tensor."""
    cfg = config_from_metadata(meta, tensors)
    check_tensors(cfg, tensors)
    check_quant_types(tensors)
    return cfg


def describe(model: GGUFModelFile) -> ModelConfig:
    """Typed description of an opened file, after checking every tensor it needs."""
    return describe_tensors(model.metadata, model.tensors)
