"""What a generation request asks for: how to pick tokens and how to decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .constraint import Grammar


@dataclass
class SamplingParams:
    """Candidate picking. Greedy (temperature 0) by default: a block-diffusion confidence is the
    probability of the picked token, and greedy keeps it meaningful and the output reproducible."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0


@dataclass
class DecodeParams:
    """Decoding settings; None means "from the model file" (or our documented default)."""

    decode: str = "auto"  # auto | diffusion | ar
    block_length: int | None = None
    threshold: float | None = None
    max_passes: int | None = None  # per block; default block_length
    shift_logits: bool | None = None
    mask_token_id: int | None = None
    expert_coreset: int | None = None
    reveal_k: int | None = None  # a fixed number of positions revealed per pass instead of the threshold
    gdn_preview: str = "auto"
    verify: bool | None = None  # the commit checks each block against greedy AR (None: on when greedy)
    max_tokens: int = 512
    stop_ids: frozenset[int] = frozenset()
    stop: list[str] | str | None = None  # stop strings, applied to text by the chat session
    reasoning_budget: int | None = None  # thinking tokens before the chat session writes `</think>`
    grammar: Grammar | None = None  # constrained decoding: every token keeps this grammar valid
    logprobs: int | None = None  # per token: its logprob and this many top alternatives (None: no work)
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]
