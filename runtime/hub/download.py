"""Downloading files into the Hugging Face cache layout: resumable across runs, verified, disk-checked.

huggingface_hub 2.4's `hf_hub_download` writes each attempt to a process-unique temporary file and
deletes it when the attempt fails, so a download that is killed or cut off starts again from zero in
the next run. Clover therefore keeps its own partial file, `blobs/<etag>.incomplete`, resumes it with
a `Range` request (accepting only a 206 whose Content-Range starts where the file ends; a 200 restarts
from zero, never appends), hashes the bytes as they arrive, and moves the blob to its final name only
when size and sha256 equal the Hub's LFS oid, so a corrupt file never poses as complete. The HTTP
session, headers, error types, lock files and cache layout are huggingface_hub's, so the files are
shared with it and with llama.cpp.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HubError
from . import remote, safe_names
from .cache import cache_root, partial_path, repo_dir
from .progress import Reporter, human

CHUNK = 1 << 20
ATTEMPTS = 3
FIRST_DELAY = 2.0


class Cancelled(Exception):
    """Another shard failed or the user pressed Ctrl-C: stop, keeping what is on disk."""


def partial_size(repo: str, meta: remote.FileMeta) -> int:
    part = partial_path(repo, meta.etag)
    return part.stat().st_size if part.is_file() else 0


def check_disk(need: int) -> None:
    """Refuse before downloading when the cache's disk cannot hold what is still missing."""
    import psutil

    root = cache_root()
    probe = root
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    free = psutil.disk_usage(str(probe)).free
    if need > free:
        raise HubError(f"not enough disk space in {root}: the download needs {human(need)}, {human(free)} is free",
                       hint="free some space, or point CLOVER_CACHE (or HF_HUB_CACHE) at a bigger disk")


def _lock(repo: str, etag: str, note: Callable[[str], None]) -> Any:
    """huggingface_hub's lock for this blob, so two processes never write the same partial file."""
    from huggingface_hub.utils import WeakFileLock

    path = cache_root() / ".locks" / repo_dir(repo).name / f"{etag}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = WeakFileLock(path, timeout=0.5)
    try:
        lock.__enter__()
        return lock
    except Exception as exc:  # noqa: BLE001 - filelock.Timeout, without depending on filelock directly
        if type(exc).__name__ != "Timeout":
            raise
    note(f"waiting for another download of {etag[:12]}… to finish")
    lock = WeakFileLock(path)
    lock.__enter__()
    return lock


def link_into_snapshot(blob: Path, pointer: Path, *, fresh: bool) -> None:
    """Make `pointer` name the blob: a relative symlink where allowed, else a hard link, else the blob
    itself (moved when just downloaded, copied when other snapshots may use it) — the layouts
    huggingface_hub produces on Windows without Developer Mode."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
        return
    except (OSError, NotImplementedError):
        pass
    try:
        os.link(blob, pointer)
        return
    except OSError:
        pass
    if fresh:
        replace_retrying(blob, pointer)
    else:
        shutil.copyfile(blob, pointer)


RENAME_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2)  # about 6 s in all


def replace_retrying(src: Path, dst: Path, delays: tuple[float, ...] = RENAME_DELAYS) -> None:
    """`os.replace`, retried with a short backoff while it fails with PermissionError: on Windows an
    antivirus or the search indexer opens a fresh file for a moment, and a 21 GB download must not
    read as "cache not writable" for that. A lock that outlasts the retries is one line; `src` stays."""
    for delay in (*delays, None):
        try:
            os.replace(src, dst)
            return
        except PermissionError as exc:
            if delay is None:
                raise HubError(f"cannot move {src.name} to {dst}: another program holds it ({exc.strerror})",
                               "the verified download is kept: run the same command again "
                               "(an antivirus scanning the new file lets go within seconds)") from None
            time.sleep(delay)


class _Partial:
    """The growing `.incomplete` file and the sha256 of the bytes in it."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.hasher = hashlib.sha256()
        self.done = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file():
            if path.stat().st_size > size:
                path.unlink()
            else:
                with path.open("rb") as fh:
                    for block in iter(lambda: fh.read(CHUNK * 8), b""):
                        self.hasher.update(block)
                        self.done += len(block)

    def restart(self) -> None:
        self.hasher = hashlib.sha256()
        self.done = 0


