"""The demo model's BPE (training/vocab.py): trained by `tokenizers`, stored as GGUF arrays, and read
back by clover's Tokenizer with the same ids for every corpus text."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "training"))

import corpus as demo  # noqa: E402
import vocab as demo_vocab  # noqa: E402
from clover_runtime.text.tokenizer import Tokenizer  # noqa: E402
from clover_runtime.text.vocab import CONTROL, USER_DEFINED  # noqa: E402


@pytest.fixture(scope="module")
def texts() -> list[str]:
    corpus = demo.make_corpus(3, arithmetic_pairs=300, repeats=2)
    return [text for d in corpus.train for text, _ in demo.segments(d)]


def test_clover_reads_the_trained_vocabulary_with_the_trainers_ids(texts: list[str]) -> None:
    trained = demo_vocab.train_tokenizer(texts, 768)
    arrays = demo_vocab.vocab_arrays(trained)
    assert len(arrays.tokens) <= 768 and len(arrays.tokens) == trained.get_vocab_size()
    ours = Tokenizer(arrays.tokens, arrays.merges, arrays.token_types, special_ids=arrays.special)
    for text in texts[::7]:
        ids = ours.encode(text)
        assert ids == trained.encode(text).ids
        assert ours.decode(ids) == text
    assert ours.mask_id == arrays.tokens.index("<|mask|>") and ours.is_control(ours.mask_id)
    assert ours.eos_id == arrays.tokens.index("<|im_end|>")


def test_added_tokens_are_single_ids_with_clovers_types(texts: list[str]) -> None:
    arrays = demo_vocab.vocab_arrays(demo_vocab.train_tokenizer(texts, 768))
    ours = Tokenizer(arrays.tokens, arrays.merges, arrays.token_types, special_ids=arrays.special)
    for token in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"):
        (tid,) = ours.encode(token)
        expected = USER_DEFINED if token in ("<tool_call>", "</tool_call>", "<think>", "</think>") else CONTROL
        assert arrays.token_types[tid] == expected
    learned = arrays.tokens[: arrays.tokens.index("<|endoftext|>")]
    assert not any("im_start" in t or "tool_call" in t for t in learned), "added tokens leaked into the merges"
    assert all(len(ours.encode(str(d))) == 1 for d in range(10)), "digits are single tokens"
