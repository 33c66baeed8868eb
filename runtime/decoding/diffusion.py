"""Generation as a stream of events: block diffusion (docs/decoding.md §1) or exact AR decoding.

Block diffusion: a causal prefill; then per block of `block_length` positions, all masked,
preview passes (attention bidirectional inside the block over the cached prefix, nothing
written to the state) reveal positions by LowConfidence until none is masked; one causal
commit appends the block to the state. The LM head runs only for still-masked positions.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import CloverError, ContextLengthError, NoMaskToken
from ..model_config import supports_exact_diffusion
from . import calibration, draft_cost, policy
from .auto import AutoDecode, Costs, describe
from .constraint import Constraint
from .events import BlockEvent, DoneEvent, GenerationStats, PassEvent, TokenLogprob
from .params import DecodeParams, SamplingParams
from .sampling import apply_penalties, pick, token_logprob


def resolve_mode(model: Any, params: DecodeParams) -> tuple[str, bool, str]:
    """The decode mode this request gets on this model file."""
    exact = supports_exact_diffusion(model.config, model.file.tensors)
    mode, exact, reason = policy.choose_decode_mode(params.decode, exact)
    if mode == "diffusion" and _auto(params):
        reason = describe(calibration.load(model))
    return mode, exact, reason


def _auto(params: DecodeParams) -> bool:
    """Whether `--decode auto` chooses block by block: under verified commits, where both modes
    write the same text, and without a fixed reveal count (`bench --reveal-k`)."""
    return params.decode == "auto" and _verified(params) and params.reveal_k is None


def _verified(params: DecodeParams) -> bool:
    return policy.verify_commits(params.verify, params.sampling.temperature, params.reveal_k is not None)


def _mask_id(model: Any, params: DecodeParams) -> int:
    mask = params.mask_token_id if params.mask_token_id is not None else model.config.diffusion.mask_token_id
    if mask is None:
        raise NoMaskToken("block diffusion needs a mask token: the file has no tokenizer.ggml.mask_token_id")
    return int(mask)


def generate(model: Any, prompt_ids: Sequence[int], params: DecodeParams, *, state: Any = None,
             cancel: threading.Event | None = None) -> Iterator[Any]:
    """Yield PassEvent / BlockEvent as generation proceeds, then one DoneEvent with the stats."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise CloverError("cannot generate from an empty prompt")
    mode, exact, reason = resolve_mode(model, params)
    if state is None:
        limit = model.config.context_length
        if len(prompt) >= limit:
            raise ContextLengthError(len(prompt) + 1, limit)
        state = model.new_state(min(limit, len(prompt) + max(params.max_tokens, 1)))
    elif len(prompt) >= state.remaining:
        raise ContextLengthError(state.n_past + len(prompt) + 1, state.n_ctx)
    con = params.grammar.start() if params.grammar is not None else None
    if con is not None and mode == "diffusion" and not _verified(params):
        mode, reason = "ar", "a grammar needs verified commits: unchecked blocks decode as AR"
    stats = GenerationStats(prompt_tokens=len(prompt), decode_mode=mode, exact=exact, reason=reason)
    t0 = time.perf_counter()
    last_logits = model.forward(prompt, state, last_only=True)[0]
    stats.prompt_ms = (time.perf_counter() - t0) * 1e3
    run = _diffusion if mode == "diffusion" else _autoregressive
    t1 = time.perf_counter()
    yield from run(model, params, state, last_logits, stats, cancel, con)
    stats.gen_ms = (time.perf_counter() - t1) * 1e3
    if stats.experts_history:
        stats.experts_per_pass = float(np.mean(stats.experts_history))
    yield DoneEvent(stats)


