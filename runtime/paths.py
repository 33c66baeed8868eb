"""Per-user directories for clover's own files, following each platform's conventions.

The model cache is the Hugging Face cache (see `clover_runtime.hub`); these are clover's other files:
compiled-kernel cache, parsed model headers (`clover_runtime.file_cache`), background-server state
and logs. `CLOVER_HOME` puts them all in one place.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP = "clover"


def _home_override() -> Path | None:
    value = os.environ.get("CLOVER_HOME")
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Disposable files (the numba kernel cache, parsed model headers)."""
    if (home := _home_override()) is not None:
        return home / "cache"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / APP / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / APP
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / APP


def data_dir() -> Path:
    """Files that must survive (background-server state)."""
    if (home := _home_override()) is not None:
        return home / "data"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / APP
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / APP
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / APP


def log_dir() -> Path:
    """Logs of background servers."""
    if (home := _home_override()) is not None:
        return home / "logs"
    if sys.platform == "win32":
        return data_dir() / "Logs"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Logs" / APP
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / APP / "logs"


def numba_cache_dir() -> Path:
    """Where compiled kernels are cached so only the first run compiles."""
    return cache_dir() / "numba"


def hf_cache_dir() -> Path:
    """The model cache: CLOVER_CACHE, HF_HUB_CACHE, HF_HOME/hub, then the Hugging Face default.

    Models land in the standard Hugging Face layout so llama.cpp and other tools share them.
    """
    for var in ("CLOVER_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "huggingface" / "hub"
