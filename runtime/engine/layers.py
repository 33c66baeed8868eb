"""Each layer's weights bound once at load, as typed records: the forward looks nothing up by name.

A record holds what its layer's maths needs: product handles for the matrices (`Weights.matrix`:
the compiled kernels' prepared views, the numpy path's cached dequantization, or a device's) and
float32 vectors for the norms, gates and conv taps. `bind_layers` fills them from a `Binder`; the
host engine binds from its `Weights`, the torch backend binds the same records with device
tensors (`torch_backend.layers`), so both read one description of where each tensor goes. Tensor
names are formatted here and nowhere else in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..model_config import ModelConfig

CLOVER_TENSORS = ("ssm_conv1d_right.weight", "ssm_bd_scale", "ssm_bd_hist_bias", "ssm_bd_hist_c")


# Tensors that multiply the same input, which a binder may hold as one matrix of their rows
# together (`Weights.fuse`): one product instead of several. A group of mixed types is not fused;
# the last group then takes a GDN layer's z, beta and alpha beside its Q5_K qkv (the Q4_K_M mix).
GDN_INPUTS = ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight")
FUSABLE = (
    ("ffn_gate_exps.weight", "ffn_up_exps.weight"),
    ("ffn_gate_shexp.weight", "ffn_up_shexp.weight"),
    GDN_INPUTS,
    GDN_INPUTS[1:],
)


def fusable_groups(cfg: ModelConfig) -> list[tuple[str, ...]]:
    """Every layer's FUSABLE groups by tensor name (a binder fuses those the file has alike)."""
    return [tuple(f"blk.{i}.{s}" for s in group) for i in range(cfg.n_layer) for group in FUSABLE]


class Binder(Protocol):
    """Where a record's tensors come from: product handles and small float32 tensors."""

    def has(self, name: str) -> bool: ...

    def matrix(self, name: str) -> Any: ...

    def fused(self, names: tuple[str, ...]) -> Any: ...

    def vector(self, name: str) -> Any: ...

    def table(self, name: str) -> Any: ...

    def per_head(self, name: str, n_heads: int) -> Any: ...


@dataclass(frozen=True)
class MoE:
    """Routed experts (softmax top-k over `router`) plus the sigmoid-gated shared expert."""

    index: int  # the layer's
    norm: Any  # post_attention_norm (hidden,)
    router: Any  # (n_expert, hidden)
    gate_up: Any  # (n_expert, 2 * expert_ff, hidden): the file's, or fused at load; None when apart
    gate: Any
    up: Any
    down: Any  # (n_expert, hidden, expert_ff)
    shared_gate_up: Any  # (2 * shared_ff, hidden) fused at load, or None
    shared_gate: Any  # None when the layer has no shared expert (or when fused)
    shared_up: Any
    shared_down: Any
    shared_gate_inp: Any  # (hidden,) sigmoid gate of the shared expert, or None


@dataclass(frozen=True)
class AttentionLayer:
    """Gated full attention: q (with its output gate), k, v, their norms, the output projection."""

    index: int
    norm: Any  # attn_norm (hidden,)
    qkv: Any  # fused projection, or None when q, k, v are apart
    q: Any
    k: Any
    v: Any
    q_norm: Any  # (head_dim,)
    k_norm: Any
    output: Any
    moe: MoE


@dataclass(frozen=True)
class CloverPreview:
    """The Clover-only tensors of a GDN layer's preview operator (`gdn.clover_mix`)."""

    conv_right: Any  # (conv_dim, 3): column j-1 multiplies row t+j
    scale: Any  # (v_heads,)
    hist_bias: Any
    hist_c: Any


@dataclass(frozen=True)
class DeltaNetLayer:
    """Gated DeltaNet: q|k|v, z, beta and alpha projections, the conv taps, the gated norm, out."""

    index: int
    norm: Any  # attn_norm (hidden,)
    inputs: tuple  # product handles whose rows, in order, are qkv | z | beta | alpha (some fused at load)
    qkv: Any  # (conv_dim, hidden); None where fused into `inputs` (and z, beta, alpha)
    z: Any  # attn_gate (v_heads * v_dim, hidden)
    beta: Any
    alpha: Any
    dt_bias: Any  # (v_heads,)
    a: Any  # ssm_a (v_heads,), negative
    conv: Any  # (conv_dim, kernel)
    ssm_norm: Any  # (v_dim,)
    out: Any
    clover: CloverPreview | None  # None when the file lacks the Clover-only tensors
    moe: MoE


Layer = AttentionLayer | DeltaNetLayer


@dataclass(frozen=True)
class Head:
    """The final norm and the LM head (the embedding itself when the output is tied)."""

    norm: Any
    matrix: Any
    tied: bool


def _opt(b: Binder, name: str) -> Any:
    return b.matrix(name) if b.has(name) else None


def _fused(b: Binder, i: int, group: int) -> Any:
    return b.fused(tuple(f"blk.{i}.{s}" for s in FUSABLE[group]))