def generate_ar(model: Any, prompt_ids: Sequence[int], *, max_tokens: int, stop_ids: Iterable[int] = (),
                sampling: SamplingParams | None = None, state: Any = None) -> Iterator[int]:
    """Exact autoregressive generation as plain token ids: `generate` with decode="ar".

    A stop id ends generation and is not yielded; so does a full context. Greedy unless
    `sampling` says otherwise (reproducible for a given seed).
    """
    params = DecodeParams(decode="ar", max_tokens=max_tokens, stop_ids=frozenset(int(t) for t in stop_ids),
                          sampling=sampling or SamplingParams())
    for event in generate(model, prompt_ids, params, state=state):
        if isinstance(event, BlockEvent):
            yield from event.token_ids


def _stop_ids(model: Any, params: DecodeParams) -> frozenset[int]:
    return frozenset(int(s) for s in params.stop_ids)


def _ar_pick(logits: np.ndarray, history: Counter, sp: SamplingParams, rng: np.random.Generator,
             logprobs: int | None = None) -> tuple[int, TokenLogprob | None]:
    """AR's next token from one row of logits, penalised by what was generated so far, and its
    logprob under those penalised logits when `logprobs` asks (the number of alternatives)."""
    row = apply_penalties(logits[None, :], history, sp)
    token = int(pick(row, sp, rng)[0][0])
    return token, (token_logprob(row[0], token, logprobs) if logprobs is not None else None)


def _mask_leading(con: Constraint, logits: np.ndarray, block: np.ndarray, positions: np.ndarray, start: int,
                  stops: frozenset[int]) -> None:
    """Mask the preview's row for its first masked position in place, when everything before it
    in the block is revealed and the grammar accepts it: the cheap part of constraining a draft
    (the verified commit enforces the rest)."""
    prefix = [int(t) for t in block[start:positions[0]]]
    if any(t in stops for t in prefix):
        return
    ahead = con.fork() if prefix else con
    if ahead.try_advance(prefix) == len(prefix):
        logits[0] = ahead.mask(logits[0], stops)


class _Clock:
    """Seconds of decoding work, paused while the consumer handles an event (printing, streaming),
    so `--decode auto` compares the modes' own costs."""

    def __init__(self) -> None:
        self.total = 0.0
        self._since: float | None = time.perf_counter()

    def now(self) -> float:
        return self.total + (time.perf_counter() - self._since if self._since is not None else 0.0)

    def pause(self) -> None:
        if self._since is not None:
            self.total += time.perf_counter() - self._since
            self._since = None

    def resume(self) -> None:
        self._since = time.perf_counter()


def _emit(clock: _Clock, event: Any) -> Generator[Any, None, None]:
    clock.pause()
    yield event
    clock.resume()


def _autoregressive(model: Any, params: DecodeParams, state: Any, logits: np.ndarray, stats: GenerationStats,
                    cancel: threading.Event | None, con: Constraint | None = None) -> Iterator[Any]:
    stats.finish_reason = "length"
    rng = np.random.default_rng(params.sampling.seed)
    clock = _Clock()
    yield from _ar_span(model, state, np.empty(0, dtype=np.int64), logits, params.max_tokens, Counter(),
                        params.sampling, rng, _stop_ids(model, params), stats, 0, cancel, clock, params.logprobs,
                        con)
    stats.forwards = stats.generated_tokens  # one causal forward per token; the first one is the prefill's
    stats.ar_tokens, stats.ar_ms = stats.generated_tokens, clock.now() * 1e3


def _chooser(model: Any, params: DecodeParams, block_length: int) -> AutoDecode | None:
    """`--decode auto` under verified commits picks diffusion or AR by seconds (`auto.AutoDecode`);
    a forced `--decode diffusion`, unchecked blocks and a fixed reveal count always diffuse."""
    if not _auto(params):
        return None
    return AutoDecode(block_length, calibration.load(model), calibration.waited(model))


def _remember(model: Any, chooser: AutoDecode | None) -> None:
    """Keep what this reply measured for the next one (`calibration`)."""
    if chooser is None:
        return
    calibration.note_waited(model, chooser.waited)
    if chooser.ar_spt is None or chooser.pass_s is None:
        return
    seed_rel = chooser.seed.relative if chooser.seed is not None else None
    rel = chooser.relative()
    seed_tokens = chooser.seed.block_tokens if chooser.seed is not None else None
    calibration.update(model, Costs(chooser.ar_spt, chooser.pass_s, rel if rel is not None else seed_rel,
                                    chooser.dg_tokens if chooser.dg_tokens is not None else seed_tokens,
                                    chooser.coreset, chooser.coreset_share))


