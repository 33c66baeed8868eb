"""Regenerate tests/fixtures_training/engine_match.npz: a tiny seeded torch model and its logits.

    python training/engine_fixture.py

The test command has no torch, so the fixture holds everything the engine needs to rebuild the
model: the spec, every tensor under its GGUF name (float16 values, which the torch model
computes with; float32 for a derived tensor such as ssm_a = -exp(A_log)), and the torch logits
of a few causal sequences and of a few diffusion-block previews (mask tokens in the blocks, the
Clover block operator in the GDN layers).
tests/test_training_engine_match.py writes the GGUF with clover's writer and compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clover_runtime.synth import SynthSpec  # noqa: E402
from clover_runtime.synth.vocab_source import vocabulary  # noqa: E402
from model import CloverLM  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures_training" / "engine_match.npz"
SEED = 15
CAUSAL = ((2, 16), (1, 5))  # (count, length) of causal sequences
PREVIEWS = ((11, 16, (0, 1, 5, 6, 7, 15)), (4, 8, (2, 3)), (17, 12, tuple(range(12))))  # prefix, block, masked


def fixture_spec() -> SynthSpec:
    """Small enough for a few hundred KB; GQA, a 3:1 layer pattern, top-2 of 4 experts."""
    base = SynthSpec(hidden=32, n_layer=4, n_head=2, n_head_kv=1, head_dim=16, rope_dim=8, ssm_k_heads=1,
                     ssm_v_heads=2, ssm_state=16, n_expert=4, n_expert_used=2, expert_ff=16, shared_ff=16,
                     tied_output=True, name="clover-demo-fixture", seed=SEED)
    return base.with_(n_vocab=len(vocabulary(base).tokens))


def build() -> dict[str, np.ndarray]:
    """The fixture's arrays (deterministic from SEED)."""
    torch.manual_seed(SEED)
    spec = fixture_spec()
    model = CloverLM(spec)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # norms and the Clover-only scalars: away from their initial constants
                p.add_(torch.randn_like(p) * 0.2)
            p.copy_(p.half().float())
    mask = vocabulary(spec).special["mask"]
    gen = torch.Generator().manual_seed(SEED)
    n_real = vocabulary(spec).special["bos"]  # ordinary tokens lie below the specials
    out: dict[str, np.ndarray] = {"spec": np.array(json.dumps(spec.as_dict()))}
    with torch.no_grad():
        for name, value in model.gguf_tensors().items():
            half = value.astype(np.float16)  # exact except for derived values (ssm_a = -exp(A_log))
            out["w_" + name] = half if np.array_equal(half.astype(np.float32), value) else value
        for i, (count, length) in enumerate(CAUSAL):
            ids = torch.randint(0, n_real, (count, length), generator=gen)
            out[f"causal{i}_ids"] = ids.numpy()
            out[f"causal{i}_logits"] = model(ids)[0].numpy()
        for i, (n_prefix, n_block, masked) in enumerate(PREVIEWS):
            ids = torch.randint(0, n_real, (n_prefix + n_block,), generator=gen)
            block = ids[n_prefix:].clone()
            block[list(masked)] = mask
            _, logits = model(ids[None, :n_prefix], block[None, None], torch.tensor([[n_prefix]]))
            out[f"preview{i}_prefix"] = ids[:n_prefix].numpy()
            out[f"preview{i}_block"] = block.numpy()
            out[f"preview{i}_logits"] = logits[0, 0].numpy()
    return out


def main() -> int:
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(FIXTURE, **build())
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size / 1e3:.0f} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
