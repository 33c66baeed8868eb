"""The model's tokenizer, built from the GGUF's `tokenizer.ggml.*` arrays.

The `tokenizers` library is the engine: a byte-level BPE from the file's tokens and merges, the
Qwen split pattern as pre-tokenizer, NFC input, and the file's added tokens matched atomically.
Like tiktoken (Qwen's reference), a pre-tokenized piece that is itself a token is taken whole.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import ModelFileError
from .vocab import CONTROL, PRE_TOKENIZER_PATTERNS, UNUSED, USER_DEFINED

_SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
}
_STOP_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")


def _as_list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


class Tokenizer:
    """Encode/decode text for one model; ids are the model's own."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int] | None,
                 pre: str = "qwen35", special_ids: Mapping[str, int] | None = None) -> None:
        from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as _HFTokenizer

        if pre not in PRE_TOKENIZER_PATTERNS:
            raise ModelFileError(f"unsupported pre-tokenizer '{pre}' (supported: "
                                 f"{', '.join(PRE_TOKENIZER_PATTERNS)})")
        self.tokens = list(tokens)
        self.token_types = list(token_types) if token_types is not None else [1] * len(self.tokens)
        self.special_ids = dict(special_ids or {})
        added = [i for i, t in enumerate(self.token_types) if t in (CONTROL, USER_DEFINED)]
        self._control = {i for i in added if self.token_types[i] == CONTROL}
        self._added_ids = set(added)
        added_set = set(added)
        vocab = {t: i for i, t in enumerate(self.tokens) if i not in added_set and self.token_types[i] != UNUSED}
        merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
        bpe = models.BPE(vocab=vocab, merges=merge_pairs, ignore_merges=True, fuse_unk=False)

        def build(with_added: bool) -> Any:
            tok = _HFTokenizer(bpe)
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
            tok.decoder = decoders.ByteLevel()
            if with_added:
                tok.add_special_tokens([
                    AddedToken(self.tokens[i], special=True, normalized=False) for i in added
                ])
            return tok

        self._build = build
        self._tok = build(True)
        self._plain: Any = None
        self._byte_decoder = _byte_decoder()

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (`tokenizer.ggml.model` must be the byte-level BPE `gpt2`)."""
        model = meta.get("tokenizer.ggml.model")
        if model is None or "tokenizer.ggml.tokens" not in meta:
            raise ModelFileError("the file has no tokenizer (tokenizer.ggml.tokens missing)")
        if model != "gpt2":
            raise ModelFileError(f"unsupported tokenizer model '{model}' (clover supports byte-level BPE 'gpt2')")
        specials = {k: int(meta[key]) for k, key in _SPECIAL_ID_KEYS.items() if key in meta}
        types = meta.get("tokenizer.ggml.token_type")
        return cls(
            meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.merges", []),
            _as_list(types) if types is not None else None,
            pre=str(meta.get("tokenizer.ggml.pre", "qwen35")), special_ids=specials,
        )

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def token_id(self, text: str) -> int | None:
        """The id of an added token such as `<|im_end|>`, or None."""
        tid = self._tok.token_to_id(text)
        return int(tid) if tid is not None else None

    @property
    def eos_id(self) -> int | None:
        return self.special_ids.get("eos")

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("bos")

    @property
    def mask_id(self) -> int | None:
        return self.special_ids.get("mask")

    @property
    def eot_id(self) -> int | None:
        return self.special_ids.get("eot", self.token_id("<|im_end|>"))

    @property
    def stop_ids(self) -> set[int]:
        """Tokens that end a reply: EOS, EOT and the chat end markers present in this vocabulary."""
        ids = {i for i in (self.eos_id, self.special_ids.get("eot")) if i is not None}
        ids |= {t for t in (self.token_id(s) for s in _STOP_TEXTS) if t is not None}
        return ids

    def is_control(self, tid: int) -> bool:
        return tid in self._control

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool = False) -> list[int]:
        """Token ids for `text`; with parse_special=False added tokens are encoded as plain text."""
        if parse_special:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        else:
            if self._plain is None:
                self._plain = self._build(False)
            ids = self._plain.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_id is not None:
            return [self.bos_id, *ids]
        return list(ids)

    def encode_batch_len(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def token_bytes(self, tid: int) -> bytes:
        """The raw bytes a token stands for (added tokens: their UTF-8 text)."""
        piece = self.tokens[tid]
        if tid in self._added_ids or self.token_types[tid] == UNUSED:
            return piece.encode("utf-8")
        table = self._byte_decoder
        try:
            return bytes(table[c] for c in piece)
        except KeyError:
            return piece.encode("utf-8")

    def token_to_piece(self, tid: int) -> str:
        """The text of one token (a partial UTF-8 sequence shows as U+FFFD)."""
        return self.token_bytes(tid).decode("utf-8", errors="replace")

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        data = b"".join(
            self.token_bytes(i) for i in ids if not (skip_special and i in self._control)
        )
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, *, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special=skip_special)


class StreamDecoder:
    """Turns ids into text as they arrive without ever splitting a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        data = b"".join(self._tok.token_bytes(i) for i in ids if not (self._skip and self._tok.is_control(i)))
        return self._dec.decode(data)

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def _byte_decoder() -> dict[str, int]:
    from .vocab import byte_to_unicode

    return {c: b for b, c in byte_to_unicode().items()}
