"""Model identifiers: `owner/repo[:QUANT]`, `hf.co/…`, `huggingface.co/…`, file URLs, `--file`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import HubError

DEFAULT_REPO = "Diffuspace/Clover-35B-A3B-Preview-GGUF"
DEFAULT_QUANT = "Q4_K_M"
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_URL_RE = re.compile(r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[^/]+/[^/]+)/(?:blob|resolve)/"
                     r"(?P<rev>[^/]+)/(?P<path>.+\.gguf)(?:\?.*)?$", re.IGNORECASE)
_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "https://hf.co/", "http://hf.co/",
             "huggingface.co/", "hf.co/")


@dataclass(frozen=True)
class ModelRef:
    """A model on the Hub: repository, and either a quant tag or an exact file."""

    repo: str
    quant: str | None = None
    file: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        if self.file:
            return f"{self.repo} --file {self.file}"
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


def invalid(text: str) -> HubError:
    return HubError(f"invalid model reference '{text}', expected <user>/<model>[:quant]",
                    hint="or a path to a .gguf file, or https://huggingface.co/<user>/<model>/blob/main/<file>.gguf")


def parse_model_ref(text: str | None, file: str | None = None) -> ModelRef:
    """Parse an identifier; no text means the default Clover model."""
    if text is None or not text.strip():
        return ModelRef(DEFAULT_REPO, None if file else DEFAULT_QUANT, file)
    raw = text.strip()
    m = _URL_RE.match(raw)
    if m:
        return ModelRef(m.group("repo"), None, m.group("path"), m.group("rev"))
    body = raw
    for prefix in _PREFIXES:
        if body.lower().startswith(prefix):
            body = body[len(prefix):]
            break
    repo, sep, tag = body.rpartition(":") if ":" in body else (body, "", "")
    if not sep:
        repo, tag = body, ""
    if not _REPO_RE.match(repo) or (sep and not re.fullmatch(r"[A-Za-z0-9_.-]+", tag)):
        raise invalid(text)
    return ModelRef(repo, tag.upper() if tag else None, file)
