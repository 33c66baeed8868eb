"""The reply contract: the events one generation emits, and the one accumulator that folds them.

The output parser emits the text and tool-call events, the chat session adds `Progress` and
`Finished`; `clover run`, the REPL and the server render these same classes (matched with
`isinstance`/`match`, never by name). `Reply` is the only place that assembles tool calls from
their streamed pieces and decides the `tool_calls` finish reason, so every caller agrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolMarkup(ContentDelta):
    """Content that is tool-call markup but no call: a call to a function the request did not offer
    (or when it offered none), a malformed call, or stray tags of a broken one. `name` and
    `arguments` (as written, in order) are set when the markup names a function. It is content
    (an API keeps the text, as llama-server does); a screen shows a note in its place."""

    name: str | None = None
    arguments: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A call's name is complete: its index, a fresh id and the name. Arguments follow."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgs:
    """A piece of the call's `arguments` JSON text; the pieces of one call concatenate to it."""

    index: int
    fragment: str


@dataclass(frozen=True)
class ParseError:
    """Something the model wrote that is not a well-formed call (reported, never dropped)."""

    message: str
    raw: str = ""


@dataclass(frozen=True)
class Progress:
    """A preview pass finished: the current block with masked positions shown as `·`."""

    block: int
    pass_index: int
    passes: int
    masked: int
    tokens_preview: str


@dataclass(frozen=True)
class Usage:
    """Token counts of one reply, exact: the prompt (of which `cached_tokens` came from the cache)
    and what was generated."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens, "cached_tokens": self.cached_tokens}

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens,
                     self.cached_tokens + other.cached_tokens)


@dataclass(frozen=True)
class Timings:
    """Where one reply's time went, with the exact counts (llama-server's `timings`, plus how many
    forwards, preview passes and blocks diffusion took and what each mode wrote); rates and ratios
    are derived here, and rounded only where a shape is rendered."""

    prompt_n: int = 0  # tokens prefilled (the cached ones not counted)
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cache_n: int = 0
    forwards: int = 0  # model passes after the prefill (previews and commits; AR: one per token)
    passes: int = 0
    blocks: int = 0
    experts_per_pass: float = 0.0
    ar_n: int = 0
    ar_ms: float = 0.0
    diffusion_n: int = 0
    diffusion_ms: float = 0.0

    @classmethod
    def of(cls, stats: Any, cache_n: int = 0) -> Timings:
        """From the decoder's `GenerationStats`."""
        return cls(stats.prompt_tokens, stats.prompt_ms, stats.generated_tokens, stats.gen_ms, cache_n,
                   stats.forwards, stats.passes, stats.blocks, stats.experts_per_pass, stats.ar_tokens,
                   stats.ar_ms, stats.diffusion_tokens, stats.diffusion_ms)

    @staticmethod
    def _rate(n: int, ms: float) -> float:
        return n / (ms / 1e3) if ms > 0 else 0.0

    @property
    def prompt_per_second(self) -> float:
        return self._rate(self.prompt_n, self.prompt_ms)

    @property
    def predicted_per_second(self) -> float:
        return self._rate(self.predicted_n, self.predicted_ms)

    @property
    def ar_per_second(self) -> float:
        return self._rate(self.ar_n, self.ar_ms)

    @property
    def diffusion_per_second(self) -> float:
        return self._rate(self.diffusion_n, self.diffusion_ms)

    @property
    def tokens_per_forward(self) -> float:
        return self.predicted_n / self.forwards if self.forwards else 0.0

    @property
    def passes_per_block(self) -> float:
        return self.passes / self.blocks if self.blocks else 0.0

    def to_json(self) -> dict[str, Any]:
        """llama-server's timings object and clover's additions: the one rendering of a Timings
        (the API's `timings`, `clover run --json`)."""
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_token_ms": round(self.prompt_ms / self.prompt_n, 3) if self.prompt_n else 0.0,
            "prompt_per_second": round(self.prompt_per_second, 3),
            "predicted_n": self.predicted_n,
            "predicted_ms": round(self.predicted_ms, 3),
            "predicted_per_token_ms": round(self.predicted_ms / self.predicted_n, 3) if self.predicted_n else 0.0,
            "predicted_per_second": round(self.predicted_per_second, 3),
            "tokens_per_forward": round(self.tokens_per_forward, 3),
            "forwards": self.forwards,
            "passes": self.passes,
            "blocks": self.blocks,
            "passes_per_block": round(self.passes_per_block, 3),
            "experts_per_pass": round(self.experts_per_pass, 2),
            "ar_n": self.ar_n,
            "ar_per_second": round(self.ar_per_second, 3),
            "diffusion_n": self.diffusion_n,
            "diffusion_per_second": round(self.diffusion_per_second, 3),
        }


