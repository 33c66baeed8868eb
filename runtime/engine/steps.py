"""The steps of one Clover layer, written once: the host engine and the torch backend run them with
their own ops (numpy and the compiled kernels, or torch on a device).

A layer is pre-norm residual twice: x + mixer(RMSNorm(x)), where the mixer is gated attention or
Gated DeltaNet, then x + MoE(RMSNorm(x)). The causal form writes the layer's state (K/V cache,
conv ring and recurrent state); the preview form (a block-diffusion pass) reads it and writes
nothing. A change to the layer's order of steps is made here, for both backends.
"""

from __future__ import annotations

from typing import Any, Protocol

from .layers import AttentionLayer, Layer, MoE
from .state import SequenceState


class LayerOps(Protocol):
    """What a backend supplies: the norm, the two mixers in both forms and the MoE."""

    def norm(self, x: Any, weight: Any) -> Any: ...

    def attention(self, L: AttentionLayer, h: Any, state: SequenceState, write: bool) -> Any: ...

    def deltanet(self, L: Any, h: Any, state: SequenceState, preview: str | None) -> Any: ...

    def moe(self, m: MoE, h: Any, coreset: int | None) -> tuple[Any, Any]: ...


def causal_layer(ops: LayerOps, L: Layer, x: Any, state: SequenceState) -> Any:
    """The layer for rows continuing `state`, writing their K/V or advancing the GDN state."""
    h = ops.norm(x, L.norm)
    if isinstance(L, AttentionLayer):
        x = x + ops.attention(L, h, state, True)
    else:
        x = x + ops.deltanet(L, h, state, None)
    out, _ = ops.moe(L.moe, ops.norm(x, L.moe.norm), None)
    return x + out


def preview_layer(ops: LayerOps, L: Layer, x: Any, state: SequenceState, gdn_preview: str,
                  coreset: int | None) -> tuple[Any, Any]:
    """The layer over a diffusion block, `state` unchanged; also the distinct experts used.
    `gdn_preview` is "causal" or "clover" (`Model.preview`)."""
    h = ops.norm(x, L.norm)
    if isinstance(L, AttentionLayer):
        x = x + ops.attention(L, h, state, False)
    else:
        x = x + ops.deltanet(L, h, state, gdn_preview)
    out, experts = ops.moe(L.moe, ops.norm(x, L.moe.norm), coreset)
    return x + out, experts