def _draft_coreset(model: Any, params: DecodeParams, block_length: int, chooser: AutoDecode | None) -> int | None:
    """The expert coreset preview passes route within: `--expert-coreset` when given; under auto the
    cost model's (`policy.draft_coreset_size`, kept only where `policy.coreset_pays` on this
    machine, measured once by `draft_cost` and kept in the record); otherwise every expert."""
    if params.expert_coreset is not None or chooser is None:
        return params.expert_coreset
    if chooser.coreset is None:
        size = policy.draft_coreset_size(model.config.n_expert, model.config.n_expert_used)
        if size is None:
            return None
        chooser.coreset_share = draft_cost.coreset_share(model, block_length, size)
        chooser.coreset = size if policy.coreset_pays(chooser.coreset_share) else 0
    return chooser.coreset or None


def _diffusion(model: Any, params: DecodeParams, state: Any, last_logits: np.ndarray, stats: GenerationStats,
               cancel: threading.Event | None, con: Constraint | None = None) -> Iterator[Any]:
    cfg = model.config
    block_length = int(params.block_length or cfg.diffusion.block_length)
    verify = _verified(params) or params.logprobs is not None  # logprobs are AR's, which only a verified commit has
    chooser = _chooser(model, params, block_length)
    if chooser is not None:
        stats.auto_note = describe(chooser.seed)
    coreset = _draft_coreset(model, params, block_length, chooser)
    try:
        yield from _blocks(model, params, state, last_logits, stats, cancel, block_length, verify, chooser, con,
                           coreset)
    finally:
        _remember(model, chooser)


