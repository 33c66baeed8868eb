"""What a Clover GGUF holds, as plain data: parameter counts, layer kinds, quant mix, diffusion support.

Works from metadata and the tensor list alone (a local file, a split set, or a header fetched
from the Hub), never touching tensor data. `clover inspect` renders it; other commands reuse it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .gguf_header import GGUFHeader, TensorInfo
from .model_config import (
    ModelConfig,
    clover_only_specs,
    describe_tensors,
    has_clover_tensors,
    supports_exact_diffusion,
)

ROUTED_EXPERT_RE = re.compile(r"^blk\.\d+\.ffn_(gate|up|down|gate_up)_exps\.weight$")


@dataclass(frozen=True)
class QuantShare:
    """One ggml type's share of the file."""

    type: str
    n_tensors: int
    n_bytes: int
    n_elements: int

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.n_bytes / self.n_elements if self.n_elements else 0.0


@dataclass(frozen=True)
class ModelSummary:
    """The facts `clover inspect` prints; `config` is the typed description they came from."""

    filename: str
    shards: list[str]
    gguf_version: int
    architecture: str
    name: str
    n_params: int
    n_params_active: int
    n_params_embedding: int
    n_params_routed_experts: int
    tied_output: bool
    n_layer: int
    layers_by_kind: dict[str, int]
    full_attention_interval: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int
    rope_base: float
    ssm_k_heads: int
    ssm_v_heads: int
    ssm_state: int
    ssm_conv_kernel: int
    n_expert: int
    n_expert_used: int
    expert_ff: int
    shared_ff: int
    context_length: int
    n_vocab: int
    n_tokens: int
    file_type: str | None
    file_size: int | None
    tensor_bytes: int
    bits_per_weight: float
    quant_mix: list[QuantShare]
    clover_tensors: bool
    clover_tensor_count: int
    diffusion_supported: bool
    diffusion: dict[str, Any]
    chat_template: bool
    config: ModelConfig = field(repr=False, compare=False)


def _file_type_name(value: Any) -> str | None:
    if value is None:
        return None
    from gguf.constants import LlamaFileType

    try:
        name = LlamaFileType(int(value)).name
    except ValueError:
        return f"type {int(value)}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def count_parameters(cfg: ModelConfig, tensors: Mapping[str, TensorInfo]) -> tuple[int, int, int, int]:
    """(total, active per token, embedding, routed experts) parameter counts.

    Active = weights read for one decoded token: everything except the embedding table (a row
    lookup) and the routed experts not chosen; the LM head counts, a tied one once.
    """
    total = sum(t.n_elements for t in tensors.values())
    emb = tensors.get("token_embd.weight")
    embedding = emb.n_elements if emb is not None else 0
    routed = sum(t.n_elements for t in tensors.values() if ROUTED_EXPERT_RE.match(t.name))
    unused = routed - routed * cfg.n_expert_used // cfg.n_expert if cfg.n_expert else 0
    tied = "output.weight" not in tensors
    active = total - unused - (0 if tied else embedding)
    return total, active, embedding, routed


def _quant_mix(tensors: Mapping[str, TensorInfo]) -> list[QuantShare]:
    acc: dict[str, list[int]] = {}
    for t in tensors.values():
        row = acc.setdefault(t.type_name, [0, 0, 0])
        row[0] += 1
        row[1] += t.n_bytes
        row[2] += t.n_elements
    shares = [QuantShare(k, *v) for k, v in acc.items()]
    return sorted(shares, key=lambda s: (-s.n_bytes, s.type))


def _source_parts(model: Any) -> tuple[dict[str, Any], dict[str, TensorInfo], list[str], int, int | None]:
    """(metadata, tensors, shard names, GGUF version, file size) of a GGUFModelFile or GGUFHeader."""
    if isinstance(model, GGUFHeader):
        return model.metadata, {t.name: t for t in model.tensors}, [], model.version, None
    paths = [Path(str(p)).name for p in getattr(model, "paths", [])]
    try:
        size = int(model.file_size)
    except (AttributeError, OSError, TypeError):
        size = None
    tensors = model.tensors if isinstance(model.tensors, Mapping) else {t.name: t for t in model.tensors}
    return model.metadata, tensors, paths, int(model.version), size


def summarize(model: Any, *, filename: str | None = None) -> ModelSummary:
    """Check and summarize an opened model (GGUFModelFile, a Hub header view, or a GGUFHeader).

    Raises ModelFileError for files the runtime cannot use, the same errors `describe` raises.
    """
    meta, tensors, shards, version, size = _source_parts(model)
    cfg = describe_tensors(meta, tensors)
    total, active, embedding, routed = count_parameters(cfg, tensors)
    tensor_bytes = sum(t.n_bytes for t in tensors.values())
    clover_names = {s.name for i in cfg.gdn_layers for s in clover_only_specs(cfg, i)}
    d = cfg.diffusion
    return ModelSummary(
        filename=filename or (shards[0] if shards else "model.gguf"),
        shards=shards,
        gguf_version=version,
        architecture=cfg.arch,
        name=cfg.name,
        n_params=total,
        n_params_active=active,
        n_params_embedding=embedding,
        n_params_routed_experts=routed,
        tied_output="output.weight" not in tensors,
        n_layer=cfg.n_layer,
        layers_by_kind={"gated_deltanet": cfg.n_gdn_layers, "full_attention": cfg.n_attention_layers},
        full_attention_interval=cfg.full_attention_interval,
        n_embd=cfg.n_embd,
        n_head=cfg.n_head,
        n_head_kv=cfg.n_head_kv,
        head_dim=cfg.head_dim,
        rope_dim=cfg.rope_dim,
        rope_base=cfg.rope_base,
        ssm_k_heads=cfg.ssm_k_heads,
        ssm_v_heads=cfg.ssm_v_heads,
        ssm_state=cfg.ssm_state,
        ssm_conv_kernel=cfg.ssm_conv_kernel,
        n_expert=cfg.n_expert,
        n_expert_used=cfg.n_expert_used,
        expert_ff=cfg.expert_ff,
        shared_ff=cfg.shared_ff,
        context_length=cfg.context_length,
        n_vocab=cfg.n_vocab,
        n_tokens=cfg.n_tokens,
        file_type=_file_type_name(meta.get("general.file_type")),
        file_size=size,
        tensor_bytes=tensor_bytes,
        bits_per_weight=8 * tensor_bytes / total if total else 0.0,
        quant_mix=_quant_mix(tensors),
        clover_tensors=has_clover_tensors(cfg, tensors),
        clover_tensor_count=sum(1 for n in clover_names if n in tensors),
        diffusion_supported=supports_exact_diffusion(cfg, tensors),
        diffusion={"block_length": d.block_length, "threshold": d.threshold, "shift_logits": d.shift_logits,
                   "mask_token_id": d.mask_token_id, "keys_present": list(d.keys_present)},
        chat_template=bool(meta.get("tokenizer.chat_template")),
        config=cfg,
    )


def to_json(summary: ModelSummary) -> dict[str, Any]:
    """The summary as a JSON-ready dict (`json.dumps` it); the typed config is left out."""
    out: dict[str, Any] = {}
    for name in summary.__dataclass_fields__:
        if name == "config":
            continue
        value = getattr(summary, name)
        if name == "quant_mix":
            value = [{"type": q.type, "n_tensors": q.n_tensors, "n_bytes": q.n_bytes,
                      "n_elements": q.n_elements, "bits_per_weight": round(q.bits_per_weight, 4)}
                     for q in value]
        out[name] = value
    out["bits_per_weight"] = round(summary.bits_per_weight, 4)
    return out
