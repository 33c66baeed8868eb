"""A chat session: the model, its tokenizer and chat template, and the decoder, as one object
that `clover run` and `clover serve` share.

It renders messages with the model's template, generates, turns committed blocks into text
(never splitting a character), applies stop strings, and parses reasoning and tool calls into
events. Text is emitted per committed block: inside a block, text can still change.
"""

from __future__ import annotations

import codecs
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .decoding import BlockEvent, DecodeParams, DoneEvent, GenerationStats, PassEvent, generate, token_logprob
from .decoding.constraint import Grammar, compile_grammar
from .errors import ContextLengthError
from .offload import OffloadRequest
from .prompt_cache import DEFAULT_CHECKPOINT_EVERY, DEFAULT_CTX_CHECKPOINTS, PromptCache
from .reasoning_budget import ANSWER_LEAD, CLOSE_THINK, generate_with_budget
from .text.chat_template import ChatTemplate, opens_reasoning
from .text.output_parser import OutputParser
from .text.reply import (
    ContentDelta,
    Finished,
    Logprobs,
    Progress,
    ReplyEvent,
    Timings,
    TokenScore,
    ToolCallArgs,
    ToolCallStart,
    Usage,
)
from .text.stops import AnswerStops, StopStrings
from .text.tokenizer import Tokenizer


@dataclass(frozen=True)
class PreparedPrompt:
    """A prompt rendered and tokenized once: what the context check counts, what a server's slot
    choice compares and what generation prefills are the same `ids`.

    `tools` are those the prompt offers (narrowed by `tool_choice`); `chat` is False for a raw
    completion, which is neither parsed nor given a reasoning budget. `grammar` constrains the
    reply (a forced tool call); `single_call` returns at most one tool call."""

    text: str
    ids: list[int]
    tools: list[dict[str, Any]] | None = None
    parse_tool_calls: bool = True
    chat: bool = True
    grammar: Grammar | None = None
    single_call: bool = False


MASK_GLYPH = "·"
SCORE_CHUNK = 64  # prompt rows scored per forward: 64 × a 248K vocabulary of float32 logits is 63 MB


def _as_score(token: int, s: Any) -> TokenScore:
    """A decoder's `TokenLogprob` as the reply's `TokenScore`."""
    return TokenScore(int(token), s.logprob, tuple(zip(s.top_ids, s.top_logprobs, strict=True)))


def _score(token: int, logits: Any, top: int) -> TokenScore:
    return _as_score(token, token_logprob(logits, token, top))


