"""Token scores (`clover_runtime.text.reply.TokenScore`) in the shapes clients parse: OpenAI chat's
`logprobs.content`, OpenAI completions' `tokens`/`token_logprobs`/`top_logprobs`/`text_offset`, and
llama-server's `completion_probabilities` (its `n_probs`)."""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from typing import Any

FLOOR = -9999.0  # OpenAI's stand-in for a probability of zero (JSON has no -Infinity)


def _lp(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


class Words:
    """Token ids as text and bytes, through the model's tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def piece(self, tid: int) -> str:
        return self.tokenizer.token_to_piece(tid)

    def _one(self, tid: int, logprob: float) -> dict[str, Any]:
        return {"token": self.piece(tid), "logprob": _lp(logprob), "bytes": list(self.tokenizer.token_bytes(tid))}

    def chat(self, scores: Sequence[Any]) -> dict[str, Any]:
        """OpenAI chat: `{"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}`."""
        content = [{**self._one(s.id, s.logprob), "top_logprobs": [self._one(t, lp) for t, lp in s.top]}
                   for s in scores]
        return {"content": content, "refusal": None}

    def completion(self, scores: Sequence[Any], offset: int = 0) -> dict[str, Any]:
        """OpenAI completions: parallel lists; `top_logprobs` maps each alternative's text (and the
        chosen token's, as OpenAI adds it) to its logprob; a prompt's first token has nulls."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for s in scores:
            out["tokens"].append(self.piece(s.id))
            out["text_offset"].append(offset)
            offset += len(utf8.decode(self.tokenizer.token_bytes(s.id)))
            if s.logprob is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_lp(s.logprob))
            top = {self.piece(t): _lp(lp) for t, lp in s.top}
            top.setdefault(self.piece(s.id), _lp(s.logprob))
            out["top_logprobs"].append(top)
        return out

    def completion_reply(self, reply: Any, echoed: str | None) -> dict[str, Any]:
        """OpenAI's completions `logprobs` of a whole reply: the prompt's tokens first when it was
        echoed (`echoed`, its text; lm-eval reads their scores), the reply's offsets after it."""
        prompt = self.completion(reply.prompt_logprobs, 0)
        answer = self.completion(reply.logprobs, 0 if echoed is None else len(echoed))
        return {key: prompt[key] + answer[key] for key in prompt}

    def llama(self, scores: Sequence[Any]) -> list[dict[str, Any]]:
        """llama-server's `completion_probabilities`: per token its id, text, logprob, bytes and
        `top_logprobs` of {id, token, logprob, bytes}."""
        return [{"id": s.id, **self._one(s.id, s.logprob if s.logprob is not None else 0.0),
                 "top_logprobs": [{"id": t, **self._one(t, lp)} for t, lp in s.top]} for s in scores]


def text_length(tokenizer: Any, scores: Sequence[Any]) -> int:
    """Characters the scored tokens' text takes (where the next tokens' offsets start)."""
    return len(tokenizer.decode([s.id for s in scores]))
