"""What a generation yields as it runs: passes, committed blocks, and the final statistics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PassEvent:
    """One preview pass finished; `tokens` is the block with mask ids where still masked (without
    the tokens a checked commit kept from the block before, which were emitted with it)."""

    block: int
    pass_index: int
    tokens: tuple[int, ...]
    masked: int
    revealed: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability and the `top` most likely tokens at its position, from
    the distribution it was chosen from (log-softmax of the penalised logits, before temperature)."""

    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class BlockEvent:
    """A block is final (committed, or cut at a stop token); its ids will never change.
    `logprobs` (one per token) only when `DecodeParams.logprobs` asked for them; a token the
    decoder did not choose (a reasoning budget's forced `</think>`) has none."""

    block: int
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass
class GenerationStats:
    """One reply's exact counts and times, as the decoder kept them. Rates and ratios are derived in
    one place, `text.reply.Timings.of(stats)`, which every front end renders."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_ms: float = 0.0
    gen_ms: float = 0.0
    forwards: int = 0  # model passes after the prefill: preview passes + commits (AR: one per token)
    passes: int = 0  # preview passes (AR: one per token)
    blocks: int = 0
    corrections: int = 0  # blocks the verifying commit cut where greedy AR picks another token
    experts_per_pass: float = 0.0  # distinct experts per layer per preview pass (mean)
    finish_reason: str = "stop"  # stop | length | cancelled
    decode_mode: str = "ar"
    exact: bool = True
    reason: str = ""
    stop_token: int | None = None
    stop_logprob: TokenLogprob | None = None  # the stop token's score, when logprobs were asked for
    ar_tokens: int = 0  # tokens AR wrote (`--decode ar`, and auto's AR spans)
    ar_ms: float = 0.0
    diffusion_tokens: int = 0  # tokens diffusion blocks committed
    diffusion_ms: float = 0.0
    auto_note: str = ""  # what `--decode auto` started with, and why (`auto.describe`)
    experts_history: list[float] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class DoneEvent:
    stats: GenerationStats
