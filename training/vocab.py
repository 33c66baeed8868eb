"""The demo model's vocabulary: a byte-level BPE trained with `tokenizers` on the demo corpus.

The pre-tokenizer is the one clover's runtime applies to Qwen3.5/3.6 files (the `qwen35` split
pattern, then byte-level), so the text layer runs unchanged; the Qwen3.6 added tokens and our
mask token follow the learned pieces, with the GGUF token types clover reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from clover_runtime.text.vocab import (
    CONTROL,
    NORMAL,
    PRE_TOKENIZER_PATTERNS,
    QWEN_SPECIALS,
    VocabArrays,
    special_token_type,
)

MASK_TOKEN = "<|mask|>"
ADDED_TOKENS = (*QWEN_SPECIALS, MASK_TOKEN)
_ADDED = re.compile("|".join(re.escape(t) for t in sorted(ADDED_TOKENS, key=len, reverse=True)))


def plain_pieces(texts: Iterable[str]) -> Iterator[str]:
    """The texts with the added tokens cut out: BPE should not learn merges that spell them."""
    for text in texts:
        yield from (piece for piece in _ADDED.split(text) if piece)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A `tokenizers.Tokenizer` of at most `vocab_size` entries in all (learned pieces, then the
    added tokens at the ids `vocab_arrays` gives them)."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS["qwen35"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(ADDED_TOKENS), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(plain_pieces(texts), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED_TOKENS])
    return tok


def vocab_arrays(tok: Any) -> VocabArrays:
    """What the GGUF stores for a tokenizer from `train_tokenizer`."""
    model = json.loads(tok.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError("the trained vocabulary's ids are not contiguous")
    tokens = [t for t, _ in by_id]
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    types = [NORMAL] * len(tokens)
    tokens += ADDED_TOKENS
    types += [CONTROL if t == MASK_TOKEN else special_token_type(t) for t in ADDED_TOKENS]
    ids = {t: i for i, t in enumerate(tokens)}
    special = {"bos": ids["<|endoftext|>"], "eos": ids["<|im_end|>"], "eot": ids["<|im_end|>"],
               "pad": ids["<|endoftext|>"], "mask": ids[MASK_TOKEN]}
    return VocabArrays(tokens, merges, types, special)