class _Scored:
    """Token scores waiting for their text: each is sent once the stop strings have let its first
    character through, and dropped when a stop string cut the text before it."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.chars = 0  # raw text so far, in characters
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending: list[tuple[int, TokenScore]] = []

    def add(self, ids: Sequence[int], logprobs: Sequence[Any] | None) -> None:
        """A block's tokens; forced ones (a reasoning budget's `</think>`) come without scores."""
        for i, t in enumerate(ids):
            if logprobs is not None:
                self.pending.append((self.chars, _as_score(t, logprobs[i])))
            self.chars += len(self._utf8.decode(self.tokenizer.token_bytes(int(t))))

    def release(self, limit: float) -> list[Logprobs]:
        n = 0
        while n < len(self.pending) and self.pending[n][0] < limit:
            n += 1
        out, self.pending = self.pending[:n], self.pending[n:]
        return [Logprobs(tuple(score for _, score in out))] if out else []


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
    def compile_grammar(self, kind: str, spec: str | Mapping[str, Any]) -> Grammar:
        """A grammar (`json_schema`, `lark`, `gbnf` or `regex`) for this model's tokenizer, to pass as
        `DecodeParams.grammar`; GrammarError when it is invalid."""
        return compile_grammar(self.tokenizer, kind, dict(spec) if isinstance(spec, Mapping) else spec)

    def prepare(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
                tool_choice: Any = "auto", chat_template_kwargs: Mapping[str, Any] | None = None,
                parallel_tool_calls: bool = True) -> PreparedPrompt:
        """Render and tokenize a chat prompt once. `tool_choice` "none" offers no tools and leaves
        `<tool_call>` text as content; a named function (`{"function": {"name": ...}}`) offers only
        that tool. "required" and a named function constrain the reply to a call (after the reasoning
        when thinking is on). Raises TemplateError when the template fails."""
        from .tool_grammar import tool_call_lark

        offered = [dict(t) for t in tools or []]
        if tool_choice == "none":
            offered = []
        elif isinstance(tool_choice, Mapping):
            wanted = tool_choice.get("function", {}).get("name")
            offered = [t for t in offered if t.get("function", {}).get("name") == wanted]
        grammar = None
        if offered and (tool_choice == "required" or isinstance(tool_choice, Mapping)):
            grammar = self.compile_grammar("lark", tool_call_lark(offered, parallel=parallel_tool_calls))
        text = self.render(messages, tools=offered or None, chat_template_kwargs=chat_template_kwargs)
        return PreparedPrompt(text, list(self.tokenizer.encode(text)), offered or None,
                              parse_tool_calls=tool_choice != "none", grammar=grammar,
                              single_call=not parallel_tool_calls)

    def prepare_text(self, prompt: str) -> PreparedPrompt:
        """Tokenize a raw completion prompt once (no template, no parsing)."""
        return PreparedPrompt(prompt, list(self.tokenizer.encode(prompt)), chat=False)

    def _generate(self, prompt: PreparedPrompt, ids: Sequence[int], p: DecodeParams, state: Any,
                  cancel: Any) -> Iterator[Any]:
        """The decoder's events; a chat reply that starts in reasoning gets `p.reasoning_budget`, and
        its grammar, if any, applies to the answer after the reasoning."""
        end_id = self.tokenizer.token_id("</think>")
        if ((p.reasoning_budget is None and p.grammar is None) or not prompt.chat or end_id is None
                or not opens_reasoning(prompt.text)):
            return generate(self.model, ids, p, state=state, cancel=cancel)
        return generate_with_budget(self.model, ids, p, state=state, cancel=cancel, budget=p.reasoning_budget,
                                    end_id=end_id, close_ids=self.tokenizer.encode(CLOSE_THINK),
                                    lead_ids=self.tokenizer.encode(ANSWER_LEAD))

    def stream(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
               tool_choice: Any = "auto", params: DecodeParams | None = None,
               chat_template_kwargs: Mapping[str, Any] | None = None,
               cancel: threading.Event | None = None, cache: PromptCache | None = None,
               cache_prompt: bool = True) -> Iterator[ReplyEvent]:
        """Events for one assistant reply: reasoning, content and tool-call events, then Finished.

        With a `cache`, the prompt's prefix that the cache holds is not prefilled again (unless
        `cache_prompt` is False) and the cache holds this prompt and reply afterwards."""
        prepared = self.prepare(messages, tools=tools, tool_choice=tool_choice,
                                chat_template_kwargs=chat_template_kwargs)
        yield from self.generate(prepared, params=params, cancel=cancel, cache=cache, cache_prompt=cache_prompt)

    def complete(self, prompt: str, *, params: DecodeParams | None = None,
                 cancel: threading.Event | None = None, cache: PromptCache | None = None,
                 cache_prompt: bool = True) -> Iterator[ReplyEvent]:
        """Raw text completion of `prompt` (no template, no parsing)."""
        yield from self.generate(self.prepare_text(prompt), params=params, cancel=cancel, cache=cache,
                                 cache_prompt=cache_prompt)

    def score(self, ids: Sequence[int], top: int = 0) -> list[TokenScore]:
        """Each token's logprob given the ones before it, with `top` alternatives: one causal
        forward over a fresh state (what lm-evaluation-harness's loglikelihood asks through `echo`).
        The first token has none: nothing predicts it."""
        ids = [int(t) for t in ids]
        self._check(ids)
        state = self.model.new_state(max(1, len(ids)))
        out = [TokenScore(ids[0], None)] if ids else []
        for c0 in range(0, len(ids) - 1, SCORE_CHUNK):  # the last token predicts nothing scored
            rows = self.model.forward(ids[c0:c0 + SCORE_CHUNK], state)
            out += [_score(ids[c0 + j + 1], row, top) for j, row in enumerate(rows) if c0 + j + 1 < len(ids)]
        return out

    def generate(self, prompt: PreparedPrompt, *, params: DecodeParams | None = None,
                 cancel: threading.Event | None = None, cache: PromptCache | None = None,
                 cache_prompt: bool = True, score_prompt: int | None = None) -> Iterator[ReplyEvent]:
        """Events for a prompt from `prepare`/`prepare_text`, generated from exactly its ids.
        `score_prompt` first sends the prompt's own logprobs (`score`) with that many alternatives;
        `params.max_tokens` 0 then generates nothing."""
        p = self._params(params)
        if prompt.grammar is not None:
            p = replace(p, grammar=prompt.grammar)
        ids = prompt.ids
        self._check(ids)
        if score_prompt is not None:
            t_score = time.perf_counter()
            yield Logprobs(tuple(self.score(ids, score_prompt)), prompt=True)
            if p.max_tokens == 0:
                done = GenerationStats(prompt_tokens=len(ids), prompt_ms=(time.perf_counter() - t_score) * 1e3)
                yield Finished("length", Usage(len(ids)), Timings.of(done), done)
                return
        parser = None
        if prompt.chat:
            parser = OutputParser(prompt.tools, starts_in_reasoning=opens_reasoning(prompt.text),
                                  parse_tool_calls=prompt.parse_tool_calls)
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
        stops: AnswerStops | StopStrings = (
            AnswerStops(p.stop_strings(), starts_in_reasoning=opens_reasoning(prompt.text)) if prompt.chat
            else StopStrings(p.stop_strings()))
        scored = _Scored(self.tokenizer) if p.logprobs is not None else None
        passes_per_block = int(p.max_passes or p.block_length or self.model.config.diffusion.block_length)
        stats = None
        t0 = time.perf_counter()

        def emit(text: str) -> list[ReplyEvent]:
            if not text:
                return []
            return [ContentDelta(text)] if parser is None else calls(parser.feed(text))

        def calls(events: list[Any]) -> list[Any]:
            """`parallel_tool_calls: false`: calls after the first are dropped."""
            if not prompt.single_call:
                return events
            return [e for e in events if not (isinstance(e, (ToolCallStart, ToolCallArgs)) and e.index > 0)]

        halt = _Halt(cancel)
        try:
            for ev in self._generate(prompt, gen_ids, p, state, halt):
                if isinstance(ev, PassEvent):
                    shown = "".join(MASK_GLYPH if t == p.mask_token_id else " " if self.tokenizer.is_control(t)
                                    else self.tokenizer.token_to_piece(t) for t in ev.tokens)  # end-of-text: blank
                    yield Progress(ev.block, ev.pass_index, passes_per_block, ev.masked, shown)
                elif isinstance(ev, BlockEvent):
                    generated.extend(ev.token_ids)
                    if scored is not None:
                        scored.add(ev.token_ids, ev.logprobs)
                    shown = emit(stops.feed(decoder.feed(ev.token_ids)))
                    if scored is not None:
                        yield from scored.release(stops.cut_at if stops.hit else stops.released)
                    yield from shown
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
            if scored is not None:
                yield from scored.release(math.inf)
                if not prompt.chat and stats is not None and stats.stop_logprob is not None:
                    yield Logprobs((_as_score(stats.stop_token, stats.stop_logprob),))  # as OpenAI's <|endoftext|>
            yield from emit(stops.feed(decoder.flush()) + stops.flush())
        if parser is not None:
            yield from calls(parser.finish())
        assert stats is not None
        if cache is not None:
            stats.prompt_tokens += len(ids) - 1 - int(cached)
            stats.prompt_ms += prefilled_ms
        stats.gen_ms = max(stats.gen_ms, (time.perf_counter() - t0) * 1e3 - stats.prompt_ms)
        usage = Usage(len(ids), stats.generated_tokens, int(cached))
        yield Finished("stop" if stops.hit else stats.finish_reason, usage, Timings.of(stats, int(cached)), stats,
                       stop_word=stops.word)


def load_chat(model_ref: str | Path, *, n_ctx: int | None = None, chat_template_file: str | Path | None = None,
              n_threads: int | None = None, backend: str = "auto",
              defaults: DecodeParams | None = None, exact_kernels: bool = False,
              offload: OffloadRequest | None = None) -> ChatSession:
    """Load a model file (or anything `clover_runtime.load_model` resolves) as a chat session;
    `offload` puts weight groups on a GPU (`-ngl`, `--cpu-moe`)."""
    from .loader import load_model

    if offload is not None and n_ctx and not offload.n_ctx:  # -ngl auto leaves room for this context
        offload = replace(offload, n_ctx=int(n_ctx))
    model = load_model(model_ref, n_threads=n_threads, backend=backend, exact_kernels=exact_kernels,
                       offload=offload)
    meta = model.file.metadata
    tokenizer = Tokenizer.from_metadata(meta)
    template = ChatTemplate.from_metadata(meta, override_path=chat_template_file)
    ctx = min(n_ctx or model.config.context_length, model.config.context_length)
    return ChatSession(model, tokenizer, template, n_ctx=ctx, defaults=defaults)
