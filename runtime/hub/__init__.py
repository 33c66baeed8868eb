"""The Hugging Face Hub side of clover: identifiers, file choice, verified resumable downloads into the
standard cache, remote GGUF headers, and the cache itself (`clover pull`, `list`, `rm`)."""

from .cache import CachedModel, cache_root, find_cached, list_cached, matching, remove
from .header import RemoteModel
from .progress import Reporter, Silent
from .refs import DEFAULT_MODEL, DEFAULT_QUANT, DEFAULT_REPO, ModelRef, looks_like_path, parse_model_ref
from .resolve import Plan, local_path, offline_mode, open_for_inspect, plan, remote_header, resolve_model

__all__ = ["DEFAULT_MODEL", "DEFAULT_QUANT", "DEFAULT_REPO", "CachedModel", "ModelRef", "Plan", "RemoteModel",
           "Reporter", "Silent", "cache_root", "find_cached", "list_cached", "local_path", "looks_like_path",
           "matching", "offline_mode", "open_for_inspect", "parse_model_ref", "plan", "remote_header", "remove",
           "resolve_model"]