def _blocks(model: Any, params: DecodeParams, state: Any, last_logits: np.ndarray, stats: GenerationStats,
            cancel: threading.Event | None, block_length: int, verify: bool,
            chooser: AutoDecode | None, con: Constraint | None = None, coreset: int | None = None) -> Iterator[Any]:
    """Blocks of diffusion (and `--decode auto`'s AR spans). With a grammar (`con`, only under
    verified commits) the commit checks each position against AR's masked logits, so the block
    keeps exactly what constrained AR writes; the preview masks its leftmost open position."""
    cfg = model.config
    sp = params.sampling
    draft_sp = policy.draft_sampling(sp, verify)
    rng = np.random.default_rng(sp.seed)
    mask = _mask_id(model, params)
    threshold = policy.reveal_threshold(params.threshold, cfg.diffusion.threshold, verify)
    if params.reveal_k is not None and params.reveal_k < 1:
        raise CloverError(f"reveal_k must be at least 1, got {params.reveal_k}")
    shift = cfg.diffusion.shift_logits if params.shift_logits is None else bool(params.shift_logits)
    max_passes = int(params.max_passes or policy.default_max_passes(block_length))
    stops = _stop_ids(model, params)
    history: Counter = Counter()
    block_index = 0
    carried = np.empty(0, dtype=np.int64)  # a cut block's kept tokens: the next block starts with them
    block_start: Any = None  # the state at the block's start, while the state holds some carried tokens (`Model.cut`)
    window = block_length  # positions a checked block drafts (`policy.draft_window`)
    tail: _Tail | None = None  # the last cut commit's own draft for the positions after AR's token
    unjudged = [0.0, 0, 0]  # seconds, tokens and drafted positions not yet reported to the chooser
    clock = _Clock()
    stats.finish_reason = "length"
    while stats.generated_tokens < params.max_tokens:
        held = state.n_past - block_start.n_past if block_start is not None else 0  # carried tokens in the state
        choice = chooser.next() if chooser is not None else None
        if choice is not None and choice.mode == "ar":
            tail = None
            n = min(choice.tokens, params.max_tokens - stats.generated_tokens)
            t0, n0 = clock.now(), stats.generated_tokens
            steps: list[float] = []
            ended, carried, last_logits, block_index = yield from _ar_span(
                model, state, carried[held:], last_logits, n, history, sp, rng, stops, stats, block_index, cancel,
                clock, params.logprobs, con, steps)
            block_start = None
            spent, added = clock.now() - t0, stats.generated_tokens - n0
            chooser.record_ar(spent, added, statistics.median_low(steps) if steps else None)
            stats.ar_tokens += added
            stats.ar_ms += spent * 1e3
            if ended:
                return
            continue
        if cancel is not None and cancel.is_set():  # a block drafted by a tail runs no pass that would see it
            stats.finish_reason = "cancelled"
            return
        t_block, n_block = clock.now(), stats.generated_tokens
        c = len(carried)
        size = min(block_length, c + params.max_tokens - stats.generated_tokens, state.remaining + held)
        if size <= c:  # a whole block kept: commit it as it is, then go on with a fresh one
            if c == 0 or state.remaining <= c - held:
                return
            last_logits = model.forward(carried[held:], state, last_only=True)[0]
            stats.forwards += 1
            carried = carried[:0]
            block_start = None
            continue
        block = np.full(size, mask, dtype=np.int64)
        block[:c] = carried
        masked = np.ones(size, dtype=bool)
        masked[:c] = False
        end = min(size, c + window) if verify else size  # the draft covers positions c..end
        from_tail = False
        if tail is not None:  # the block is the tail's draft alone: no preview pass
            drafted_by_tail = tail.tokens(mask, end)[:end - c]
            tail = None
            if len(drafted_by_tail):
                end = c + len(drafted_by_tail)
                block[c:end] = drafted_by_tail
                masked[c:end] = False
                from_tail = True
        before = history - Counter(int(t) for t in carried)  # what AR's picks in this block are penalised by
        passes = 0
        while masked[:end].any():
            if cancel is not None and cancel.is_set():
                stats.finish_reason = "cancelled"
                return
            positions = np.flatnonzero(masked[:end])
            rows, use_last = policy.logit_rows_for(positions.tolist(), shift)
            parts = []
            if use_last:
                parts.append(last_logits[None, :])
            if rows:
                t_pass = clock.now()
                res = model.preview(block, block_start if held else state, logit_rows=rows,
                                    expert_coreset=coreset, gdn_preview=params.gdn_preview)
                if chooser is not None:
                    chooser.record_pass(clock.now() - t_pass)
                parts.append(res.logits)
                stats.experts_history.append(float(np.mean(res.experts_per_layer)) if res.experts_per_layer else 0.0)
                stats.forwards += 1
            stats.passes += 1
            passes += 1
            logits = np.concatenate(parts, axis=0)  # always a fresh array: last_logits is reused
            policy.exclude_mask_candidates(logits, mask)
            if con is not None:
                _mask_leading(con, logits, block, positions, c, stops)
            tokens, probs = pick(apply_penalties(logits, history, sp), draft_sp, rng)
            last_pass = passes >= max_passes
            if last_pass:
                reveal = np.arange(len(positions))
            elif params.reveal_k is not None:
                reveal = policy.fixed_count_reveal(probs, params.reveal_k)
            else:
                reveal = policy.low_confidence_reveal(probs, threshold)
            for j in reveal:
                block[positions[j]] = tokens[j]
                masked[positions[j]] = False
                history[int(tokens[j])] += 1
            yield from _emit(clock, PassEvent(block_index, passes, tuple(int(t) for t in block[c:]),
                                              int(masked.sum()), tuple(int(positions[j]) - c for j in reveal)))
            if chooser is not None and masked.any() and not chooser.keep_drafting(len(reveal)):
                block = policy.verified_draft(block, masked, c)
                break
        if len(block) > end:
            block = block[:end].copy()  # the window's draft, without the masks past it
        carried = np.empty(0, dtype=np.int64)
        scored: list[TokenLogprob] | None = None
        drafted = len(block) - c
        if verify:
            start_state, held_before = (block_start if held else state.copy()), held
            block, last_logits, cut_at, scored, rows, held = _verified_commit(
                model, block, state, last_logits, before, sp, rng, stops, stats, start=c, logprobs=params.logprobs,
                con=con, held=held)
            block_start = start_state if held else None
            accepted = None if cut_at is None else cut_at - c
            if not from_tail:  # the window follows what previews draft well
                window = policy.draft_window(block_length, window, drafted, accepted)
            history = before + Counter(int(t) for t in block)
            if cut_at is not None and int(block[-1]) not in stops:
                carried = block
                if rows is not None and policy.reuse_tail(from_tail, accepted):
                    tail = _Tail(rows, cut_at, held_before)
        cut = policy.first_stop(block.tolist(), stops)
        final = block if cut is None else block[:cut]
        if cut is None and not verify:
            last_logits = model.commit(block, state)
            stats.forwards += 1
        stats.generated_tokens += len(final) - c
        stats.blocks += 1
        if chooser is not None:  # a block and the tail drafts that follow it are judged together; a stop
            # token counts as written (AR spends a step on it too: a reply's last block was judged 0 tokens)
            done = (clock.now() - t_block, stats.generated_tokens - n_block + (cut is not None), drafted)
            unjudged = [a + b for a, b in zip(unjudged, done, strict=True)]
            if tail is None:
                chooser.record_block(*unjudged)
                unjudged = [0.0, 0, 0]
        stats.diffusion_tokens += stats.generated_tokens - n_block
        stats.diffusion_ms += (clock.now() - t_block) * 1e3
        kept = tuple(scored[:len(final) - c]) if scored is not None else None
        yield from _emit(clock, BlockEvent(block_index, tuple(int(t) for t in final[c:]), kept))
        block_index += 1
        if cut is not None:
            stats.finish_reason = "stop"
            stats.stop_token = int(block[cut])
            if scored is not None and len(scored) > cut - c:
                stats.stop_logprob = scored[cut - c]
            return


