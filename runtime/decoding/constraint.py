"""Constrained decoding: a grammar every generated token must keep valid (llguidance).

A `Grammar` is a request's grammar (JSON schema, Lark, GBNF or regex) compiled once against the
model's tokenizer; each generation starts its own `Constraint` from it, which masks logits
(disallowed tokens get -inf) and advances token by token. The decoder only ever sees these two
calls, so a request without a grammar does no work here at all.

llguidance was chosen over xgrammar (needs torch, transformers and triton) and outlines-core (builds
a whole-vocabulary index per schema up front, slow at Qwen3.6's 248K tokens): its masks are computed
lazily over a token trie in tens of microseconds at any vocabulary size, it covers most of JSON
schema, Lark and GBNF, can roll back, and ships one dependency-free abi3 wheel per platform.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CloverError

KINDS = ("json_schema", "lark", "gbnf", "regex")
# JSON as Python's json.dumps writes it (what Qwen's templates render): fixed separators and no
# free whitespace, so a small model cannot pad a reply with blanks forever. Keywords llguidance
# does not implement are ignored rather than refused.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


class GrammarError(CloverError):
    """A grammar or schema the constraint library refuses; `message` says why."""


_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class _Vocab:
    """Our tokenizer in the shape llguidance's TokenizerWrapper reads. Control tokens (`<|im_end|>`
    and the like) are special; added text tokens (`<tool_call>`, `<think>`) are plain bytes, so a
    grammar can spell them literally and the model's single token for them matches."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        n = tokenizer.n_vocab
        self.tokens = [tokenizer.token_bytes(i) for i in range(n)]
        self.special_token_ids = [i for i in range(n) if tokenizer.is_control(i)]
        self.eos_token_id = tokenizer.im_end_id if tokenizer.im_end_id is not None else tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._tokenizer.encode(text))


def ll_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of a tokenizer, built once per tokenizer (about a second at 248K tokens)."""
    import llguidance

    with _LOCK:
        found = _LL_TOKENIZERS.get(tokenizer)
        if found is None:
            stops = sorted(int(t) for t in tokenizer.stop_ids)
            found = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(tokenizer)),
                                           n_vocab=tokenizer.n_vocab, eos_token=stops or None)
            _LL_TOKENIZERS[tokenizer] = found
        return found


def grammar_text(kind: str, spec: str | dict[str, Any]) -> str:
    """A grammar spec as llguidance's grammar string; GrammarError when it cannot be read."""
    import llguidance

    if kind not in KINDS:
        raise GrammarError(f"unknown grammar kind {kind!r} (one of {', '.join(KINDS)})")
    text = json.dumps(spec) if isinstance(spec, dict) else str(spec)
    if kind == "json_schema":
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
        if not isinstance(parsed, (dict, bool)):
            raise GrammarError("a JSON schema must be an object")
    try:
        if kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
        return llguidance.grammar_from(kind, text)  # type: ignore[arg-type]
    except Exception as exc:  # the library's parsers raise ValueError or plain Exception
        raise GrammarError(_first_line(exc)) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


@dataclass(frozen=True)
class Grammar:
    """A grammar compiled for one tokenizer: `start()` gives each generation a fresh Constraint."""

    text: str
    ll_tokenizer: Any
    kind: str = "lark"

    def start(self) -> Constraint:
        import llguidance

        return Constraint(llguidance.LLMatcher(self.ll_tokenizer, self.text, log_level=0))


def compile_grammar(tokenizer: Any, kind: str, spec: str | dict[str, Any]) -> Grammar:
    """Check and compile a grammar for `tokenizer`; GrammarError (one line) when it is invalid."""
    import llguidance

    text = grammar_text(kind, spec)
    llt = ll_tokenizer(tokenizer)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, llt)
    if is_error:
        raise GrammarError(messages[0].splitlines()[0][:300] if messages else "invalid grammar")
    grammar = Grammar(text, llt, kind)
    matcher = grammar.start()._matcher  # some errors only show when the parser starts
    if matcher.is_error():
        raise GrammarError(matcher.get_error().splitlines()[0][:300])
    return grammar


class Constraint:
    """One generation's position in its grammar."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def allowed(self, width: int, stops: Iterable[int] = ()) -> np.ndarray:
        """Which of `width` token ids the grammar allows next (bool); stop tokens once the
        grammar is complete. When nothing is allowed (the matcher failed), stop tokens are, so
        the reply ends instead of breaking the grammar."""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        ok = np.unpackbits(bits, bitorder="little", count=min(width, bits.size * 8)).astype(bool)
        if ok.size < width:
            ok = np.concatenate([ok, np.zeros(width - ok.size, dtype=bool)])
        ids = [t for t in stops if 0 <= t < width]
        if ids and (self._matcher.is_accepting() or not ok.any()):
            ok[ids] = True
        return ok

    def mask(self, logits: np.ndarray, stops: Iterable[int] = ()) -> np.ndarray:
        """A copy of one row of logits with what the grammar forbids next at -inf."""
        return np.where(self.allowed(logits.shape[-1], stops), logits, np.float32(-np.inf))

    def advance(self, token: int) -> bool:
        """Take a generated token; False when the grammar refuses it (the matcher then stays failed)."""
        return bool(self._matcher.consume_token(int(token)))

    def try_advance(self, tokens: Sequence[int]) -> int:
        """Take as many of `tokens` as the grammar accepts; how many it took."""
        return int(self._matcher.try_consume_tokens([int(t) for t in tokens]))

    def rollback(self, n: int) -> None:
        """Undo the last `n` tokens taken."""
        if n > 0 and not self._matcher.rollback(n):
            raise GrammarError(f"the grammar cannot roll back: {self._matcher.get_error().splitlines()[0]}")

    def fork(self) -> Constraint:
        """An independent copy at the same position (to look ahead without touching this one)."""
        return Constraint(self._matcher.deep_copy())

    def is_accepting(self) -> bool:
        return bool(self._matcher.is_accepting())

    def is_error(self) -> bool:
        return bool(self._matcher.is_error())
