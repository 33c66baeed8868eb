"""The two training objectives, aligned with how clover decodes.

Causal: next-token cross-entropy on assistant tokens only (row r predicts token r+1; prompt
tokens are context). Block diffusion: each assistant segment is cut into `block_length` blocks
from its first token (clover places blocks at the generation start); positions past the segment's
end hold the pad token (what a block holds after the stop token does not matter to the decoder,
but a confident filler lets it reveal them in one pass). A random fraction of each block's
positions is replaced by the mask token; the block is seen bidirectionally over its clean causal
prefix. With `shift_logits` (clover's default) preview row j-1 predicts block position j, and
position 0 is predicted by the last committed row, which is the causal objective's row, so the
diffusion loss covers masked positions 1..L-1 (`clover_runtime.decoding.policy.logit_rows_for`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE = -100


@dataclass(frozen=True)
class Example:
    """One tokenized dialogue: ids, which tokens the assistant wrote, and the assistant spans."""

    ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]  # [start, end) of each assistant segment
    answers: tuple[int, ...] = ()  # indices into `spans` of the weighted pieces (train.weighted)


def example(pieces: Sequence[tuple[Sequence[int], bool]], answers: Sequence[bool] = ()) -> Example:
    """An Example from (token ids, is_assistant) pieces in order; `answers` marks, per piece, the
    assistant pieces whose tokens are weighted (train.weighted says which)."""
    ids: list[int] = []
    spans = []
    marked = []
    for k, (piece, is_assistant) in enumerate(pieces):
        if is_assistant and piece:
            if k < len(answers) and answers[k]:
                marked.append(len(spans))
            spans.append((len(ids), len(ids) + len(piece)))
        ids.extend(piece)
    return Example(tuple(ids), tuple(spans), tuple(marked))


def block_starts(ex: Example, block_length: int) -> list[int]:
    return [s for start, end in ex.spans for s in range(start, end, block_length)]


@dataclass
class Batch:
    ids: Tensor  # (B, T) clean tokens, padded
    ar_targets: Tensor  # (B, T) next assistant token of each row, or IGNORE
    blocks: Tensor  # (B, nb, L) noisy blocks
    starts: Tensor  # (B, nb) block start positions on the clean sequence
    block_targets: Tensor  # (B, nb, L) clean block tokens (pad past the segment's end)
    masked: Tensor  # (B, nb, L) positions replaced by the mask token (False on padding blocks)
    rate: Tensor  # (B, nb) the mask rate each block was drawn with
    valid: Tensor  # (B, nb) real blocks (False: padding blocks of a shorter example)
    ar_answer: Tensor  # (B, T) rows whose target is in a marked span (Example.answers)
    block_answer: Tensor  # (B, nb) blocks of such spans


def make_batch(examples: Sequence[Example], block_length: int, mask_id: int, pad_id: int,
               gen: torch.Generator, complementary: bool = False) -> Batch:
    """Pad the examples to one length and draw each block's mask (fraction uniform in (0, 1]).
    With `complementary`, every block appears twice, masked and with the complementary mask, so
    each of its positions is predicted once per step."""
    B = len(examples)
    T = max(len(e.ids) for e in examples)
    starts_per = [block_starts(e, block_length) for e in examples]
    nb = max(1, max(len(s) for s in starts_per))
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    ar = torch.full((B, T), IGNORE, dtype=torch.long)
    blocks = torch.full((B, nb, block_length), pad_id, dtype=torch.long)
    starts = torch.ones((B, nb), dtype=torch.long)
    valid = torch.zeros((B, nb), dtype=torch.bool)
    ar_answer = torch.zeros((B, T), dtype=torch.bool)
    block_answer = torch.zeros((B, nb), dtype=torch.bool)
    for b, e in enumerate(examples):
        ids[b, :len(e.ids)] = torch.tensor(e.ids)
        for k, (start, end) in enumerate(e.spans):
            ar[b, start - 1:end - 1] = ids[b, start:end]
            ar_answer[b, start - 1:end - 1] = k in e.answers
            for n, s in enumerate(starts_per[b]):
                if start <= s < end:
                    blocks[b, n, :min(end, s + block_length) - s] = ids[b, s:min(end, s + block_length)]
                    block_answer[b, n] = k in e.answers
        for n, s in enumerate(starts_per[b]):
            starts[b, n] = s
            valid[b, n] = True
        starts[b, len(starts_per[b]):] = starts_per[b][0] if starts_per[b] else 1  # padding blocks: no loss
    targets = blocks.clone()
    rate = torch.rand((B, nb, 1), generator=gen).clamp_min(1.0 / block_length)
    masked = (torch.rand((B, nb, block_length), generator=gen) < rate) & valid[..., None]
    if complementary:
        rate = torch.cat([rate, (1.0 - rate).clamp_min(1.0 / block_length)], dim=1)
        masked = torch.cat([masked, ~masked & valid[..., None]], dim=1)
        blocks, targets = blocks.repeat(1, 2, 1), targets.repeat(1, 2, 1)
        starts, valid = starts.repeat(1, 2), valid.repeat(1, 2)
        block_answer = block_answer.repeat(1, 2)
    return Batch(ids, ar, torch.where(masked, mask_id, blocks), starts, targets, masked, rate[..., 0], valid,
                 ar_answer, block_answer)


def losses(model: torch.nn.Module, batch: Batch, diffusion: bool = True, answer_weight: float = 1.0
           ) -> dict[str, Tensor]:
    """Causal loss, diffusion loss (zero without `diffusion`: the block stream is not run), the
    MoE load-balancing term of one batch, and (for the log, not trained on) the causal loss on
    the marked spans alone (answers to a tool's result, and with --weight-tool-calls the calls).

    With `answer_weight` ≠ 1 the tokens of those spans (and their blocks) count that many times
    in both losses (`tool_answer_weight` in train.py says why).

    The diffusion loss weights each masked position by 1/rate of its block and divides by the
    number of predicted positions (LLaDA's ELBO weighting): a plain mean over masked positions
    is dominated by nearly fully masked blocks, while the decoder's late passes, where a few
    masked digits decide the answer, are blocks with few masks."""
    blocks = (batch.blocks, batch.starts) if diffusion else ()
    x, xn, balance = model.hidden_states(batch.ids, *blocks)
    keep = batch.ar_targets != IGNORE
    weighted = answer_weight != 1.0  # unweighted, the plain mean: earlier recipes keep their bytes
    if weighted:
        ce_ar = F.cross_entropy(model.logits(x[keep]), batch.ar_targets[keep], reduction="none")
        ar = (ce_ar * (1.0 + (answer_weight - 1.0) * batch.ar_answer[keep])).sum() / keep.sum()
    else:
        ar = F.cross_entropy(model.logits(x[keep]), batch.ar_targets[keep])
    parts = {"answer": _answer_loss(model, x, batch)}
    sel = batch.masked[..., 1:]  # row j-1 predicts block position j
    if xn is not None and sel.any():
        ce = F.cross_entropy(model.logits(xn[..., :-1, :][sel]), batch.block_targets[..., 1:][sel], reduction="none")
        weight = (1.0 / batch.rate)[..., None].expand_as(sel)[sel]
        if weighted:
            weight = weight * (1.0 + (answer_weight - 1.0) * batch.block_answer[..., None].expand_as(sel)[sel])
        positions = batch.valid.sum() * (batch.masked.shape[-1] - 1)
        diff = (ce * weight).sum() / positions
    else:
        diff = ar.new_zeros(())
    return {"ar": ar, "diffusion": diff, "balance": balance, **parts}


def _answer_loss(model: torch.nn.Module, x: Tensor, batch: Batch) -> Tensor:
    """Mean causal loss on the marked spans (answers to a tool's result, and the calls where they
    are marked), without gradient: they are a few tokens in a thousand, so the mean loss hides
    whether the one token there that only the result tells (the weather's sky) was learnt."""
    if not batch.ar_answer.any():
        return x.new_zeros(())
    with torch.no_grad():
        rows = batch.ar_answer & (batch.ar_targets != IGNORE)
        return F.cross_entropy(model.logits(x[rows]), batch.ar_targets[rows])
