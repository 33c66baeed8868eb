"""Talking to the Hub (or a mirror at HF_ENDPOINT) through huggingface_hub's HTTP session, headers and
error types: the file listing, one file's metadata, byte ranges, and a GGUF header read with range
requests. Every failure becomes one HubError line, except "cannot connect at all" (`Unreachable`),
which the resolver turns into a cache fallback or a message saying whether a cached copy exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ..errors import HubError
from . import safe_names
from .endpoint import endpoint
from .refs import ModelRef


def list_timeout() -> float:
    """Seconds to wait for the Hub's answer to a listing or metadata request: huggingface_hub's own
    HF_HUB_ETAG_TIMEOUT (default 10 s), so a Hub that accepts and never answers fails within seconds."""
    from huggingface_hub import constants

    return float(constants.HF_HUB_ETAG_TIMEOUT)


@dataclass(frozen=True)
class RemoteFile:
    """A file in the repository listing; `sha256` is its LFS oid (None for small files kept in git)."""

    path: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class FileMeta:
    """What a HEAD on `resolve` says about one file: where its bytes are and which blob they make."""

    path: str
    url: str
    etag: str
    commit: str
    size: int
    sha256: str | None


class Unreachable(Exception):
    """The endpoint could not be reached (no network, DNS failure, refused, timed out)."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("clover-cli")
    except PackageNotFoundError:
        return "dev"


def auth_headers(token: str | None) -> dict[str, str]:
    """huggingface_hub's headers (user agent `clover/<version>`); `token` None means HF_TOKEN or the
    stored login, as the Hub client does."""
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers(token=token or None, library_name="clover", library_version=_version())


def denied(repo: str, gated: bool) -> HubError:
    hint = ("accept the conditions on the model page, then use a token of that account"
            if gated else "the Hub answers 401 for private repositories and for names that do not exist: "
                          "check the spelling, or pass a token")
    return HubError(f"access denied to {repo}: set HF_TOKEN or accept the licence at {endpoint()}/{repo}", hint,
                    needs="token")


def _is_network_error(exc: BaseException) -> bool:
    names = {t.__name__ for t in type(exc).__mro__}
    return bool(names & {"ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError", "ProxyError",
                         "OfflineModeIsEnabled", "ConnectionError", "RemoteProtocolError", "ReadError"})


def translate(exc: BaseException, repo: str, path: str | None = None) -> Exception:
    """One clear line for what the Hub client raised (or `Unreachable` for connection failures)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError) or status in (401, 403):
        return denied(repo, gated=isinstance(exc, GatedRepoError))
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(f"repository not found: {repo}",
                        hint="check the name; private repos need a token", needs="token")
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"revision not found in {repo}: {exc.args[0].splitlines()[-1] if exc.args else ''}")
    if isinstance(exc, EntryNotFoundError):
        return HubError(f"file not found in {repo}: {path or '?'}")
    if isinstance(exc, HfHubHTTPError):
        later = " (try again later)" if status and status >= 500 else ""
        return HubError(f"the Hub answered HTTP {status} for {repo}{path and '/' + path or ''}{later}")
    if _is_network_error(exc):
        if "Timeout" in type(exc).__name__:
            return Unreachable(f"no answer within {list_timeout():g} s", timed_out=True)
        return Unreachable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    return exc


def _get(url: str, token: str | None, params: dict[str, str] | None = None) -> Any:
    from huggingface_hub.utils import get_session

    last: BaseException | None = None
    for _ in range(2):  # one retry when the connection timed out; an accepted but unanswered request or a
        # refused connection fails at once (offline users wait 0 s, a hanging Hub costs one timeout)
        try:
            return get_session().get(url, params=params, headers=auth_headers(token), timeout=list_timeout())
        except Exception as exc:  # noqa: BLE001 - classified below
            last = exc
            if type(exc).__name__ != "ConnectTimeout":
                break
    assert last is not None
    raise last


def list_files(ref: ModelRef, token: str | None = None) -> list[RemoteFile]:
    """Every file of the repository at `ref.rev`, with size and LFS sha256, following pagination."""
    from huggingface_hub.utils import hf_raise_for_status

    url: str | None = f"{endpoint()}/api/models/{ref.repo}/tree/{quote(ref.rev, safe='')}"
    params: dict[str, str] | None = {"recursive": "true"}
    out: list[RemoteFile] = []
    try:
        while url:
            resp = _get(url, token, params)
            hf_raise_for_status(resp)
            for item in resp.json():
                if item.get("type") != "file":
                    continue
                lfs = item.get("lfs") or {}
                out.append(RemoteFile(item.get("path"), int(lfs.get("size", item.get("size", 0))), lfs.get("oid")))
            url, params = resp.links.get("next", {}).get("url"), None
    except Exception as exc:  # noqa: BLE001 - every Hub failure becomes one line
        raise translate(exc, ref.repo) from None
    for rf in out:  # every path, not only the chosen file's: a listing that lies about one is not trusted
        safe_names.repo_path(ref.repo, rf.path)
    return out


def file_meta(ref: ModelRef, rf: RemoteFile, token: str | None = None, revision: str | None = None) -> FileMeta:
    """HEAD `resolve/<rev>/<path>`: the commit, the blob's etag and the (CDN) URL of the bytes."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(ref.repo, rf.path, revision=revision or ref.rev, endpoint=endpoint())
    try:
        meta = get_hf_file_metadata(url, token=token or None, endpoint=endpoint())
    except Exception as exc:  # noqa: BLE001
        raise translate(exc, ref.repo, rf.path) from None
    if not meta.etag or not meta.commit_hash:
        raise HubError(f"the Hub did not describe {ref.repo}/{rf.path} (no ETag or X-Repo-Commit header)")
    safe_names.commit(ref.repo, meta.commit_hash)
    safe_names.etag(ref.repo, meta.etag)
    size = meta.size if meta.size is not None else rf.size
    if size != rf.size:
        raise HubError(f"{ref.repo}/{rf.path}: the listing says {rf.size:,} bytes but the file has {size:,}; "
                       "the repository changed while we looked, run the command again")
    return FileMeta(rf.path, meta.location, meta.etag, meta.commit_hash, size, rf.sha256)


def data_headers(url: str, token: str | None) -> dict[str, str]:
    """Headers for fetching file bytes: the token only goes to the Hub itself, never to a CDN host
    (its signed URL needs none), as huggingface_hub does for its metadata requests."""
    from urllib.parse import urlsplit

    headers = auth_headers(token)
    here, there = urlsplit(endpoint()), urlsplit(url)
    if (here.scheme, here.hostname, here.port) != (there.scheme, there.hostname, there.port):
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    headers["Accept-Encoding"] = "identity"
    return headers


def raise_for_status(resp: Any, repo: str, path: str) -> None:
    """huggingface_hub's error mapping for a streamed response (its body is read first when small)."""
    from huggingface_hub.utils import hf_raise_for_status

    if resp.status_code >= 400:
        try:
            resp.read()
        except Exception:  # noqa: BLE001 - the status alone is enough
            pass
        try:
            hf_raise_for_status(resp)
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, repo, path) from None
