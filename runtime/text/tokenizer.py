"""The model's tokenizer, built from the GGUF's `tokenizer.ggml.*` arrays.

The `tokenizers` library is the engine: a byte-level BPE from the file's tokens and merges, the
Qwen split pattern as pre-tokenizer, NFC input, and the file's added tokens (control and
user-defined types) matched atomically. Like tiktoken (Qwen's reference), a pre-tokenized piece
that is itself a token is taken whole. Decoding maps ids to bytes ourselves, so added tokens and
partial UTF-8 sequences come out exactly.
"""

from __future__ import annotations

import codecs
import gc
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ModelFileError
from .vocab import CONTROL, NORMAL, PRE_TOKENIZER_PATTERNS, UNUSED, USER_DEFINED, byte_to_unicode

_SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
}
_STOP_TEXTS = ("<|im_end|>", "<|endoftext|>")


def _split_merges(merges: Sequence[str]) -> list[tuple[str, str]]:
    """`"a b"` strings → pairs. Byte-level tokens never contain a space, so one C-level split of
    the joined list does it; anything else falls back to llama.cpp's rule (first space after
    the first character)."""
    flat = " ".join(merges).split(" ")
    if len(flat) == 2 * len(merges):
        return list(zip(flat[0::2], flat[1::2], strict=True))
    pairs = []
    for m in merges:
        cut = m.find(" ", 1)
        if cut < 0:
            raise ModelFileError(f"tokenizer.ggml.merges has an entry without a space: {m!r}")
        pairs.append((m[:cut], m[cut + 1:]))
    return pairs


