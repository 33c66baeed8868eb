"""What a Hub (or a mirror at HF_ENDPOINT) says that becomes part of a local path: the commit, a blob's
ETag and each file's path in the listing. A mirror must not decide where files are written, so each
value is checked where it enters, before anything touches the disk: a commit is 40 hex digits, an ETag
a hex digest, a path relative with plain segments. The rules are the same on every platform, since a
name harmless on Linux (`..\\x`, `C:x`) escapes on Windows, and one cache can serve both.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import HubError
from .endpoint import endpoint

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_ETAG_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")  # a git sha1 (small files) or the LFS sha256
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def unsafe(repo: str, what: str, value: object) -> HubError:
    """The one line for a mirror that tried to choose a local path."""
    shown = repr(value) if len(repr(value)) <= 120 else repr(value)[:117] + "..."
    return HubError(f"the Hub at {endpoint()} sent an unsafe {what} for {repo}: {shown}; nothing was written",
                    hint="a mirror that sends this is broken or hostile: check HF_ENDPOINT")


def commit(repo: str, value: object) -> str:
    """`value` when it is a full commit id (40 lowercase hex digits), else the HubError."""
    if not isinstance(value, str) or not COMMIT_RE.match(value):
        raise unsafe(repo, "commit", value)
    return value


def etag(repo: str, value: object) -> str:
    """`value` when it is a blob name the Hub uses (a 40- or 64-digit hex digest), else the HubError."""
    if not isinstance(value, str) or not _ETAG_RE.match(value):
        raise unsafe(repo, "etag", value)
    return value


def is_relative_path(value: object) -> bool:
    """A '/'-separated relative path whose segments are plain names: no empty, `.` or `..` segment, no
    backslash, no drive (`C:`), no control character, so that joining it to a folder stays in it."""
    if not isinstance(value, str) or not value or value.startswith("/") or "\\" in value or _CONTROL_RE.search(value):
        return False
    return all(seg not in ("", ".", "..") and not _DRIVE_RE.match(seg) for seg in value.split("/"))


def repo_path(repo: str, value: object) -> str:
    """`value` when it is safe as a path inside a snapshot (`is_relative_path`), else the HubError."""
    if not is_relative_path(value):
        raise unsafe(repo, "file path", value)
    assert isinstance(value, str)
    return value


def inside(folder: Path, relpath: str, repo: str) -> Path:
    """`folder / relpath`, checked to land inside `folder` once links in the folders on the way are
    followed (the entry itself may be a link into `blobs/`, so only its parent is resolved)."""
    target = folder / repo_path(repo, relpath)
    base = folder.resolve()
    parent = target.parent.resolve()
    if parent != base and base not in parent.parents:
        raise unsafe(repo, "file path", relpath)
    return target