def bind_moe(b: Binder, cfg: ModelConfig, i: int) -> MoE:
    p = f"blk.{i}."
    gate_up = b.matrix(p + "ffn_gate_up_exps.weight") if b.has(p + "ffn_gate_up_exps.weight") else _fused(b, i, 0)
    shared = bool(cfg.shared_ff) and b.has(p + "ffn_down_shexp.weight")
    shared_gate_up = _fused(b, i, 1) if shared else None
    apart = shared and shared_gate_up is None
    return MoE(
        index=i, norm=b.vector(p + "post_attention_norm.weight"),
        router=b.matrix(p + "ffn_gate_inp.weight"),
        gate_up=gate_up,
        gate=None if gate_up is not None else b.matrix(p + "ffn_gate_exps.weight"),
        up=None if gate_up is not None else b.matrix(p + "ffn_up_exps.weight"),
        down=b.matrix(p + "ffn_down_exps.weight"),
        shared_gate_up=shared_gate_up,
        shared_gate=b.matrix(p + "ffn_gate_shexp.weight") if apart else None,
        shared_up=b.matrix(p + "ffn_up_shexp.weight") if apart else None,
        shared_down=b.matrix(p + "ffn_down_shexp.weight") if shared else None,
        shared_gate_inp=b.vector(p + "ffn_gate_inp_shexp.weight") if shared and b.has(
            p + "ffn_gate_inp_shexp.weight") else None,
    )


def bind_attention(b: Binder, cfg: ModelConfig, i: int) -> AttentionLayer:
    p = f"blk.{i}."
    fused = b.has(p + "attn_qkv.weight")
    return AttentionLayer(
        index=i, norm=b.vector(p + "attn_norm.weight"),
        qkv=b.matrix(p + "attn_qkv.weight") if fused else None,
        q=None if fused else b.matrix(p + "attn_q.weight"),
        k=None if fused else b.matrix(p + "attn_k.weight"),
        v=None if fused else b.matrix(p + "attn_v.weight"),
        q_norm=b.vector(p + "attn_q_norm.weight"), k_norm=b.vector(p + "attn_k_norm.weight"),
        output=b.matrix(p + "attn_output.weight"), moe=bind_moe(b, cfg, i))


def has_clover_tensors(b: Binder, i: int) -> bool:
    return all(b.has(f"blk.{i}.{t}") for t in CLOVER_TENSORS)


def bind_deltanet(b: Binder, cfg: ModelConfig, i: int) -> DeltaNetLayer:
    p = f"blk.{i}."
    nv = cfg.ssm_v_heads
    clover = CloverPreview(
        conv_right=b.table(p + "ssm_conv1d_right.weight"), scale=b.per_head(p + "ssm_bd_scale", nv),
        hist_bias=b.per_head(p + "ssm_bd_hist_bias", nv), hist_c=b.per_head(p + "ssm_bd_hist_c", nv),
    ) if has_clover_tensors(b, i) else None
    alone: dict[str, Any] = dict.fromkeys(GDN_INPUTS)
    inputs: tuple = (_fused(b, i, 2),)
    if inputs[0] is None:
        alone[GDN_INPUTS[0]] = b.matrix(p + GDN_INPUTS[0])
        rest = _fused(b, i, 3)
        if rest is None:
            alone.update({s: b.matrix(p + s) for s in GDN_INPUTS[1:]})
            inputs = tuple(alone.values())
        else:
            inputs = (alone[GDN_INPUTS[0]], rest)
    return DeltaNetLayer(
        index=i, norm=b.vector(p + "attn_norm.weight"), inputs=inputs,
        qkv=alone["attn_qkv.weight"], z=alone["attn_gate.weight"],
        beta=alone["ssm_beta.weight"], alpha=alone["ssm_alpha.weight"],
        dt_bias=b.vector(p + "ssm_dt.bias"), a=b.vector(p + "ssm_a"), conv=b.table(p + "ssm_conv1d.weight"),
        ssm_norm=b.vector(p + "ssm_norm.weight"), out=b.matrix(p + "ssm_out.weight"),
        clover=clover, moe=bind_moe(b, cfg, i))


def bind_layer(b: Binder, cfg: ModelConfig, i: int) -> Layer:
    return bind_attention(b, cfg, i) if cfg.layer_is_attention[i] else bind_deltanet(b, cfg, i)


def bind_layers(b: Binder, cfg: ModelConfig, layers: Any = None) -> dict[int, Layer]:
    """Records for `layers` (default: all of the model's), keyed by layer index."""
    indices = range(cfg.n_layer) if layers is None else sorted(layers)
    return {i: bind_layer(b, cfg, i) for i in indices}


def bind_head(b: Binder) -> Head:
    tied = not b.has("output.weight")
    return Head(b.vector("output_norm.weight"), b.matrix("token_embd.weight" if tied else "output.weight"), tied)
