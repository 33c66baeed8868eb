"""Models whose answer is known, for decoding tests: every mixer and expert output projection is
zero, so each row's logits depend on its own token only, and the embedding / LM-head pair makes
token t predict t + 1 with high confidence. The mask token embeds to zero, so a masked row
predicts nothing in particular (uniform logits): a position can only be revealed once the row
that predicts it holds a real token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from clover_runtime.synth import SynthSpec
from clover_runtime.synth.writer import plan_model
from synth_models import model_path


def successor_overrides(spec: SynthSpec, *, mask_id: int, scale: float = 12.0, seed: int = 5) -> dict[str, np.ndarray]:
    plans = {p.name: p for p in plan_model(spec)}
    emb_shape = plans["token_embd.weight"].shape
    n_vocab, hidden = emb_shape
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n_vocab, hidden)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    emb[mask_id] = 0.0
    out = np.zeros_like(emb)
    out[1:] = emb[:-1] * scale  # logit of j = scale * <emb[j-1], x>: largest for j = t + 1
    overrides = {"token_embd.weight": emb, "output.weight": out,
                 "output_norm.weight": np.ones(hidden, dtype=np.float32)}
    for name, plan in plans.items():
        if name.endswith(("attn_output.weight", "ssm_out.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")):
            overrides[name] = np.zeros(plan.shape, dtype=np.float32)
    return overrides


def successor_model_path(**spec_overrides) -> tuple[Path, int]:
    """(path, mask id) of a tiny F32 model that continues any id sequence with id + 1."""
    from clover_runtime.text.vocab import small_vocab

    mask = small_vocab().special["mask"]
    spec = SynthSpec.tiny(quant="F32", **spec_overrides)
    return model_path(spec, tensors_override=successor_overrides(spec, mask_id=mask)), mask
