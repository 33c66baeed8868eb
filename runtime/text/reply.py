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
class Finished:
    """The generation ended. `finish_reason` is the decoder's (stop | length | cancelled);
    `Reply.finish_reason` turns a stop after tool calls into `tool_calls`."""

    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
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
    def usage(self) -> dict[str, int]:
        return dict(self.finished.usage) if self.finished else {}

    @property
    def timings(self) -> dict[str, float]:
        return dict(self.finished.timings) if self.finished else {}

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
