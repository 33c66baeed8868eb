"""The vocabulary and chat template a synthetic model carries, from `clover_runtime.text.vocab`."""

from __future__ import annotations

from typing import Any

from ..text.vocab import VocabArrays, default_chat_template, qwen36_vocab, small_vocab, write_vocab
from .spec import SynthSpec

MASK_TOKEN = "<|mask|>"  # our synthetic mask token (the published Clover one is unknown)


def vocabulary(spec: SynthSpec) -> VocabArrays:
    """The spec's vocabulary; the mask token id is only announced when the diffusion keys are on."""
    if spec.vocab == "qwen36":
        return qwen36_vocab(mask_token=MASK_TOKEN if spec.diffusion_keys else None)
    vocab = small_vocab()
    if not spec.diffusion_keys:
        vocab.special.pop("mask", None)
    return vocab


def token_count(spec: SynthSpec) -> int:
    return len(vocabulary(spec).tokens)


def add_vocabulary(writer: Any, spec: SynthSpec, vocab: VocabArrays | None = None) -> None:
    """Tokenizer arrays (the spec's, or `vocab`), special token ids and (unless disabled) the Qwen3.6
    chat template."""
    template = default_chat_template() if spec.chat_template else None
    write_vocab(writer, vocabulary(spec) if vocab is None else vocab, template)