def _ar_span(model: Any, state: Any, pending: np.ndarray, logits: np.ndarray, n: int, history: Counter,
             sp: SamplingParams, rng: np.random.Generator, stops: frozenset[int], stats: GenerationStats,
             block_index: int, cancel: threading.Event | None, clock: _Clock, logprobs: int | None = None,
             con: Constraint | None = None, steps: list[float] | None = None,
             ) -> Generator[BlockEvent, None, tuple[bool, np.ndarray, np.ndarray, int]]:
    """Up to `n` tokens of plain AR, one BlockEvent each: `--decode ar`, and the AR spans of
    `--decode auto`, where a cut block's kept tokens (`pending`, already emitted) are committed
    first. Returns (ended, carried, logits, next block index): the last token is left uncommitted,
    as a cut block's are, with the logits it was picked from. A grammar (`con`) masks each pick.
    `steps` collects the seconds of each token's step (its forward and pick)."""
    if len(pending):
        if len(pending) >= state.remaining:
            return True, pending, logits, block_index
        logits = model.forward(pending, state, last_only=True)[0]
        stats.forwards += 1
    carried = np.empty(0, dtype=np.int64)
    for _ in range(n):
        t_step = clock.now()
        if len(carried):
            if state.remaining == 0:
                return True, carried, logits, block_index
            logits = model.forward(carried, state, last_only=True)[0]
            stats.forwards += 1
        if cancel is not None and cancel.is_set():
            stats.finish_reason = "cancelled"
            return True, carried, logits, block_index
        token, scored = _ar_pick(logits if con is None else con.mask(logits, stops), history, sp, rng, logprobs)
        if token in stops:
            stats.finish_reason = "stop"
            stats.stop_token, stats.stop_logprob = token, scored
            return True, carried[:0], logits, block_index
        if con is not None:
            con.advance(token)
        history[token] += 1
        stats.generated_tokens += 1
        stats.blocks += 1
        stats.passes += 1
        if steps is not None and len(carried):  # a step with a forward (the first may pick from known logits)
            steps.append(clock.now() - t_step)
        yield from _emit(clock, BlockEvent(block_index, (token,), None if scored is None else (scored,)))
        block_index += 1
        carried = np.array([token], dtype=np.int64)
    return False, carried, logits, block_index


