"""Generation as a stream of events: block diffusion (docs/decoding.md §1) or exact AR decoding.

Block diffusion: a causal prefill; then per block of `block_length` positions, all masked,
preview passes (attention bidirectional inside the block over the cached prefix, nothing
written to the state) reveal positions by LowConfidence until none is masked; one causal
commit appends the block to the state. The LM head runs only for still-masked positions.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import CloverError, ContextLengthError
from ..model_config import supports_exact_diffusion
from . import policy
from .events import BlockEvent, DoneEvent, GenerationStats, PassEvent
from .params import DecodeParams, SamplingParams
from .sampling import apply_penalties, pick


def resolve_mode(model: Any, params: DecodeParams) -> tuple[str, bool, str]:
    """The decode mode this request gets on this model file."""
    exact = supports_exact_diffusion(model.config, model.file.tensors)
    return policy.choose_decode_mode(params.decode, exact)


def _mask_id(model: Any, params: DecodeParams) -> int:
    mask = params.mask_token_id if params.mask_token_id is not None else model.config.diffusion.mask_token_id
    if mask is None:
        raise CloverError("block diffusion needs a mask token: the file has no tokenizer.ggml.mask_token_id",
                          hint="use --decode ar, or pass a mask token id")
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
    stats = GenerationStats(prompt_tokens=len(prompt), decode_mode=mode, exact=exact, reason=reason)
    t0 = time.perf_counter()
    last_logits = model.forward(prompt, state, last_only=True)[0]
    stats.prompt_ms = (time.perf_counter() - t0) * 1e3
    run = _diffusion if mode == "diffusion" else _autoregressive
    t1 = time.perf_counter()
    yield from run(model, params, state, last_logits, stats, cancel)
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


def _ar_pick(logits: np.ndarray, history: Counter, sp: SamplingParams, rng: np.random.Generator) -> int:
    """AR's next token from one row of logits, penalised by what was generated so far."""
    return int(pick(apply_penalties(logits[None, :], history, sp), sp, rng)[0][0])


def _autoregressive(model: Any, params: DecodeParams, state: Any, logits: np.ndarray, stats: GenerationStats,
                    cancel: threading.Event | None) -> Iterator[Any]:
    stats.finish_reason = "length"
    rng = np.random.default_rng(params.sampling.seed)
    yield from _ar_span(model, state, np.empty(0, dtype=np.int64), logits, params.max_tokens, Counter(),
                        params.sampling, rng, _stop_ids(model, params), stats, 0, cancel)
    stats.forwards = stats.generated_tokens  # one causal forward per token; the first one is the prefill's


def _diffusion(model: Any, params: DecodeParams, state: Any, last_logits: np.ndarray, stats: GenerationStats,
               cancel: threading.Event | None) -> Iterator[Any]:
    cfg = model.config
    sp = params.sampling
    rng = np.random.default_rng(sp.seed)
    mask = _mask_id(model, params)
    block_length = int(params.block_length or cfg.diffusion.block_length)
    threshold = float(params.threshold if params.threshold is not None else cfg.diffusion.threshold)
    if params.reveal_k is not None and params.reveal_k < 1:
        raise CloverError(f"reveal_k must be at least 1, got {params.reveal_k}")
    shift = cfg.diffusion.shift_logits if params.shift_logits is None else bool(params.shift_logits)
    max_passes = int(params.max_passes or policy.default_max_passes(block_length))
    stops = _stop_ids(model, params)
    verify = policy.verify_commits(params.verify, sp.temperature, params.reveal_k is not None)
    history: Counter = Counter()
    block_index = 0
    carried = np.empty(0, dtype=np.int64)  # a cut block's kept tokens: the next block starts with them
    debt, streak, fallback = 0, 0, 0  # policy.ar_fallback's tally, and the AR tokens now due
    stats.finish_reason = "length"
    while stats.generated_tokens < params.max_tokens:
        if fallback:
            n = min(fallback, params.max_tokens - stats.generated_tokens)
            ended, carried, last_logits, block_index = yield from _ar_span(
                model, state, carried, last_logits, n, history, sp, rng, stops, stats, block_index, cancel)
            fallback = 0
            if ended:
                return
            continue
        c = len(carried)
        size = min(block_length, c + params.max_tokens - stats.generated_tokens, state.remaining)
        if size <= c:  # a whole block kept: commit it as it is, then go on with a fresh one
            if c == 0 or state.remaining <= c:
                return
            last_logits = model.forward(carried, state, last_only=True)[0]
            stats.forwards += 1
            carried = carried[:0]
            continue
        block = np.full(size, mask, dtype=np.int64)
        block[:c] = carried
        masked = np.ones(size, dtype=bool)
        masked[:c] = False
        before = history - Counter(int(t) for t in carried)  # what AR's picks in this block are penalised by
        forwards_before = stats.forwards
        passes = 0
        while masked.any():
            if cancel is not None and cancel.is_set():
                stats.finish_reason = "cancelled"
                return
            positions = np.flatnonzero(masked)
            rows, use_last = policy.logit_rows_for(positions.tolist(), shift)
            parts = []
            if use_last:
                parts.append(last_logits[None, :])
            if rows:
                res = model.preview(block, state, logit_rows=rows, expert_coreset=params.expert_coreset,
                                    gdn_preview=params.gdn_preview)
                parts.append(res.logits)
                stats.experts_history.append(float(np.mean(res.experts_per_layer)) if res.experts_per_layer else 0.0)
                stats.forwards += 1
            stats.passes += 1
            passes += 1
            logits = np.concatenate(parts, axis=0)  # always a fresh array: last_logits is reused
            policy.exclude_mask_candidates(logits, mask)
            tokens, probs = pick(apply_penalties(logits, history, sp), sp, rng)
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
            yield PassEvent(block_index, passes, tuple(int(t) for t in block[c:]), int(masked.sum()),
                            tuple(int(positions[j]) - c for j in reveal))
        carried = np.empty(0, dtype=np.int64)
        if verify:
            block, last_logits, cut_at = _verified_commit(model, block, state, last_logits, before, sp, rng, stops,
                                                           stats, start=c)
            history = before + Counter(int(t) for t in block)
            if cut_at is not None and int(block[-1]) not in stops:
                carried = block
            debt, streak, fallback = policy.ar_fallback(debt, streak, stats.forwards - forwards_before,
                                                        len(block) - c, block_length)
        cut = policy.first_stop(block.tolist(), stops)
        final = block if cut is None else block[:cut]
        if cut is None and not verify:
            last_logits = model.commit(block, state)
            stats.forwards += 1
        stats.generated_tokens += len(final) - c
        stats.blocks += 1
        yield BlockEvent(block_index, tuple(int(t) for t in final[c:]))
        block_index += 1
        if cut is not None:
            stats.finish_reason = "stop"
            stats.stop_token = int(block[cut])
            return


