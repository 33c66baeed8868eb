"""The sampling a model file recommends (llama.cpp's `general.sampling.*` keys), each value it does
not set taken from llama.cpp's defaults, so `clover run`, the server and its web page start from the
same numbers, and the same ones a llama.cpp user gets for the same file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .params import SamplingParams

# llama.cpp's common_params_sampling defaults (llama-cli / llama-server with no flags)
LLAMA_CPP_DEFAULTS = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.0)

# SamplingParams field -> GGUF key (gguf-py Keys.General.SAMPLING_*), and the type it holds
GGUF_KEYS: dict[str, tuple[str, type]] = {
    "temperature": ("general.sampling.temp", float),
    "top_k": ("general.sampling.top_k", int),
    "top_p": ("general.sampling.top_p", float),
    "min_p": ("general.sampling.min_p", float),
    "repetition_penalty": ("general.sampling.penalty_repeat", float),
}


def recommended_sampling(metadata: Mapping[str, Any]) -> SamplingParams:
    """The file's recommended values where it has them, llama.cpp's defaults elsewhere."""
    given: dict[str, Any] = {}
    for field_name, (key, kind) in GGUF_KEYS.items():
        value = metadata.get(key)
        if value is None:
            continue
        try:
            given[field_name] = kind(value)
        except (TypeError, ValueError):
            continue  # a malformed key is ignored, as llama.cpp ignores it
    return replace(LLAMA_CPP_DEFAULTS, **given)