@dataclass(frozen=True)
class Finished:
    """The generation ended. `finish_reason` is the decoder's (stop | length | cancelled);
    `Reply.finish_reason` turns a stop after tool calls into `tool_calls`."""

    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    stats: Any = None
    stop_word: str | None = None  # the stop string that ended it, when one did


@dataclass(frozen=True)
class TokenScore:
    """One token with its log-probability (None for a prompt's first token, which nothing
    predicts) and the most likely tokens at its position as (id, logprob), best first."""

    id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Logprobs:
    """Scores of the next tokens of the reply (asked for with `DecodeParams.logprobs`), or of the
    prompt's tokens (`prompt`, for a completion's `echo`). Sent before the text they make up; the
    reply's tokens concatenate to its raw text (reasoning included), cut where a stop string cut it."""

    tokens: tuple[TokenScore, ...]
    prompt: bool = False


ReplyEvent = (ContentDelta | ToolMarkup | ReasoningDelta | ToolCallStart | ToolCallArgs | ParseError | Progress
              | Logprobs | Finished)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""


@dataclass
class Reply:
    """One assistant reply, accumulated from its events (streamed or not, the result is the same)."""

    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    markup: list[ToolMarkup] = field(default_factory=list)
    finished: Finished | None = None
    logprobs: list[TokenScore] = field(default_factory=list)
    prompt_logprobs: list[TokenScore] = field(default_factory=list)

    def add(self, ev: ReplyEvent) -> None:
        match ev:
            case ToolMarkup(text=text):
                self.content += text
                self.markup.append(ev)
            case ContentDelta(text=text):
                self.content += text
            case ReasoningDelta(text=text):
                self.reasoning += text
            case ToolCallStart(index=index, id=call_id, name=name):
                if index != len(self.calls):
                    raise ValueError(f"tool call {index} started out of order (have {len(self.calls)})")
                self.calls.append(ToolCall(call_id, name))
            case ToolCallArgs(index=index, fragment=fragment):
                self.calls[index].arguments += fragment
            case ParseError(message=message):
                self.errors.append(message)
            case Logprobs(tokens=tokens, prompt=prompt):
                (self.prompt_logprobs if prompt else self.logprobs).extend(tokens)
            case Finished():
                self.finished = ev

    @property
    def finish_reason(self) -> str | None:
        """None until `Finished` arrives; a reply that stopped after calling tools says `tool_calls`."""
        if self.finished is None:
            return None
        reason = self.finished.finish_reason
        return "tool_calls" if self.calls and reason == "stop" else reason

    @property
    def usage(self) -> Usage:
        return self.finished.usage if self.finished else Usage()

    @property
    def timings(self) -> Timings:
        return self.finished.timings if self.finished else Timings()

    @property
    def stop_word(self) -> str | None:
        return self.finished.stop_word if self.finished else None

    @property
    def stats(self) -> Any:
        return self.finished.stats if self.finished else None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls in OpenAI's form; a call without arguments gets `{}` (valid JSON)."""
        return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                for c in self.calls]

    def message(self) -> dict[str, Any]:
        """The assistant message (what goes back into the conversation)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = self.tool_calls
        return msg
