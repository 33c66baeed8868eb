"""Every block-diffusion decision the vendor has not published, each in one small function.

These are clover's choices (README, "Choices we made"); replace one here when the vendor's code
is published and the rest of the decoder follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .params import SamplingParams
from .sampling import candidates


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


DRAFT_THRESHOLD = 0.1


def reveal_threshold(requested: float | None, from_file: float, verify: bool) -> float:
    """The LowConfidence threshold: the request's, else under verified commits `DRAFT_THRESHOLD`,
    else the file's (the vendor's 0.9).

    Checked, the preview only drafts: a low-confidence token costs at most the rest of its block,
    which the next pass resolves again, while a high threshold spends a pass per few tokens. On
    the demo model's held-out sums (40, greedy) tokens per forward rise as the threshold falls,
    2.63 at 0.9, 3.36 at 0.5, 3.77 at 0.3, 4.19 at 0.2 and 4.30 at 0.1 and below (one pass per
    block, then the commit), with AR's text every time."""
    if requested is not None:
        return float(requested)
    return DRAFT_THRESHOLD if verify else float(from_file)


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
    """Whether the commit pass checks each resolved block against AR decoding.

    The commit is a causal forward over the block, so it predicts every position from the exact
    prefix for free; the block is kept up to the first position AR refuses (`accept_draft`), where
    AR's own token replaces it (speculative decoding with the preview as the draft). The output is
    then exactly what `--decode ar` writes: the same text when greedy, the same distribution when
    sampling. On by default (the vendor's decoder keeps the block as revealed: `--no-verify`). A
    fixed reveal count (`bench --reveal-k`) measures speed at a known number of tokens per pass and
    is checked only when asked."""
    if requested is None:
        return not fixed_reveal
    return bool(requested)


def draft_sampling(sp: SamplingParams, verify: bool) -> SamplingParams:
    """How the preview picks its candidates. Under verification the preview only drafts, and a
    draft chosen without randomness (greedy over the penalised logits) makes the acceptance rule
    exact whatever the preview's own distribution is (`accept_draft`); unchecked blocks sample as
    asked."""
    return replace(sp, temperature=0.0) if verify else sp


def accept_draft(logits: np.ndarray, draft: int, sp: SamplingParams, rng: np.random.Generator) -> int:
    """AR's token at a drafted position, given AR's penalised logits there: the draft when AR keeps it.

    Greedy: AR's first maximum, so the draft stays only where greedy AR would write it. Sampling:
    the speculative-sampling rule for a draft that is a fixed token (a point mass q): keep it with
    probability min(1, p/q) = p(draft), otherwise draw from p without the draft, renormalised (the
    normalised max(0, p - q)). Either way the token has exactly AR's distribution p."""
    if sp.temperature <= 0:
        return int(np.argmax(logits))
    ids, probs = candidates(logits, sp)
    hit = np.flatnonzero(ids == draft)
    p = float(probs[hit[0]]) if hit.size else 0.0
    if rng.random() < p:
        return draft
    rest = probs.copy()
    if hit.size:
        rest[hit[0]] = 0.0
    total = rest.sum()
    if total <= 0:
        return draft
    j = min(int(np.searchsorted(np.cumsum(rest / total), rng.random(), side="right")), ids.size - 1)
    return int(ids[j])


def verified_draft(block: np.ndarray, masked: np.ndarray, start: int) -> np.ndarray:
    """The part of a block whose drafting stopped early that the commit checks: the revealed
    positions up to the first still-masked one; when that is the first new position, it stays
    in as the mask token, which AR refuses in favour of its own token (so a block always adds
    one)."""
    first = int(np.flatnonzero(masked)[0])
    return block[:max(first, start + 1)].copy()


TAIL_MIN_KEPT = 2  # a tail draft that kept fewer new tokens is not followed by another


def reuse_tail(from_tail: bool, kept: int) -> bool:
    """After a verified commit cut a block, may the next draft be the commit's own tail (the picks of
    its causal logits past AR's refusal, computed over the refused draft: a Jacobi step) instead of
    preview passes? A tail costs head rows, a preview pass the whole trunk. It is tried after a
    preview's draft kept at least one token (on random weights nothing is kept and a tail is
    noise), and again while a tail keeps `TAIL_MIN_KEPT`. On the demo a draft usually fails at one
    digit, and the tail, which AR wrote past it, often holds the rest. Only speed changes: the
    commit checks every draft."""
    return kept >= (TAIL_MIN_KEPT if from_tail else 1)


MIN_WINDOW = 8  # the integer kernels' widest pass of rows (and the lazy head's group)


def draft_window(block_length: int, window: int, drafted: int, kept: int | None) -> int:
    """Positions the next checked block drafts (its preview's logit rows and its commit's rows),
    from the last block's: it drafted `drafted` new positions and AR kept `kept` of them (None:
    all). Drafted tokens past AR's first refusal are thrown away, and on a file whose LM head
    dominates each one cost a head row in the pass and a trunk row in the commit. After a cut the
    window is 8 × (kept + 1) rounded up to `MIN_WINDOW` (random weights, nothing kept: 8 of 32);
    after a block kept whole it doubles, up to the block. A tighter rule (2 × (kept + 1)) cost the
    demo model 12 % more blocks over 20 held-out sums; this one 1 %. Only speed changes: the
    text is AR's either way."""
    grown = 2 * max(window, drafted) if kept is None else 8 * (kept + 1)
    grown = -(-grown // MIN_WINDOW) * MIN_WINDOW
    return max(min(MIN_WINDOW, block_length), min(block_length, grown))


CORESET_SHARE = 0.8  # a coreset is used only when a pass restricted to it costs at most this share of a full one


def draft_coreset_size(n_expert: int, n_expert_used: int) -> int | None:
    """The expert coreset checked drafts may be restricted to: twice the experts a token routes to,
    offered only where that leaves at most a quarter of the model's experts (the real model: 16
    of 256). A 32-row preview over a half-drafted block routes to ~95 of 256 experts a layer (one of
    random tokens to ~140), an all-mask one to 8-10; with 8 experts (the demo) a block reaches all
    of them anyway. None: no coreset."""
    size = 2 * n_expert_used
    return size if n_expert_used > 0 and n_expert >= 4 * size else None


def coreset_pays(share: float) -> bool:
    """Whether checked drafts route within the coreset, given `share`, a pass restricted to it over
    a full pass, both over the same half-drafted block on this machine: only when the coreset cuts
    a pass's seconds to at most `CORESET_SHARE`. The coreset drafts worse (a row loses experts it
    would use), which costs speed and never text, so a small saving is not worth it. On a CPU a
    32-row pass is bound by arithmetic more than by the expert weights it reads: on the real-shape
    8-layer file at 1 thread a half-drafted pass within 16 of its ~95 experts a layer cost 0.96×
    a full one, and the measurement read 0.86-0.89 at 2 threads, so drafts there use every
    expert."""
    return 0 < share <= CORESET_SHARE


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