def _transfer(meta: remote.FileMeta, part: _Partial, repo: str, token: str | None,
              report: Callable[[int], None], cancel: threading.Event | None) -> None:
    """One GET from where the partial file ends to the end of the file."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    headers = remote.data_headers(meta.url, token)
    if part.done:
        headers["Range"] = f"bytes={part.done}-"
    with get_session().stream("GET", meta.url, headers=headers,
                              timeout=float(constants.HF_HUB_DOWNLOAD_TIMEOUT)) as resp:
        remote.raise_for_status(resp, repo, meta.path)
        if part.done and resp.status_code == 200:
            part.restart()  # the server ignored Range: start over rather than append the wrong bytes
        elif part.done and (resp.status_code != 206
                            or not resp.headers.get("Content-Range", "").startswith(f"bytes {part.done}-")):
            raise HubError(f"the Hub answered the resume request for {meta.path} with HTTP {resp.status_code} "
                           f"({resp.headers.get('Content-Range', 'no Content-Range')}); nothing was appended")
        with part.path.open("r+b" if part.path.exists() else "wb") as fh:
            fh.seek(part.done)
            fh.truncate()
            for chunk in resp.iter_bytes(CHUNK):
                if cancel is not None and cancel.is_set():
                    raise Cancelled
                if part.done + len(chunk) > part.size:
                    raise HubError(f"the Hub sent more than the {part.size:,} bytes of {meta.path}")
                fh.write(chunk)
                part.hasher.update(chunk)
                part.done += len(chunk)
                report(part.done)


def _disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)) or getattr(exc, "winerror", 0) in (39, 112)


def download_blob(repo: str, meta: remote.FileMeta, blob: Path, *, token: str | None,
                  progress: Reporter, cancel: threading.Event | None = None,
                  renew: Callable[[], remote.FileMeta] | None = None) -> None:
    """Fetch one blob (resuming its partial file), verify it, and give it its final name."""
    kept = partial_size(repo, meta)
    if 0 < kept <= meta.size:
        progress.note(f"{meta.path}: resuming after {human(kept)} already downloaded")
    part = _Partial(partial_path(repo, meta.etag), meta.size)
    report = progress.file(meta.path, meta.size, part.done)
    attempt, delay = 1, FIRST_DELAY
    while part.done < meta.size:
        before = part.done
        try:
            _transfer(meta, part, repo, token, report, cancel)
            if part.done < meta.size:
                raise remote.Unreachable(f"connection closed after {part.done:,} of {meta.size:,} bytes")
            continue
        except HubError as exc:
            if renew is None or "HTTP 403" not in exc.message and "access denied" not in exc.message:
                raise
            meta, renew = renew(), None  # a signed CDN URL expired: ask the Hub for a fresh one, once
            continue
        except Exception as exc:  # noqa: BLE001 - cut connections and timeouts are retried below
            if isinstance(exc, OSError) and _disk_full(exc):
                raise HubError(f"disk full while downloading {meta.path} into {cache_root()}: {human(part.done)} "
                               "are kept, free some space and run the same command again to resume") from None
            err = exc if isinstance(exc, (Cancelled, remote.Unreachable)) else remote.translate(exc, repo, meta.path)
            if not isinstance(err, remote.Unreachable):
                raise err from None
        if part.done > before:
            attempt, delay = 1, FIRST_DELAY  # it moved: a fresh set of attempts, as huggingface_hub does
        if attempt >= ATTEMPTS:
            raise HubError(f"download of {meta.path} was interrupted ({err.reason}); {human(part.done)} of "
                           f"{human(meta.size)} are kept: run the same command again to resume")
        progress.note(f"{meta.path}: {err.reason}; retrying in {delay:.0f} s")
        time.sleep(delay)
        attempt, delay = attempt + 1, delay * 2
    part.path.touch(exist_ok=True)  # an empty file has no bytes to write
    _verify(meta, part)
    replace_retrying(part.path, blob)
    progress.note(f"{meta.path}: sha256 verified" if meta.sha256 else f"{meta.path}: size verified (no LFS sha256)")


def _verify(meta: remote.FileMeta, part: _Partial) -> None:
    """Size and sha256 (the LFS oid) must match before the file counts; a bad file is deleted."""
    got = part.hasher.hexdigest()
    size = part.path.stat().st_size if part.path.exists() else 0
    if size == meta.size and (meta.sha256 is None or got == meta.sha256):
        return
    part.path.unlink(missing_ok=True)
    what = f"{size:,} bytes instead of {meta.size:,}" if size != meta.size else \
        f"sha256 {got[:16]}… instead of the Hub's {(meta.sha256 or '')[:16]}…"
    raise HubError(f"downloaded file {meta.path} is corrupt ({what}); it was removed, run the command again")


def fetch(repo: str, meta: remote.FileMeta, *, token: str | None, progress: Reporter,
          cancel: threading.Event | None = None, renew: Callable[[], remote.FileMeta] | None = None) -> Path:
    """The snapshot path of one file, downloading its blob unless the cache already has it."""
    folder = repo_dir(repo)
    pointer = safe_names.inside(folder / "snapshots" / safe_names.commit(repo, meta.commit), meta.path, repo)
    if pointer.is_file():
        return pointer
    blob = folder / "blobs" / safe_names.etag(repo, meta.etag)
    lock = _lock(repo, meta.etag, progress.note)
    try:
        fresh = not blob.is_file()
        if fresh:
            download_blob(repo, meta, blob, token=token, progress=progress, cancel=cancel, renew=renew)
        link_into_snapshot(blob, pointer, fresh=fresh)
    finally:
        lock.__exit__(None, None, None)
    return pointer
