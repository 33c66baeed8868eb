"""Which Hub clover talks to: the one place the endpoint variables are read."""

from __future__ import annotations

import os


def endpoint() -> str:
    """HF_ENDPOINT (a mirror), else MODEL_ENDPOINT (llama.cpp's name), else huggingface.co."""
    value = os.environ.get("HF_ENDPOINT") or os.environ.get("MODEL_ENDPOINT") or "https://huggingface.co"
    return value.rstrip("/")
