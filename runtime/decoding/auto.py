"""`--decode auto`: block diffusion or AR, chosen block by block in seconds, not forwards.

A preview pass is not a decode step: on a CPU a 32-row pass of the real model routes to most of
its experts and costs several decode steps, while on a GPU or a small model it costs about one.
Under verified commits both modes write the same text, so the choice is only about speed: the
chooser measures seconds per committed token of each mode on this sequence, starts from what this
machine measured for the file before (`Costs`, kept by `calibration`), and, while AR is faster,
probes diffusion again with a backoff that keeps the probes' excess under `EXPLORE` of AR's time.
Pure bookkeeping: the decoder times the work and reports it here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EXPLORE = 0.03  # at most this share of AR's time goes to diffusion probes that lose
CHEAP_PASS = 2.0  # a pass costing at most this many decode steps is probed at once on a new file
WARM_TOKENS = 3  # AR tokens that time a decode step when nothing was measured before: the first picks from
# the prompt's logits, and of the two steps with a forward the lower prices AR (a process's first
# decode step loads kernels: 10.3 s at 2 threads on the demo, which priced every step at it)
MAX_BACKOFF = 16
# How far a block's tokens may yet rise above the blocks seen so far, in the window it drafted over
# the square root of their count: diffusion backs off only when even that optimistic count loses.
# A reply's blocks keep 1 to 30 tokens (the demo's average is ~7.7); two early blocks keeping 3
# and 4 sent the rest of the reply to AR at 1 thread (auto 1.12x AR, every block diffusion's
# 1.63x). On random weights (nothing agrees) a block keeps 1 token for 10+ steps and loses at once.
SPREAD = 0.25
SEEDED_BLOCKS = 8  # the blocks earlier replies' verdict on a file (`Costs.relative`) counts as
ALPHA = 0.5  # weight of the newest measurement in AR's and a pass's running estimates
DECAY = 0.9  # diffusion is judged by sums over its blocks, each earlier block's weight shrunk by this: a
# reply's blocks keep 1 to 30 tokens each and its last one (up to the stop) few. A running mean with
# weight 0.25 on the newest block left the first one most of the estimate (the demo's first reply,
# 32 tokens in 60 ms against AR's 2.3 ms a token, was judged 2.5 ms a token and sent the next to AR)


@dataclass
class Costs:
    """What this machine measured for a file, thread count and device: seconds of one decode step,
    of one preview pass of a whole block, diffusion's seconds per token relative to AR's on
    earlier replies (None until a reply has compared them) and the tokens a block committed on
    them (the weight that estimate carries into the next reply). `coreset`: the expert coreset
    checked drafts route within (0: every expert; None: not measured yet) and `coreset_share`,
    what a pass restricted to it cost against a full one (`policy.coreset_pays`)."""

    step_s: float
    pass_s: float
    relative: float | None = None
    block_tokens: float | None = None
    coreset: int | None = None
    coreset_share: float | None = None

    @property
    def pass_steps(self) -> float:
        """A preview pass in decode steps: diffusion pays only above this many tokens per pass."""
        return self.pass_s / self.step_s if self.step_s > 0 else math.inf


@dataclass(frozen=True)
class Choice:
    mode: str  # "diffusion" (one block) or "ar"
    tokens: int = 0  # AR tokens to write before asking again


def _ema(old: float | None, new: float, alpha: float = ALPHA) -> float:
    return new if old is None else alpha * new + (1 - alpha) * old


class AutoDecode:
    """The per-sequence choice between a diffusion block and an AR span."""

    def __init__(self, block_length: int, seed: Costs | None = None, waited: float = 0.0) -> None:
        self.block_length = block_length
        self.seed = seed
        self.ar_spt = seed.step_s if seed else None  # seconds per AR token
        self.pass_s = seed.pass_s if seed else None
        # decayed sums of diffusion blocks' seconds, tokens and count, carried over from earlier
        # replies: one probe block alone (1 to 30 tokens on the demo) said diffusion lost on replies it won
        self._s = self._t = self._w = 0.0
        if seed and seed.relative is not None and seed.block_tokens and seed.step_s > 0:
            self._w = float(SEEDED_BLOCKS)
            self._t = self._w * seed.block_tokens
            self._s = self._t * seed.relative * seed.step_s
        self.blocks = SEEDED_BLOCKS if seed is not None and seed.relative is not None else 0
        self.coreset = seed.coreset if seed else None  # what drafts route within (`policy.coreset_pays`)
        self.coreset_share = seed.coreset_share if seed else None
        self.streak = 0
        self.waited = waited  # AR seconds since the last diffusion block (earlier replies' included)
        self.wait = self._first_wait()

    def _first_wait(self) -> float:
        """AR seconds before the first diffusion block of a sequence."""
        s = self.seed
        if s is None or s.step_s <= 0:
            return 0.0  # nothing known: measure a pass on this reply
        if s.relative is not None:  # a probe block's expected excess over AR, as a losing block's backoff
            excess = max(s.relative - 1.0, 0.0) * s.step_s * (s.block_tokens or 1.0)
            return excess / EXPLORE
        return 0.0 if s.pass_steps <= CHEAP_PASS else s.pass_s / EXPLORE

    def next(self) -> Choice:
        if self.ar_spt is None:
            return Choice("ar", WARM_TOKENS)
        if self.waited >= self.wait:
            return Choice("diffusion")
        due = math.ceil((self.wait - self.waited) / self.ar_spt)
        return Choice("ar", max(1, min(due, 8 * self.block_length)))

    @property
    def dg_s(self) -> float | None:
        """Seconds of a diffusion block, over the blocks seen (None before the first)."""
        return self._s / self._w if self._w else None

    @property
    def dg_tokens(self) -> float | None:
        """Tokens a diffusion block commits, over the blocks seen (None before the first)."""
        return self._t / self._w if self._w else None

    @property
    def dg_spt(self) -> float | None:
        """Seconds per committed token of diffusion: the sums' ratio, not a mean of each block's
        ratio (a block that kept 1 token and one that kept 20 take 2 blocks' time for 21 tokens,
        where the mean of their ratios said diffusion was 2.9x slower than AR on the demo; it is
        1.6x faster)."""
        return self._s / max(self._t, 1e-9) if self._w else None

    def record_ar(self, seconds: float, tokens: int, step_s: float | None = None) -> None:
        """An AR span wrote `tokens` in `seconds`; `step_s`, its typical step (the decoder gives
        the lower median of its steps), prices AR: a process's first steps load kernels, and a
        2-token span at 4.7 s made AR look 2,000 times dearer than it is, for good."""
        if tokens <= 0:
            return
        self.ar_spt = _ema(self.ar_spt, seconds / tokens if step_s is None else step_s)
        self.waited += seconds

    def record_pass(self, seconds: float) -> None:
        self.pass_s = _ema(self.pass_s, seconds)

    def record_block(self, seconds: float, tokens: int, drafted: int | None = None) -> None:
        """A diffusion block (its passes and its commit) took `seconds` for `tokens` committed of
        the `drafted` positions it drafted (None: the whole block)."""
        self._s = DECAY * self._s + seconds
        self._t = DECAY * self._t + tokens
        self._w = DECAY * self._w + 1.0
        self.blocks += 1
        self.waited = 0.0
        ar = self.ar_spt if self.ar_spt is not None else self.dg_spt
        hopeful = self.dg_tokens + SPREAD * (drafted or self.block_length) / math.sqrt(self.blocks)
        if self.dg_s / hopeful <= ar:
            self.streak, self.wait = 0, 0.0
            return
        self.streak += 1
        excess = max(seconds - tokens * ar, 0.0)
        self.wait = excess / EXPLORE * min(2 ** (self.streak - 1), MAX_BACKOFF)

    def keep_drafting(self, revealed: int) -> bool:
        """After a pass that revealed `revealed` positions: is another pass worth its seconds?
        Only while a pass reveals at least as many tokens as AR writes in the same time."""
        if self.pass_s is None or self.ar_spt is None:
            return True
        return revealed * self.ar_spt >= self.pass_s

    def relative(self) -> float | None:
        """Diffusion's seconds per token over AR's on this sequence (None until both were measured)."""
        if self.dg_spt is None or self.ar_spt is None or self.ar_spt <= 0:
            return None
        return self.dg_spt / self.ar_spt


def describe(seed: Costs | None) -> str:
    """What auto will do first, in the run banner's words."""
    if seed is not None and seed.coreset and seed.coreset_share is not None:
        return (f"{_describe(seed)}; drafts route within {seed.coreset} experts a layer "
                f"(a pass {seed.coreset_share:.2f}× a full one)")
    return _describe(seed)


def _describe(seed: Costs | None) -> str:
    if seed is None or seed.step_s <= 0:
        return "auto: block diffusion and AR are timed on this first reply, then the faster one writes"
    steps = seed.pass_steps
    if seed.relative is not None and seed.relative < 1.0:
        return (f"auto: block diffusion — {1 / seed.relative:.1f}× AR's speed on earlier replies "
                f"(a preview pass costs {steps:.1f} decode steps)")
    if seed.relative is None and steps <= CHEAP_PASS:
        return f"auto: block diffusion — a preview pass costs {steps:.1f} decode steps on this machine"
    return (f"auto: AR on this machine — a preview pass costs {steps:.1f} decode steps; diffusion needs "
            f"≥ {steps:.1f} tokens per pass (probed again now and then)")
