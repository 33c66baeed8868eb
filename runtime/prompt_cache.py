"""Prefix reuse: a sequence state that remembers what it holds, so a new prompt prefills only
what is new.

Attention K/V can be cut back to any length, but the Gated DeltaNet conv ring and recurrent state
cannot be rolled back token by token: they are restored from a checkpoint, a `SequenceState.copy()`
taken at a known position (copy on write: a checkpoint costs one GDN state, never K/V). For a new
token sequence the cache finds the longest common prefix with what the state holds, returns to the
newest checkpoint at or before it (or keeps going when the state holds nothing else) and prefills
the rest, taking checkpoints where reuse is likely: at the message boundary before the prompt's
last `<|im_start|>assistant` (`boundary_id` followed by the ids `boundary_next`: the reply starts
there, and a template that re-renders it differently next turn — Qwen3.6 drops the reasoning of
earlier turns — changes the history from there on; in an agent loop every later divergence is at
such a boundary of an earlier turn), every `checkpoint_every` tokens of a long prefill, and at the
end of every prompt. Each cut splits the prefill, and a short MoE segment still reads most experts,
so cuts are kept to these few.

Checkpoints sit only at multiples of `ALIGN` reached by prefill (never by decoding), and a
prompt continues only from one: the engine cuts its rows at the same absolute positions on every
path (`engine.align`), so a continuation computes bit for bit what a cold prefill computes and
greedy answers do not depend on what the cache held. The cost: up to ALIGN - 1 tokens before a
cut, and the tokens a reply generated, are prefilled again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .engine.align import ALIGN
from .errors import CloverError
from .memory_fit import DEFAULT_CTX_CHECKPOINTS, gdn_state_bytes

DEFAULT_CHECKPOINT_EVERY = 2048  # tokens between checkpoints inside one long prefill (0: never)


@dataclass
class Checkpoint:
    """The recurrent (and, shared, the attention) state after the first `n_past` held tokens."""

    n_past: int
    snapshot: Any  # SequenceState


@dataclass(frozen=True)
class Prepared:
    """What `PromptCache.prepare` did: tokens reused, tokens prefilled, and the time it took."""

    cached: int
    prefilled: int
    prefill_ms: float


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def checkpoint_bytes(config: Any) -> int:
    """Bytes one checkpoint holds: the conv rings and recurrent states of every GDN layer."""
    return gdn_state_bytes(config)


class PromptCache:
    """One sequence state, the token ids it holds, and its checkpoints (bounded in count).

    Not thread-safe: one generation uses a cache at a time (the server gives each slot its own).
    """

    def __init__(self, model: Any, n_ctx: int, *, max_checkpoints: int = DEFAULT_CTX_CHECKPOINTS,
                 checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY, boundary_id: int | None = None,
                 boundary_next: Sequence[int] = ()) -> None:
        if max_checkpoints < 0 or checkpoint_every < 0:
            raise CloverError("ctx-checkpoints and checkpoint-every must not be negative")
        self.model = model
        self.n_ctx = int(n_ctx)
        self.max_checkpoints = int(max_checkpoints)
        self.checkpoint_every = int(checkpoint_every)
        self.boundary_id = boundary_id
        self.boundary_next = [int(t) for t in boundary_next]
        self.state = model.new_state(self.n_ctx)
        self.tokens: list[int] = []
        self.checkpoints: list[Checkpoint] = []
        self.last_used = 0.0

    # -- what it holds --------------------------------------------------------------------------
    @property
    def n_cached(self) -> int:
        """Tokens the state holds now."""
        return self.state.n_past

    @property
    def checkpoint_bytes(self) -> int:
        return len(self.checkpoints) * checkpoint_bytes(self.model.config)

    def reusable(self, ids: Sequence[int]) -> int:
        """How many leading tokens of `ids` a `prepare(ids)` would not prefill again."""
        limit = min(common_prefix(self.tokens, ids), len(ids) - 1)
        best = self._best(limit)
        return best.n_past if best is not None else 0

    def _best(self, limit: int) -> Checkpoint | None:
        """The newest checkpoint a continuation may start from at or before `limit`."""
        usable = [c for c in self.checkpoints if c.n_past <= limit and c.n_past % ALIGN == 0]
        return max(usable, key=lambda c: c.n_past, default=None)

    def clear(self) -> None:
        """Forget everything: an empty state and no checkpoints."""
        self.checkpoints.clear()
        self.tokens = []
        self.state = self.model.new_state(self.n_ctx)

    # -- use ------------------------------------------------------------------------------------
    def prepare(self, ids: Sequence[int], *, reuse: bool = True) -> Prepared:
        """Leave the state holding all of `ids` but the last token (which the generation prefills,
        for its logits), reusing the longest cached prefix unless `reuse` is False."""
        ids = [int(t) for t in ids]
        if not ids:
            raise CloverError("cannot generate from an empty prompt")
        t0 = time.perf_counter()
        self.last_used = time.monotonic()
        cached = self._rewind(ids) if reuse else 0
        if not reuse or cached == 0:
            self.clear()
        end = len(ids) - 1
        self.tokens = ids[:self.state.n_past]
        self._prefill(ids, end)
        return Prepared(cached, end - cached, (time.perf_counter() - t0) * 1e3)

    def finish(self, ids: Sequence[int], generated: Sequence[int]) -> None:
        """Record what the state holds after a generation that continued `ids` with `generated`
        (the engine appends only what it committed: the first `state.n_past` of them)."""
        held = [int(t) for t in ids] + [int(t) for t in generated]
        self.tokens = held[:self.state.n_past]
        if len(self.tokens) != self.state.n_past:  # cannot happen unless the engine changed its contract
            self.clear()
        self.last_used = time.monotonic()

    def _rewind(self, ids: list[int]) -> int:
        """Return the state to the longest reusable prefix of `ids`; the tokens it keeps."""
        limit = min(common_prefix(self.tokens, ids), len(ids) - 1)
        best = self._best(limit)
        if best is not None and self.state.n_past == best.n_past:
            return best.n_past  # the state is that checkpoint: nothing was added since
        # checkpoints past the restore point are on another path (or ahead of it): drop them
        # first, so the state writes its K/V in place instead of copying what they would read
        keep = best.n_past if best is not None else 0
        self.checkpoints = [c for c in self.checkpoints if c.n_past <= keep]
        if best is None:
            return 0
        self.model.restore(self.state, best.snapshot)
        return best.n_past

    def _cuts(self, ids: list[int], start: int, end: int) -> list[int]:
        """Positions in (start, end], multiples of ALIGN, where a checkpoint is taken during this
        prefill: at or before the last message boundary, every `checkpoint_every` tokens, and at
        or before the end of the prompt (where a repeated or extended prompt resumes)."""
        cuts = {end // ALIGN * ALIGN}
        if self.boundary_id is not None:
            nxt, k = self.boundary_next, len(self.boundary_next)
            last = max((p for p in range(start + 1, end)
                        if ids[p] == self.boundary_id and ids[p + 1:p + 1 + k] == nxt), default=None)
            if last is not None:
                cuts.add(last // ALIGN * ALIGN)
        if self.checkpoint_every:
            every = max(ALIGN, self.checkpoint_every // ALIGN * ALIGN)
            cuts.update(range(every, end, every))
        # only the newest survive the bound: skip the rest
        keep = self.max_checkpoints
        return sorted(c for c in cuts if start < c <= end)[-keep:] if keep else []

    def _prefill(self, ids: list[int], end: int) -> None:
        start = self.state.n_past
        for cut in [*self._cuts(ids, start, end), end]:
            if cut > self.state.n_past:
                self.model.forward(ids[self.state.n_past:cut], self.state, last_only=True)
                self.tokens = ids[:cut]
            self._add_checkpoint()

    def _add_checkpoint(self) -> None:
        if self.max_checkpoints == 0:
            return
        n = self.state.n_past
        if n == 0 or n % ALIGN or any(c.n_past == n for c in self.checkpoints):
            return
        self.checkpoints.append(Checkpoint(n, self.state.copy()))
        self.checkpoints.sort(key=lambda c: c.n_past)
        while len(self.checkpoints) > self.max_checkpoints:
            self.checkpoints.pop(0)  # the oldest position: a conversation grows at its end
