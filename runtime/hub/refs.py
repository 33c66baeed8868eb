"""Model identifiers: `owner/repo[:QUANT]`, `hf.co/…`, `huggingface.co/…`, Hub file URLs, `--file`.

Parsing only; whether a text names a local file is decided by `looks_like_path` and the resolver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from urllib.parse import unquote

from ..errors import HubError
from .safe_names import is_relative_path

DEFAULT_REPO = "Diffuspace/Clover-35B-A3B-Preview-GGUF"
DEFAULT_QUANT = "Q4_K_M"
DEFAULT_MODEL = f"{DEFAULT_REPO}:{DEFAULT_QUANT}"

# The Hub's rules for a name: letters, digits, '-', '_', '.'; no '--' or '..'; '-' and '.' not at the ends.
_NAME = r"(?!.*(?:--|\.\.))[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO_RE = re.compile(rf"^{_NAME}/{_NAME}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HOST = r"(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/"
_FILE_URL_RE = re.compile(rf"^{_HOST}(?P<repo>[^/]+/[^/]+)/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<path>[^?#]+)"
                          r"(?:[?#].*)?$", re.IGNORECASE)
_REPO_URL_RE = re.compile(rf"^{_HOST}(?P<body>[^/?#]+/[^/?#]+?)(?:/(?:tree/(?P<rev>[^/?#]+))?/?)?(?:[?#].*)?$",
                          re.IGNORECASE)


@dataclass(frozen=True)
class ModelRef:
    """A model on the Hub: the repository and either a quant tag or an exact file (which wins)."""

    repo: str
    quant: str | None = None
    file: str | None = None
    revision: str | None = None

    @property
    def rev(self) -> str:
        return self.revision or "main"

    def __str__(self) -> str:
        if self.file:
            return f"{self.repo}/{self.file}"
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


def invalid(text: str) -> HubError:
    return HubError(f"invalid model reference '{text}', expected <user>/<model>[:quant]",
                    hint="or a path to a .gguf file, or https://huggingface.co/<user>/<model>/blob/main/<file>.gguf")


def looks_like_path(text: str) -> bool:
    """True for texts meant as local files (`./m.gguf`, `C:\\m.gguf`, `~/m`, `m.gguf`), never for Hub ids."""
    t = text.strip()
    if _FILE_URL_RE.match(t) or t.lower().startswith(("http://", "https://", "hf.co/", "huggingface.co/")):
        return False
    return (t.lower().endswith(".gguf") or t.startswith((".", "/", "~", "\\")) or "\\" in t
            or re.match(r"^[A-Za-z]:[\\/]", t) is not None)


def _check_repo(repo: str, text: str) -> str:
    if not _REPO_RE.match(repo):
        raise invalid(text)
    return repo


def _check_revision(revision: str | None, text: str) -> str | None:
    """A branch, tag or commit from a URL: it names `refs/<revision>` in the cache, so it stays a plain
    relative name (`refs/pr/1` is one, `..%2Fx` is not)."""
    if revision is None:
        return None
    if not is_relative_path(unquote(revision)):
        raise invalid(text)
    return unquote(revision)


def parse_model_ref(text: str | None, file: str | None = None) -> ModelRef:
    """Parse an identifier; no text means the default Clover model. `file` (--file) overrides a tag."""
    if text is None or not text.strip():
        ref = ModelRef(DEFAULT_REPO, DEFAULT_QUANT)
        return replace(ref, quant=None, file=file) if file else ref
    raw = text.strip()
    m = _FILE_URL_RE.match(raw)
    if m:
        return ModelRef(_check_repo(m.group("repo"), raw), None, file or unquote(m.group("path")),
                        _check_revision(m.group("rev"), raw))
    revision = None
    m = _REPO_URL_RE.match(raw)
    if m:
        body, revision = m.group("body"), m.group("rev")
    elif raw.lower().startswith(("http://", "https://")):
        raise invalid(raw)
    else:
        body = raw
    repo, sep, tag = body.rpartition(":")
    if not sep:
        repo, tag = body, ""
    _check_repo(repo, raw)
    if sep and not _TAG_RE.match(tag):
        raise invalid(raw)
    return ModelRef(repo, tag.upper() if tag else None, file, _check_revision(revision, raw))
