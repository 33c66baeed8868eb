"""What an expert coreset saves a preview pass on this machine: `--decode auto`'s cost model
measures it once per file, thread count and device (`calibration` keeps the answer)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def half_drafted(model: Any, block_length: int) -> np.ndarray:
    """A block whose first half holds drafted tokens (fixed pseudo-random ids, never the mask) and
    whose second half is masked. An all-mask block's rows route alike (8-10 of 256 experts a
    layer on the real shape), so a coreset could save nothing there; this one routes to ~95."""
    mask = int(model.config.diffusion.mask_token_id)
    n, half = int(block_length), int(block_length) // 2
    drafted = np.random.default_rng(0).integers(0, model.n_vocab, size=half)
    block = np.full(n, mask, dtype=np.int64)
    block[:half] = np.where(drafted == mask, 0, drafted)
    return block


def coreset_share(model: Any, block_length: int, size: int, reps: int = 2) -> float:
    """Seconds of a preview pass routed within `size` experts over those of a pass with every
    expert, both over one `half_drafted` block on a scratch sequence (min of `reps` alternated
    timings after one untimed pass each: six passes, once per file, thread count and device; on
    the full model on a CPU a few seconds of the first reply)."""
    if model.config.diffusion.mask_token_id is None:
        return 1.0
    block = half_drafted(model, block_length)
    rows = list(range(len(block) // 2, len(block)))
    state = model.new_state(len(block) + 4)
    model.forward([0, 1], state, last_only=True)
    best = {None: np.inf, size: np.inf}
    for rep in range(reps + 1):
        for core in best:
            t = time.perf_counter()
            model.preview(block, state, logit_rows=rows, expert_coreset=core)
            if rep:
                best[core] = min(best[core], time.perf_counter() - t)
    return float(best[size] / best[None]) if best[None] > 0 else 1.0