class Tokenizer:
    """Encode/decode text for one model; ids are the model's own."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int] | None,
                 pre: str = "qwen35", special_ids: Mapping[str, int] | None = None,
                 add_bos: bool = False) -> None:
        if pre not in PRE_TOKENIZER_PATTERNS:
            raise ModelFileError(f"unsupported pre-tokenizer '{pre}' (supported: "
                                 f"{', '.join(PRE_TOKENIZER_PATTERNS)})")
        self.tokens = list(tokens)
        n = len(self.tokens)
        if n == 0:
            raise ModelFileError("the file's tokenizer has no tokens")
        types = np.full(n, NORMAL, dtype=np.int32) if token_types is None else np.asarray(token_types, np.int32)
        if types.shape != (n,):
            raise ModelFileError(f"tokenizer.ggml.token_type has {types.size} entries for {n} tokens")
        self.token_types = types
        self.special_ids = {k: int(v) for k, v in (special_ids or {}).items() if 0 <= int(v) < n}
        self.add_bos = add_bos
        self.pre = pre
        added = np.flatnonzero((types == CONTROL) | (types == USER_DEFINED)).tolist()
        self._added_ids = frozenset(added)
        self._control = frozenset(np.flatnonzero(types == CONTROL).tolist())
        self._unused = frozenset(np.flatnonzero(types == UNUSED).tolist())
        self._bytes: list[bytes | None] = [None] * n
        self._byte_decoder = {c: b for b, c in byte_to_unicode().items()}

        enabled = gc.isenabled()
        gc.disable()  # ~500k short-lived tuples: collection passes would only cost time here
        try:
            self._tok = self._build(self.tokens, merges, added)
        finally:
            if enabled:
                gc.enable()
        self._plain: Any = None

    def _build(self, tokens: list[str], merges: Sequence[str], added: list[int]) -> Any:
        from tokenizers import AddedToken, models

        n = len(tokens)
        vocab = dict(zip(reversed(tokens), range(n - 1, -1, -1), strict=True))  # first id wins on duplicates
        for i in self._unused:
            if vocab.get(tokens[i]) == i:
                del vocab[tokens[i]]
        pairs = _split_merges(merges)
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=True, fuse_unk=False)
        except Exception as exc:  # the Rust side names the offending merge
            raise ModelFileError(f"the file's tokenizer merges are invalid: {exc}") from None
        self._bpe = bpe
        self._pre_pattern = PRE_TOKENIZER_PATTERNS[self.pre]
        tok = self._wrap(bpe)
        tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in added])
        wrong = [i for i in added if tok.token_to_id(tokens[i]) != i and vocab.get(tokens[i]) == i]
        if wrong:
            raise ModelFileError(f"added token {tokens[wrong[0]]!r} did not get its id {wrong[0]}")
        return tok

    def _wrap(self, bpe: Any) -> Any:
        from tokenizers import Regex, decoders, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as _HFTokenizer

        tok = _HFTokenizer(bpe)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(self._pre_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        return tok

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (`tokenizer.ggml.model` must be the byte-level BPE `gpt2`)."""
        model = meta.get("tokenizer.ggml.model")
        if model is None or "tokenizer.ggml.tokens" not in meta:
            raise ModelFileError("the file has no tokenizer (tokenizer.ggml.tokens missing)")
        if model != "gpt2":
            raise ModelFileError(f"unsupported tokenizer model '{model}' (clover supports byte-level BPE 'gpt2')")
        specials = {k: int(meta[key]) for k, key in _SPECIAL_ID_KEYS.items() if key in meta}
        return cls(
            meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.merges", []),
            meta.get("tokenizer.ggml.token_type"),
            pre=str(meta.get("tokenizer.ggml.pre", "qwen35")), special_ids=specials,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        )

    # -- ids ------------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def token_id(self, text: str) -> int | None:
        """The id of a token given its text as stored (e.g. `<|im_end|>`), or None."""
        tid = self._tok.token_to_id(text)
        return int(tid) if tid is not None else None

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self.special_ids.get("eos")

    @property
    def pad_id(self) -> int | None:
        return self.special_ids.get("pad")

    @property
    def mask_id(self) -> int | None:
        return self.special_ids.get("mask")

    @property
    def im_end_id(self) -> int | None:
        return self.token_id("<|im_end|>")

    @property
    def eot_id(self) -> int | None:
        """The end-of-turn token: the file's `eot_token_id`, else `<|im_end|>`."""
        eot = self.special_ids.get("eot")
        return eot if eot is not None else self.im_end_id

    @property
    def stop_ids(self) -> set[int]:
        """Tokens that end a reply: EOS, EOT, `<|im_end|>` and `<|endoftext|>` where present."""
        ids = {i for i in (self.eos_id, self.special_ids.get("eot")) if i is not None}
        ids |= {t for t in (self.token_id(s) for s in _STOP_TEXTS) if t is not None}
        return ids

    def is_control(self, tid: int) -> bool:
        return tid in self._control

    # -- text -----------------------------------------------------------------------------------
    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool = False) -> list[int]:
        """Token ids for `text`; with parse_special=False added tokens are encoded as plain text."""
        if parse_special:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        else:
            if self._plain is None:
                self._plain = self._wrap(self._bpe)  # same BPE model, no added tokens
            ids = self._plain.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_id is not None:
            return [self.bos_id, *ids]
        return list(ids)

    def pieces(self, text: str) -> list[str]:
        """How the pre-tokenizer splits (NFC) text before BPE; for diagnostics and tests."""
        import unicodedata

        from tokenizers import Regex, pre_tokenizers

        split = pre_tokenizers.Split(Regex(self._pre_pattern), behavior="isolated")
        return [piece for piece, _ in split.pre_tokenize_str(unicodedata.normalize("NFC", text))]

    def token_bytes(self, tid: int) -> bytes:
        """The raw bytes a token stands for (added tokens: their UTF-8 text)."""
        cached = self._bytes[tid]
        if cached is not None:
            return cached
        piece = self.tokens[tid]
        if tid in self._added_ids or tid in self._unused:
            data = piece.encode("utf-8")
        else:
            table = self._byte_decoder
            try:
                data = bytes([table[c] for c in piece])
            except KeyError:  # not byte-level text: take it literally
                data = piece.encode("utf-8")
        self._bytes[tid] = data
        return data

    def token_to_piece(self, tid: int) -> str:
        """The text of one token (a partial UTF-8 sequence shows as U+FFFD)."""
        return self.token_bytes(tid).decode("utf-8", errors="replace")

    def _join(self, ids: Iterable[int], skip_special: bool) -> bytes:
        tb = self.token_bytes
        if skip_special:
            control = self._control
            return b"".join([tb(i) for i in ids if i not in control])
        return b"".join([tb(i) for i in ids])

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of `ids`; skip_special drops control tokens (`<think>`, `<tool_call>` stay)."""
        return self._join((int(i) for i in ids), skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, *, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special=skip_special)


class StreamDecoder:
    """Turns ids into text as they arrive without ever splitting a UTF-8 character: an
    incomplete trailing sequence is held until its last byte comes (or `flush`)."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        return self._dec.decode(self._tok._join((int(i) for i in ids), self._skip))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
