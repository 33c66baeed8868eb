"""The Hugging Face Hub side: identifiers, file choice, downloads, the cache, remote headers."""

from .cache import CachedModel, list_cached, matching, remove
from .refs import DEFAULT_QUANT, DEFAULT_REPO, ModelRef, parse_model_ref
from .resolve import open_for_inspect, remote_header, resolve_model

__all__ = ["DEFAULT_QUANT", "DEFAULT_REPO", "CachedModel", "ModelRef", "list_cached", "matching", "open_for_inspect",
           "parse_model_ref", "remote_header", "remove", "resolve_model"]
