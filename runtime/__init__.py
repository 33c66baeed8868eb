"""clover's runtime: GGUF files, models, tokenizer, engine and decoding (no CLI code).

`import clover_runtime` stays cheap: the engine (and numpy) load on first use of `clover_runtime.load_model`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from .loader import load_model

        return load_model
    raise AttributeError(f"module 'clover_runtime' has no attribute {name!r}")
