"""Every block-diffusion decision the vendor has not published, each in one small function.

These are clover's choices (README, "Choices we made"); replace one here when the vendor's code
is published and the rest of the decoder follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def choose_decode_mode(requested: str, exact_diffusion_possible: bool) -> tuple[str, bool, str]:
    """(mode, exact, why) for `--decode auto|diffusion|ar`.

    auto: diffusion when the file carries what exact diffusion needs (the Clover-only tensors
    and the diffusion keys), otherwise exact autoregressive decoding; `diffusion` forces it
    (approximate without those tensors); `ar` is always exact.
    """
    if requested not in ("auto", "diffusion", "ar"):
        raise ValueError(f"decode must be auto, diffusion or ar, not {requested!r}")
    if requested == "ar":
        return "ar", True, "autoregressive decoding was requested"
    if exact_diffusion_possible:
        return "diffusion", True, "the file carries the Clover-only tensors and diffusion keys"
    if requested == "diffusion":
        return "diffusion", False, ("approximate: the file lacks the Clover-only preview tensors, so Gated "
                                    "DeltaNet layers preview causally")
    return "ar", True, "the file lacks the Clover-only tensors exact block diffusion needs"


def low_confidence_reveal(probs: np.ndarray, threshold: float) -> np.ndarray:
    """LowConfidence reveal: indices (into `probs`, one entry per still-masked position) whose
    candidate probability reaches `threshold`, and always at least the most confident one."""
    chosen = np.flatnonzero(probs >= threshold)
    if chosen.size == 0:
        chosen = np.array([int(np.argmax(probs))])
    return chosen


def fixed_count_reveal(probs: np.ndarray, k: int) -> np.ndarray:
    """A fixed schedule: the `k` most confident still-masked positions each pass (all when fewer
    remain). For measuring speed at a known number of tokens per pass (`clover bench --reveal-k`),
    whatever the model's confidence; not a decoding choice of ours."""
    if k >= probs.size:
        return np.arange(probs.size)
    return np.sort(np.argsort(-probs, kind="stable")[:k])


def logit_rows_for(masked: Sequence[int], shift_logits: bool) -> tuple[list[int], bool]:
    """Which preview rows predict the masked block positions, and whether position 0 is predicted
    by the last committed row instead (shifted alignment: row r predicts position r + 1)."""
    if not shift_logits:
        return list(masked), False
    rows = [p - 1 for p in masked if p > 0]
    return rows, 0 in masked


def verify_commits(requested: bool | None, temperature: float, fixed_reveal: bool = False) -> bool:
    """Whether the commit pass checks each resolved block against greedy AR decoding.

    The commit is a causal forward over the block, so it predicts every position from the exact
    prefix for free; where its greedy pick differs from the revealed token, the block is cut there
    and that pick replaces it (speculative decoding with the preview as the draft). Greedy output
    is then exactly what `--decode ar` writes. On by default for greedy decoding (the vendor's
    decoder keeps the block as revealed: `--no-verify`); sampling keeps the block as revealed,
    since a greedy check would change the distribution. A fixed reveal count (`bench --reveal-k`)
    measures speed at a known number of tokens per pass and is checked only when asked."""
    if requested is None:
        return temperature <= 0 and not fixed_reveal
    return bool(requested) and temperature <= 0


def ar_fallback(debt: int, streak: int, forwards: int, added: int, block_length: int) -> tuple[int, int, int]:
    """(debt, streak, AR tokens now due) after a checked block that cost `forwards` (its passes and
    its commit) and added `added` tokens.

    The debt is what block diffusion has cost beyond AR (one forward per token), never below zero.
    When it reaches a block's length, the decoder writes block_length * 2**streak tokens (at most 8
    blocks) by plain AR and then tries block diffusion again; a block that pays for itself resets
    the streak. Text the preview cannot guess (random text, random weights) then costs about what
    AR costs, instead of a block's passes per kept token, while a confident model's occasional
    costly block is paid back by the next ones. Greedy output is AR's either way."""
    debt = max(0, debt + forwards - added)
    if added >= forwards:
        streak = 0
    if debt < block_length:
        return debt, streak, 0
    return 0, streak + 1, block_length * min(2**streak, 8)


def first_stop(tokens: Iterable[int], stop_ids: Any) -> int | None:
    """Index of the first stop token in a resolved block, or None: generation ends there."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return i
    return None


def default_max_passes(block_length: int) -> int:
    """At most one pass per position: every block resolves within block_length passes."""
    return max(1, block_length)


def exclude_mask_candidates(logits: np.ndarray, mask_id: int) -> None:
    """A masked position may never resolve to the mask token itself (it would stay unresolved
    while counting as revealed); the vendor does not say, LLaDA-style decoders do the same.
    In place: the caller passes logits it owns (one row per pass of a 248K vocabulary is big)."""
    logits[:, mask_id] = -np.inf
