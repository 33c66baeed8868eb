"""A chat session: the model, its tokenizer and chat template, and the decoder, as one object
that `clover run` and `clover serve` share.

It renders messages with the model's template, generates, turns committed blocks into text
(never splitting a character), applies stop strings, and parses reasoning and tool calls into
events. Text is emitted per committed block: inside a block, text can still change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .chat_template import ChatTemplate, opens_reasoning
from .decoding import BlockEvent, DecodeParams, DoneEvent, PassEvent, generate
from .errors import ContextLengthError
from .prompt_cache import DEFAULT_CHECKPOINT_EVERY, DEFAULT_CTX_CHECKPOINTS, PromptCache
from .reasoning_budget import CLOSE_THINK, generate_with_budget
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """The first delta of a call carries id and name; later ones only argument fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments_fragment: str = ""


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
    finish_reason: str  # stop | length | tool_calls | cancelled
    usage: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stats: Any = None
    errors: tuple[str, ...] = ()


MASK_GLYPH = "·"


class _StopStrings:
    """Holds back text that could be the start of a stop string; cuts at the first full match."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.buf = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if not self.stops:
            return text
        self.buf += text
        cut = min((i for i in (self.buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.buf, self.hit = self.buf[:cut], "", True
            return out
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self.buf[: len(self.buf) - hold]
        self.buf = self.buf[len(self.buf) - hold:]
        return out

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


def _timings(stats: Any, cache_n: int) -> dict[str, float]:
    return {
        "prompt_n": stats.prompt_tokens,
        "prompt_ms": round(stats.prompt_ms, 3),
        "prompt_per_second": round(stats.prompt_per_second, 3),
        "predicted_n": stats.generated_tokens,
        "predicted_ms": round(stats.gen_ms, 3),
        "predicted_per_second": round(stats.predicted_per_second, 3),
        "cache_n": cache_n,
        "tokens_per_forward": round(stats.tokens_per_forward, 3),
        "passes": stats.passes,
        "blocks": stats.blocks,
        "passes_per_block": round(stats.passes_per_block, 3),
        "experts_per_pass": round(stats.experts_per_pass, 2),
    }


class _Halt:
    """Stops generation when the caller cancels or a stop string matched (without touching the
    caller's event)."""

    def __init__(self, outer: threading.Event | None) -> None:
        self.outer = outer
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def is_set(self) -> bool:
        return self.stopped or (self.outer is not None and self.outer.is_set())


class ChatSession:
    """One loaded model ready to chat; generation is synchronous (callers use threads)."""

    def __init__(self, model: Any, tokenizer: Tokenizer, template: ChatTemplate, *, n_ctx: int,
                 defaults: DecodeParams | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.n_ctx = n_ctx
        self.defaults = defaults or DecodeParams()

    # -- prompts ----------------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
               chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
        return self.template.render(messages, tools=tools, add_generation_prompt=True,
                                    **dict(chat_template_kwargs or {}))

    def _params(self, params: DecodeParams | None) -> DecodeParams:
        p = params or self.defaults
        stops = frozenset(p.stop_ids) | frozenset(self.tokenizer.stop_ids)
        if p.mask_token_id is None and self.tokenizer.mask_id is not None:
            p = replace(p, mask_token_id=self.tokenizer.mask_id)
        return replace(p, stop_ids=stops)

    def _check(self, ids: Sequence[int]) -> None:
        if len(ids) >= self.n_ctx:
            raise ContextLengthError(len(ids), self.n_ctx)

    def new_cache(self, *, max_checkpoints: int = DEFAULT_CTX_CHECKPOINTS,
                  checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY) -> PromptCache:
        """A prompt cache for this model: pass it to `stream`/`complete` turn after turn and each
        call prefills only what its prompt does not share with the previous ones."""
        return PromptCache(self.model, self.n_ctx, max_checkpoints=max_checkpoints,
                           checkpoint_every=checkpoint_every, boundary_id=self.tokenizer.token_id("<|im_start|>"),
                           boundary_next=self.tokenizer.encode("assistant"))

    # -- generation -------------------------------------------------------------------------------
    def _generate(self, prompt: str, ids: Sequence[int], p: DecodeParams, state: Any, cancel: Any,
                  chat: bool) -> Iterator[Any]:
        """The decoder's events; a chat reply that starts in reasoning gets `p.reasoning_budget`."""
        end_id = self.tokenizer.token_id("</think>")
        if p.reasoning_budget is None or not chat or end_id is None or not opens_reasoning(prompt):
            return generate(self.model, ids, p, state=state, cancel=cancel)
        return generate_with_budget(self.model, ids, p, state=state, cancel=cancel, budget=p.reasoning_budget,
                                    end_id=end_id, close_ids=self.tokenizer.encode(CLOSE_THINK))

    def stream(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
               tool_choice: Any = "auto", params: DecodeParams | None = None,
               chat_template_kwargs: Mapping[str, Any] | None = None,
               cancel: threading.Event | None = None, cache: PromptCache | None = None,
               cache_prompt: bool = True) -> Iterator[Any]:
        """Events for one assistant reply: reasoning, content and tool-call deltas, then Finished.

        With a `cache`, the prompt's prefix that the cache holds is not prefilled again (unless
        `cache_prompt` is False) and the cache holds this prompt and reply afterwards."""
        from .output_parser import OutputParser

        if tool_choice == "none":
            tools = None
        elif isinstance(tool_choice, Mapping):
            wanted = tool_choice.get("function", {}).get("name")
            tools = [t for t in tools or [] if t.get("function", {}).get("name") == wanted] or None
        prompt = self.render(messages, tools=tools, chat_template_kwargs=chat_template_kwargs)
        parser = OutputParser(list(tools) if tools else None, starts_in_reasoning=opens_reasoning(prompt),
                              parse_tool_calls=tool_choice != "none")
        yield from self._run(prompt, params, cancel, parser, cache, cache_prompt)

    def complete(self, prompt: str, *, params: DecodeParams | None = None,
                 cancel: threading.Event | None = None, cache: PromptCache | None = None,
                 cache_prompt: bool = True) -> Iterator[Any]:
        """Raw text completion of `prompt` (no template, no parsing)."""
        yield from self._run(prompt, params, cancel, None, cache, cache_prompt)

    def _run(self, prompt: str, params: DecodeParams | None, cancel: threading.Event | None,
             parser: Any, cache: PromptCache | None = None, cache_prompt: bool = True) -> Iterator[Any]:
        p = self._params(params)
        ids = self.tokenizer.encode(prompt)
        self._check(ids)
        cached, prefilled_ms = 0, 0.0
        if cache is not None:
            try:
                prep = cache.prepare(ids, reuse=cache_prompt)
            except BaseException:  # interrupted inside a forward: the state may be half-written
                cache.clear()
                raise
            state, gen_ids, cached, prefilled_ms = cache.state, ids[-1:], prep.cached, prep.prefill_ms
        else:
            state, gen_ids = self.model.new_state(self.n_ctx), ids
        generated: list[int] = []
        decoder = self.tokenizer.stream_decoder()
        stops = _StopStrings(p.stop_strings())
        tool_calls = 0
        errors: list[str] = []
        passes_per_block = int(p.max_passes or p.block_length or self.model.config.diffusion.block_length)
        stats = None
        t0 = time.perf_counter()

        def emit(text: str) -> Iterator[Any]:
            nonlocal tool_calls
            if not text:
                return
            if parser is None:
                yield ContentDelta(text)
                return
            for d in parser.feed(text):
                yield from convert(d)

        def convert(d: Any) -> Iterator[Any]:
            nonlocal tool_calls
            kind = type(d).__name__
            if kind == "ContentDelta":
                yield ContentDelta(d.text)
            elif kind == "ReasoningDelta":
                yield ReasoningDelta(d.text)
            elif kind == "ToolCallStart":
                tool_calls += 1
                yield ToolCallDelta(d.index, d.id, d.name, "")
            elif kind == "ToolCallArgs":
                yield ToolCallDelta(d.index, None, None, d.fragment)
            elif kind == "ParseError":
                errors.append(d.message)

        halt = _Halt(cancel)
        try:
            for ev in self._generate(prompt, gen_ids, p, state, halt, parser is not None):
                if isinstance(ev, PassEvent):
                    shown = "".join(MASK_GLYPH if t == p.mask_token_id else self.tokenizer.token_to_piece(t)
                                    for t in ev.tokens)
                    yield Progress(ev.block, ev.pass_index, passes_per_block, ev.masked, shown)
                elif isinstance(ev, BlockEvent):
                    generated.extend(ev.token_ids)
                    text = stops.feed(decoder.feed(ev.token_ids))
                    yield from emit(text)
                    if stops.hit:
                        halt.stop()
                elif isinstance(ev, DoneEvent):
                    stats = ev.stats
        except GeneratorExit:  # the caller stopped reading between events: the state is whole
            if cache is not None:
                cache.finish(ids, generated)
            raise
        except BaseException:  # a failure inside a forward may leave the state half-written
            if cache is not None:
                cache.clear()
            raise
        if cache is not None:
            cache.finish(ids, generated)
        if not stops.hit:
            yield from emit(stops.feed(decoder.flush()) + stops.flush())
        if parser is not None:
            for d in parser.finish():
                yield from convert(d)
        assert stats is not None
        if cache is not None:
            stats.prompt_tokens += len(ids) - 1 - int(cached)
            stats.prompt_ms += prefilled_ms
        reason = stats.finish_reason
        if stops.hit:
            reason = "stop"
        if tool_calls and reason == "stop":
            reason = "tool_calls"
        stats.gen_ms = max(stats.gen_ms, (time.perf_counter() - t0) * 1e3 - stats.prompt_ms)
        usage = {"prompt_tokens": len(ids), "completion_tokens": stats.generated_tokens,
                 "total_tokens": len(ids) + stats.generated_tokens, "cached_tokens": int(cached)}
        yield Finished(reason, usage, _timings(stats, int(cached)), stats, tuple(errors))


def load_chat(model_ref: str | Path, *, n_ctx: int | None = None, chat_template_file: str | Path | None = None,
              n_threads: int | None = None, backend: str = "auto",
              defaults: DecodeParams | None = None, exact_kernels: bool = False) -> ChatSession:
    """Load a model file (or anything `clover_runtime.load_model` resolves) as a chat session."""
    from .engine import load_model

    model = load_model(model_ref, n_threads=n_threads, backend=backend, exact_kernels=exact_kernels)
    meta = model.file.metadata
    tokenizer = Tokenizer.from_metadata(meta)
    template = ChatTemplate.from_metadata(meta, override_path=chat_template_file)
    ctx = min(n_ctx or model.config.context_length, model.config.context_length)
    return ChatSession(model, tokenizer, template, n_ctx=ctx, defaults=defaults)
