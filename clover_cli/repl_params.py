"""The parameters `/set` changes in the chat, each checked before it is taken, and what
`/show params` lists (exactly these, so every row shown can be set)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Param:
    name: str
    sampling: bool  # lives in params.sampling, else in params itself
    parse: Callable[[str], Any]
    ok: Callable[[Any], bool]
    rule: str  # what `ok` accepts, said in the error line


def _decode(text: str) -> str:
    return text.strip().lower()


def _seed(text: str) -> int | None:
    value = int(text)
    return None if value == -1 else value  # -1: a random seed per reply, as llama.cpp


PARAMS: dict[str, Param] = {p.name: p for p in (
    Param("temperature", True, float, lambda v: 0.0 <= v <= 5.0, "a number from 0 to 5"),
    Param("top_k", True, int, lambda v: v >= 0, "a whole number, 0 or more (0: off)"),
    Param("top_p", True, float, lambda v: 0.0 < v <= 1.0, "a number above 0, at most 1"),
    Param("min_p", True, float, lambda v: 0.0 <= v <= 1.0, "a number from 0 to 1"),
    Param("seed", True, _seed, lambda v: v is None or v >= 0, "a whole number, 0 or more (-1: random)"),
    Param("max_tokens", False, int, lambda v: v >= 1, "a whole number, 1 or more"),
    Param("threshold", False, float, lambda v: 0.0 < v <= 1.0, "a number above 0, at most 1"),
    Param("block_length", False, int, lambda v: v >= 1, "a whole number, 1 or more"),
    Param("decode", False, _decode, lambda v: v in ("auto", "diffusion", "ar"), "auto, diffusion or ar"),
)}
ALIASES = {"temp": "temperature", "num_predict": "max_tokens", "n_predict": "max_tokens"}  # Ollama / llama.cpp


def set_param(params: Any, key: str, text: str) -> tuple[Any, str]:
    """(new params, canonical key) for `/set key text`; ValueError with one line when it is refused."""
    name = ALIASES.get(key, key)
    param = PARAMS.get(name)
    if param is None:
        raise ValueError(f"unknown parameter {key!r}; one of {', '.join(PARAMS)}, think, nothink")
    if not text:
        raise ValueError(f"/set {name} needs a value: {param.rule}")
    try:
        value = param.parse(text)
    except ValueError:
        raise ValueError(f"bad value for {name}: {text!r} is not {param.rule}") from None
    if not param.ok(value):
        raise ValueError(f"bad value for {name}: {text} is not {param.rule}")
    if param.sampling:
        return replace(params, sampling=replace(params.sampling, **{name: value})), name
    return replace(params, **{name: value}), name


def show_rows(params: Any, think: bool) -> list[tuple[str, str]]:
    """Every parameter `/set` takes with its value now ("model file" where the file decides)."""
    rows = []
    for name, param in PARAMS.items():
        value = getattr(params.sampling if param.sampling else params, name)
        if value is None:
            value = "random" if name == "seed" else "from the model file"
        rows.append((name, str(value)))
    rows.append(("think", "on" if think else "off"))
    return rows