def _ar_span(model: Any, state: Any, pending: np.ndarray, logits: np.ndarray, n: int, history: Counter,
             sp: SamplingParams, rng: np.random.Generator, stops: frozenset[int], stats: GenerationStats,
             block_index: int, cancel: threading.Event | None,
             ) -> Generator[BlockEvent, None, tuple[bool, np.ndarray, np.ndarray, int]]:
    """Up to `n` tokens of plain AR, one BlockEvent each: `--decode ar`, and a checked diffusion
    decode's fallback (`policy.ar_fallback`), where a cut block's kept tokens (`pending`, already
    emitted) are committed first. Returns (ended, carried, logits, next block index): the last
    token is left uncommitted, as a cut block's are, with the logits it was picked from."""
    if len(pending):
        if len(pending) >= state.remaining:
            return True, pending, logits, block_index
        logits = model.forward(pending, state, last_only=True)[0]
        stats.forwards += 1
    carried = np.empty(0, dtype=np.int64)
    for _ in range(n):
        if len(carried):
            if state.remaining == 0:
                return True, carried, logits, block_index
            logits = model.forward(carried, state, last_only=True)[0]
            stats.forwards += 1
        if cancel is not None and cancel.is_set():
            stats.finish_reason = "cancelled"
            return True, carried, logits, block_index
        token = _ar_pick(logits, history, sp, rng)
        if token in stops:
            stats.finish_reason = "stop"
            stats.stop_token = token
            return True, carried[:0], logits, block_index
        history[token] += 1
        stats.generated_tokens += 1
        stats.blocks += 1
        stats.passes += 1
        yield BlockEvent(block_index, (token,))
        block_index += 1
        carried = np.array([token], dtype=np.int64)
    return False, carried, logits, block_index


def _verified_commit(model: Any, block: np.ndarray, state: Any, last_logits: np.ndarray, history: Counter,
                     sp: SamplingParams, rng: np.random.Generator, stops: frozenset[int],
                     stats: GenerationStats, start: int = 0) -> tuple[np.ndarray, Any, int | None]:
    """Commit a resolved block through its stop token (if any), keeping the longest prefix greedy AR
    agrees with plus AR's own token where they first differ (`policy.verify_commits`).

    Returns (tokens, logits, cut). Without a cut: the block, committed, and the logits that predict
    the next position (None after a stop). At a cut: the kept tokens and AR's one, the state
    returned to the block's start and the logits unchanged, so the next block starts with them
    known (no forward of its own). The first `start` tokens are AR's already."""
    cut = policy.first_stop(block.tolist(), stops)
    n = len(block) if cut is None else cut + 1
    snapshot = state.copy()
    rows = model.forward(block[:n], state)
    stats.forwards += 1
    seen = history + Counter(int(t) for t in block[:start])
    for i in range(start, n):
        logits = last_logits if i == 0 else rows[i - 1]
        token = _ar_pick(logits, seen, sp, rng)  # greedy: rng unused
        if token != int(block[i]):
            stats.corrections += 1
            model.restore(state, snapshot)
            return np.append(block[:i], token), (None if token in stops else last_logits), i
        seen[token] += 1
    if cut is not None:
        model.restore(state, snapshot)
        return block[:n], None, None
    return block, rows[-1], None