def _verified_commit(model: Any, block: np.ndarray, state: Any, last_logits: np.ndarray, history: Counter,
                     sp: SamplingParams, rng: np.random.Generator, stops: frozenset[int],
                     stats: GenerationStats, start: int = 0, logprobs: int | None = None,
                     con: Constraint | None = None, held: int = 0,
                     ) -> tuple[np.ndarray, Any, int | None, list[TokenLogprob] | None, Any, int]:
    """Commit a resolved block through its stop token (if any), keeping the longest prefix AR
    accepts plus AR's own token where it first refuses (`policy.verify_commits`, `policy.accept_draft`).

    The state already holds the block's first `held` tokens (an earlier cut kept them): the
    forward runs from there. Returns (tokens, logits, cut, scored, rows, held). Without a cut: the
    block, committed, and the logits that predict the next position (None after a stop). At a cut:
    the kept tokens and AR's one, so the next block starts with them known (no forward of its
    own), the state holding the kept ones where the engine can cut its pass there (`Model.cut`:
    the returned `held`), else returned to where it was; the logits that predicted AR's token; and
    the commit's rows, whose picks past the cut may draft the rest (`_Tail`; None after a stop).
    The first `start` tokens are AR's already. With `logprobs`, the
    fourth item scores each token from `start` on (a stop token included) under AR's penalised
    logits at its position: the distribution the commit accepted or drew it from. A grammar
    (`con`) masks AR's logits at each position (logprobs are then the masked distribution's) and
    takes each kept token."""
    cut = policy.first_stop(block.tolist(), stops)
    n = len(block) if cut is None else cut + 1
    snapshot = state.copy()
    rows = model.forward_rows(block[held:n], state, cuttable=True)  # logits computed as read: up to AR's first refusal
    stats.forwards += 1
    seen = history + Counter(int(t) for t in block[:start])
    scored: list[TokenLogprob] | None = [] if logprobs is not None else None
    for i in range(start, n):
        logits = last_logits if i == held else rows[i - held - 1]
        if con is not None:
            logits = con.mask(logits, stops)
        row = apply_penalties(logits[None, :], seen, sp)[0]
        token = policy.accept_draft(row, int(block[i]), sp, rng)
        if scored is not None:
            scored.append(token_logprob(row, token, logprobs))
        if con is not None and token not in stops:
            con.advance(token)
        if token != int(block[i]):
            stats.corrections += 1
            kept = np.append(block[:i], token)
            if token in stops:
                model.restore(state, snapshot)
                return kept, None, i, scored, None, held
            if not model.cut(state, snapshot, rows, i - held):
                model.restore(state, snapshot)
                return kept, last_logits, i, scored, rows, held
            return kept, (last_logits if i == held else rows[i - held - 1]), i, scored, rows, i
        seen[token] += 1
    if cut is not None:
        model.restore(state, snapshot)
        return block[:n], None, None, scored, None, held
    return block, rows[-1], None, scored, None, 0


class _Tail:
    """A cut commit's draft for the positions after AR's token: at each, the pick of the commit's
    own causal logits (computed over the refused draft), read lazily so only the next block's
    window pays for head rows (`policy.reuse_tail`)."""

    def __init__(self, rows: Any, cut: int, held: int) -> None:
        self.rows, self.cut, self.held = rows, cut, held  # the commit's rows start at block position `held`

    def tokens(self, mask: int, end: int) -> np.ndarray:
        """Picks for block positions cut+1 .. end-1 (row p-held-1 predicts position p), never the mask."""
        out = []
        for p in range(self.cut + 1, min(end, len(self.rows) + self.held + 1)):
            row = self.rows[p - self.held - 1]
            best = int(np.argmax(row))
            if best == mask:
                row = row.copy()
                row[mask] = -np.inf
                best = int(np.argmax(row))
            out.append(best)
        return np.array(out, dtype=np.int64)
