"""Downloads through `huggingface_hub` into the standard Hugging Face cache (shared with llama.cpp
and other tools): resumable, sha256-verified before a file counts as complete, a free-disk check
first, and a progress bar we draw ourselves (one log line per ~10 % when not on a terminal)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HubError
from ..paths import hf_cache_dir
from . import select
from .refs import ModelRef


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # the LFS oid, when the file is in LFS


def token_from(token: str | None) -> str | None:
    return token or os.environ.get("HF_TOKEN") or None


def _api(token: str | None) -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token_from(token))


def translate(exc: Exception, repo: str, cached: bool = False) -> HubError:
    """One clear line for what the Hub client raised."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return HubError(f"access denied to {repo}: set HF_TOKEN or accept the licence at "
                        f"https://huggingface.co/{repo}")
    if isinstance(exc, RepositoryNotFoundError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403) and token_from(None):
            return HubError(f"access denied to {repo}: set HF_TOKEN or accept the licence at "
                            f"https://huggingface.co/{repo}")
        return HubError(f"repository not found: {repo}",
                        hint="check the name; private or gated repos need HF_TOKEN or --hf-token")
    if isinstance(exc, EntryNotFoundError):
        return HubError(f"file not found in {repo}: {exc}")
    if isinstance(exc, LocalEntryNotFoundError):
        return HubError(f"cannot reach the Hub for {repo} and the file is not cached")
    if isinstance(exc, HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return HubError(f"access denied to {repo}: set HF_TOKEN or accept the licence at "
                            f"https://huggingface.co/{repo}")
        return HubError(f"the Hub answered HTTP {status} for {repo}")
    where = "a cached copy exists (use --offline)" if cached else "no cached copy exists"
    what = f"{exc}" if isinstance(exc, HubUnreachable) else type(exc).__name__
    return HubError(f"cannot reach the Hub ({what}) for {repo}; {where}")


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def reachable(url: str, timeout: float = 3.0) -> bool:
    """A quick TCP connect, so a machine without network learns it in seconds rather than after the
    Hub client's five retries with exponential backoff."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


class HubUnreachable(Exception):
    """The endpoint does not accept connections."""


def list_remote(ref: ModelRef, token: str | None = None) -> tuple[list[RemoteFile], str | None]:
    """Every file of the repository with size and LFS sha256, and the commit listed."""
    if not reachable(endpoint()):
        raise HubUnreachable(endpoint())
    api = _api(token)
    items = api.list_repo_tree(ref.repo, recursive=True, revision=ref.revision)
    files = []
    for it in items:
        size = getattr(it, "size", None)
        if size is None:
            continue
        lfs = getattr(it, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        if sha is None and isinstance(lfs, dict):
            sha = lfs.get("sha256")
        files.append(RemoteFile(it.path, int(size), sha))
    return files, None


def cache_repo_dir(repo: str) -> Path:
    return hf_cache_dir() / f"models--{repo.replace('/', '--')}"


def cached_listing(repo: str, revision: str | None = None) -> tuple[Path | None, list[str]]:
    """(snapshot dir, relative paths) of the cached snapshot `refs/main` (or `revision`) points at."""
    root = cache_repo_dir(repo)
    rev = revision or "main"
    ref_file = root / "refs" / rev
    commit = ref_file.read_text(encoding="utf-8").strip() if ref_file.is_file() else rev
    snap = root / "snapshots" / commit
    if not snap.is_dir():
        return None, []
    return snap, sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def check_disk(files: list[RemoteFile], have: set[str]) -> None:
    """Refuse before downloading when the cache's disk cannot hold what is missing."""
    import psutil

    need = sum(f.size for f in files if f.path not in have)
    root = hf_cache_dir()
    probe = root
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    free = psutil.disk_usage(str(probe)).free
    if need > free:
        raise HubError(f"not enough disk space in {root}: need {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free",
                       hint="free some space, or point CLOVER_CACHE / HF_HUB_CACHE at a bigger disk")


def _blob_progress(repo: str, rf: RemoteFile, report: Callable[[str, int, int], None], stop: threading.Event) -> None:
    """Follow the growing `.incomplete` blob huggingface_hub writes and report its size."""
    blobs = cache_repo_dir(repo) / "blobs"
    while not stop.wait(0.25):
        best = 0
        for p in blobs.glob("*.incomplete") if blobs.is_dir() else []:
            try:
                best = max(best, p.stat().st_size)
            except OSError:
                pass
        report(rf.path, best, rf.size)


def download_files(ref: ModelRef, files: list[RemoteFile], *, token: str | None,
                   report: Callable[[str, int, int], None] | None = None) -> list[Path]:
    """Fetch (or reuse) each file, verifying its sha256 against the Hub's LFS oid."""
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    out = []
    for rf in files:
        stop = threading.Event()
        watcher = None
        if report is not None:
            watcher = threading.Thread(target=_blob_progress, args=(ref.repo, rf, report, stop), daemon=True)
            watcher.start()
        try:
            local = _fetch_with_retries(ref, rf, token)
        finally:
            stop.set()
            if watcher is not None:
                watcher.join()
        if report is not None:
            report(rf.path, rf.size, rf.size)
        verify(local, rf)
        out.append(local)
    return out


def _is_transfer_error(exc: Exception) -> bool:
    names = {t.__name__ for t in type(exc).__mro__}
    return bool(names & {"RemoteProtocolError", "ReadError", "ReadTimeout", "ConnectError", "ConnectionError",
                         "ChunkedEncodingError", "ProtocolError", "TimeoutException", "NetworkError"})


def _fetch_with_retries(ref: ModelRef, rf: RemoteFile, token: str | None, attempts: int = 3) -> Path:
    """hf_hub_download keeps a partial `.incomplete` blob and resumes it with a Range request;
    a cut connection is retried (2 s, then 4 s) before giving up, and a later run resumes too."""
    from huggingface_hub import hf_hub_download

    delay = 2.0
    for attempt in range(1, attempts + 1):
        try:
            return Path(hf_hub_download(ref.repo, rf.path, revision=ref.revision, cache_dir=hf_cache_dir(),
                                        token=token_from(token)))
        except Exception as exc:  # noqa: BLE001 - every Hub failure becomes one line
            if _is_transfer_error(exc) and attempt < attempts:
                time.sleep(delay)
                delay *= 2
                continue
            if _is_transfer_error(exc):
                raise HubError(f"download of {rf.path} was interrupted ({type(exc).__name__}); the part already "
                               "fetched is kept: run the same command again to resume") from None
            raise translate(exc, ref.repo) from None
    raise AssertionError("unreachable")



def verify(local: Path, rf: RemoteFile) -> None:
    """A file counts as complete only when size and sha256 match; a bad blob is removed."""
    size = local.stat().st_size
    bad = size != rf.size
    if not bad and rf.sha256:
        bad = sha256_file(local) != rf.sha256
    if bad:
        blob = local.resolve()
        for p in (local, blob):
            try:
                p.unlink()
            except OSError:
                pass
        raise HubError(f"downloaded file {rf.path} is corrupt (size or sha256 differs from the Hub's); "
                       "it was removed, run the command again")


def pick_files(ref: ModelRef, listing: list[str]) -> tuple[list[str], str]:
    first, why = select.choose(listing, ref.repo, ref.quant, ref.file)
    return select.shards_of(first, listing), why


def wait_poll(seconds: float) -> None:
    time.sleep(seconds)
