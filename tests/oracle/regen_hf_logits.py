"""Regenerate tests/oracle/hf_logits.npz: transformers' answers for the tiny oracle model.

tests/test_engine_hf.py compares clover's engine with transformers' Qwen3_5MoeForCausalLM, an
implementation that shares none of our code. Running transformers needs torch (a multi-GB wheel),
so its answers are committed here and the test suite needs neither. Regenerate them when the
oracle model (tests/hf_oracle.py `random_weights`, `TinyShape`) or the token ids change, or to
check them against a newer transformers:

    pip install torch --index-url https://download.pytorch.org/whl/cpu   # optional: the CPU build
    pip install -e ".[test,oracle]"        # torch and transformers 5.x (Qwen3_5MoeForCausalLM)
    python tests/oracle/regen_hf_logits.py

The file holds the full-sequence logits, the greedy continuation of a prompt (transformers'
`generate`, do_sample=False), the token ids, and the sha256 of the random weights they were
computed from: the test recomputes that digest, so a change in numpy's random stream or in
`random_weights` shows up as a stale fixture instead of as a wrong engine.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the oracle's converter and test helpers

from engine_models import token_ids  # noqa: E402
from hf_oracle import TinyShape, random_weights  # noqa: E402

FIXTURE = HERE / "hf_logits.npz"
SHAPE = TinyShape()  # hidden 64, 4 layers (attention at layer 3), GDN 2 key / 4 value heads, 8 experts top-2
WEIGHT_SEED = 0
N_TOKENS = 240  # spans several GDN chunks and the attention layer's whole causal mask
IDS_SEED = 11
PROMPT_TOKENS = 20
GREEDY_TOKENS = 32


def fixture_ids() -> list[int]:
    """The token ids the fixture's logits are for (its first PROMPT_TOKENS are the greedy prompt)."""
    return token_ids(N_TOKENS, SHAPE.n_tokens, seed=IDS_SEED)


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(weights):
        a = np.ascontiguousarray(weights[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class OracleAnswers:
    """What transformers computes for the oracle model."""

    logits: np.ndarray  # float32 (N_TOKENS, vocab)
    greedy: np.ndarray  # int64 (GREEDY_TOKENS,): the continuation of ids[:PROMPT_TOKENS]


def compute() -> OracleAnswers:
    """Run transformers (imports torch) on the oracle model."""
    import torch
    import transformers
    from hf_oracle import build_hf_model

    if not hasattr(transformers, "Qwen3_5MoeForCausalLM"):
        raise SystemExit(f"transformers {transformers.__version__} lacks Qwen3_5MoeForCausalLM (need 5.x)")
    torch.manual_seed(0)
    model = build_hf_model(SHAPE, random_weights(SHAPE, seed=WEIGHT_SEED))
    ids = fixture_ids()
    prompt = torch.tensor([ids[:PROMPT_TOKENS]])
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=GREEDY_TOKENS,
                             do_sample=False)
    return OracleAnswers(np.ascontiguousarray(logits, dtype=np.float32),
                         np.asarray(out[0, PROMPT_TOKENS:].tolist(), dtype=np.int64))


def main() -> None:
    import torch
    import transformers

    answers = compute()
    np.savez_compressed(
        FIXTURE, logits=answers.logits, greedy=answers.greedy, ids=np.asarray(fixture_ids(), dtype=np.int64),
        weights_sha256=np.asarray(weights_digest(random_weights(SHAPE, seed=WEIGHT_SEED))),
        made_with=np.asarray(f"transformers {transformers.__version__}, torch {torch.__version__}, "
                             f"numpy {np.__version__}"))
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
