"""Exact autoregressive generation: one causal forward per token, the reference for every decoder."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ..errors import CloverError, ContextLengthError
from .model import Model
from .sampling import sample_token
from .state import SequenceState


def generate_ar(model: Model, prompt_ids: Iterable[int], *, max_tokens: int, stop_ids: Iterable[int] = (),
                temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                seed: int | None = None, state: SequenceState | None = None) -> Iterator[int]:
    """Yield up to `max_tokens` generated ids; a stop id ends generation and is not yielded.

    The prompt is appended to `state` (a fresh one sized for prompt + max_tokens when None).
    Generation also ends when the state's context is full. Greedy when temperature is 0;
    otherwise sampling is reproducible for a given `seed`.
    """
    prompt = np.asarray(list(prompt_ids), dtype=np.int64)
    if prompt.size == 0:
        raise CloverError("cannot generate from an empty prompt")
    if max_tokens <= 0:
        return
    if state is None:
        limit = model.config.context_length
        if len(prompt) > limit:
            raise ContextLengthError(len(prompt), limit)
        state = model.new_state(min(limit, len(prompt) + max_tokens))
    stops = {int(s) for s in stop_ids}
    rng = np.random.default_rng(seed)
    logits = model.forward(prompt, state, last_only=True)[0]
    for i in range(max_tokens):
        token = sample_token(logits, rng, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        if token in stops:
            return
        yield token
        if i + 1 == max_tokens or state.remaining == 0:
            return
        logits = model.forward([token], state, last_only=True)[0]
