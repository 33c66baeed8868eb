"""Where a causal pass cuts its rows: at fixed absolute positions, so the result does not depend
on where a call began.

A prompt-cache continuation starts at a checkpoint and a cold prefill at 0; when both cut their
rows at the same absolute positions (prefill chunks, Gated DeltaNet chunks, attention slices,
and the choice between the few-row kernels and the batched forms), every row meets the same
arithmetic on both paths and the logits are equal bit for bit. A continuation must start at a
multiple of `ALIGN` for that (the prompt cache keeps its checkpoints there).
"""

from __future__ import annotations

ALIGN = 64  # a multiple of every GDN chunk size; the prefill chunk is a multiple of it


def chunk_bounds(pos0: int, n: int, chunk: int) -> list[tuple[int, int]]:
    """Row ranges (start, end) of `n` rows at positions pos0.. cut at multiples of `chunk` in
    absolute positions, so a continuation from any position computes the chunks a cold pass does."""
    cuts = [0, *range(chunk - pos0 % chunk, n, chunk), n]
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def segments(pos0: int, n: int, small: int) -> list[tuple[int, int]]:
    """Row ranges of `n` rows at positions pos0.. for the causal layers: cut at multiples of
    `ALIGN` in absolute positions, runs of pieces over `small` rows joined, and neighbours of at
    most `small` rows joined while together they stay within it. Which form computes a row (the
    few-row kernels or the chunked form) then depends on its aligned piece, not on where the call
    began, so a continuation from an aligned position computes what a cold pass does; the few-row
    kernels give a row the same bits in any call, so a block that straddles a cut (half of all
    commits) runs as one call, not two."""
    cuts = [0, *range(ALIGN - pos0 % ALIGN, n, ALIGN), n]
    out: list[tuple[int, int]] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        last = out[-1][1] - out[-1][0] if out else 0
        if out and ((b - a > small and last > small) or last + b - a <= small):
            out[-1] = (out[-1][0], b)
        elif b > a:
            out.append((a, b))
    return out
