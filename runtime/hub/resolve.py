"""From what a user typed to a local GGUF path, the one place that decides it: a local file as is, a
cached model (no network needed, also offline), or a download; and `open_for_inspect`, which reads the
header of a model that is not cached over HTTP instead of downloading it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..demo import demo_path, is_demo
from ..errors import HubError, ModelFileError
from . import download as dl
from . import remote, select
from .cache import cache_root, find_cached, repo_dir, write_ref
from .endpoint import endpoint
from .header import RemoteModel, read_model
from .progress import Reporter, Silent, human
from .refs import ModelRef, looks_like_path, parse_model_ref

MAX_PARALLEL = 4
_TRUE = ("1", "true", "yes", "on")


def offline_mode(offline: bool = False) -> bool:
    """--offline, HF_HUB_OFFLINE=1 or CLOVER_OFFLINE=1: the cache only, no network at all."""
    return offline or any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "CLOVER_OFFLINE"))


@dataclass
class Plan:
    """What a model is on the Hub right now: the chosen files, their metadata and what is missing."""

    ref: ModelRef
    note: str
    files: list[remote.RemoteFile]
    metas: list[remote.FileMeta]

    @property
    def commit(self) -> str:
        return self.metas[0].commit

    def missing(self) -> list[remote.FileMeta]:
        folder = repo_dir(self.ref.repo)
        return [m for m in self.metas if not (folder / "snapshots" / m.commit / m.path).is_file()
                and not (folder / "blobs" / m.etag).is_file()]

    def missing_bytes(self) -> int:
        return sum(m.size - dl.partial_size(self.ref.repo, m) for m in self.missing())


def local_path(text: str | Path) -> Path | None:
    """The file a user named, when the text is one: `demo` the bundled demo model, an existing file as
    is, `ModelFileError` when the text looks like a path (`./m.gguf`, `m.gguf`, `C:\\m`) but nothing
    is there, None for a Hub id."""
    if is_demo(text):
        return demo_path()
    path = Path(text).expanduser()
    if isinstance(text, Path) or looks_like_path(text):
        if path.exists():
            return path
        raise ModelFileError(f"model file not found: {text}")
    return path if text.strip() and path.is_file() else None


def is_prompt_not_model(text: str) -> bool:
    """A MODEL argument that can only be a prompt typed first (`clover run "What is 2 + 2?"`): words
    with spaces, or one word that is neither demo, a file, a path nor owner/repo."""
    t = text.strip()
    if is_demo(t) or Path(text).exists() or looks_like_path(t):
        return False
    return not t or any(c.isspace() for c in t) or "/" not in t


def _as_ref(ref_or_text: str | ModelRef | None, file: str | None) -> ModelRef:
    if isinstance(ref_or_text, ModelRef):
        return ModelRef(ref_or_text.repo, None, file, ref_or_text.revision) if file else ref_or_text
    return parse_model_ref(ref_or_text, file)


class NotCached(HubError):
    """The model is not in the cache and was not fetched: `why` is "offline", "unreachable" (the Hub
    cannot be reached) or "not_downloaded" (a caller that never downloads). The facts a front end
    words into advice (`clover pull`, the demo)."""

    def __init__(self, message: str, ref: ModelRef, why: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.ref, self.why = ref, why


def offline_miss(ref: ModelRef) -> HubError:
    return NotCached(f"required file is not available in cache (offline mode): {ref}", ref, "offline",
                     hint=f"the cache is {cache_root()}")


def unreachable(ref: ModelRef, reason: str, timed_out: bool = False) -> HubError:
    hint = "check the network connection, proxy settings or HF_ENDPOINT"
    if timed_out:
        hint += "; on a slow link wait longer with HF_HUB_ETAG_TIMEOUT=60"
    return NotCached(f"cannot reach the Hub at {endpoint()} ({reason}); no cached copy of {ref} exists", ref,
                     "unreachable", hint=hint)


def plan(ref: ModelRef, token: str | None = None) -> Plan:
    """List the repository, choose the file (all shards of a split set) and HEAD each one."""
    files = remote.list_files(ref, token)
    by_path = {f.path: f for f in files}
    first, note = select.choose([f.path for f in files], ref.repo, ref.quant, ref.file)
    chosen = [by_path[p] for p in select.shards_of(first, list(by_path))]
    metas = [remote.file_meta(ref, chosen[0], token)]
    metas += [remote.file_meta(ref, rf, token, revision=metas[0].commit) for rf in chosen[1:]]
    return Plan(ref, note, chosen, metas)


def _fetch_all(p: Plan, token: str | None, bar: Reporter) -> list[Path]:
    """Every shard, up to MAX_PARALLEL at once; the first failure stops the others (keeping their bytes)."""
    cancel = threading.Event()

    def one(i: int) -> Path:
        def renew() -> remote.FileMeta:
            return remote.file_meta(p.ref, p.files[i], token, revision=p.commit)

        return dl.fetch(p.ref.repo, p.metas[i], token=token, progress=bar, cancel=cancel, renew=renew)

    if len(p.metas) == 1:
        return [one(0)]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(p.metas))) as pool:
        futures = [pool.submit(one, i) for i in range(len(p.metas))]
        try:
            while True:
                done, pending = wait(futures, timeout=0.5, return_when=FIRST_EXCEPTION)
                if not pending or any(f.exception() for f in done):
                    break
        except BaseException:
            cancel.set()
            raise
        cancel.set()
    errors = [f.exception() for f in futures if f.exception() is not None]
    real = [e for e in errors if not isinstance(e, dl.Cancelled)]
    if errors:
        raise (real or errors)[0]
    return [f.result() for f in futures]


def download_plan(p: Plan, *, token: str | None = None, reporter: Reporter | None = None) -> Path:
    """Fetch what is missing of a plan (checking the disk first) and return the first shard's path."""
    dl.check_disk(p.missing_bytes())
    bar = reporter or Silent()
    try:
        if p.missing():
            bar.note(f"{p.ref.repo}: {p.note} ({human(sum(m.size for m in p.metas))})")
        paths = _fetch_all(p, token, bar)
        write_ref(p.ref.repo, p.ref.rev, p.commit)
    except PermissionError as exc:
        raise HubError(f"cannot write to the model cache {cache_root()}: {exc.strerror or exc}",
                       hint="point CLOVER_CACHE (or HF_HUB_CACHE) at a folder you can write to") from None
    return paths[0]


def resolve_model(ref_or_text: str | Path | ModelRef | None = None, *, file: str | None = None, offline: bool = False,
                  token: str | None = None, download: bool = True, reporter: Reporter | None = None,
                  refresh: bool = False, before_download: Callable[[Plan], None] | None = None) -> Path:
    """The local path of the model's first shard: the one resolver behind run, serve, bench, pull,
    doctor and `load_model`.

    A local path is returned as is (`local_path`); None is the default Clover model. A Hub identifier
    is looked up in the cache first (no network). Without `download` that is all: a model not in the
    cache is an error and the network is never touched. `refresh` (what `clover pull` does) asks the
    Hub for the current files; what is missing is downloaded. `before_download(plan)` runs before any
    byte is fetched (the memory-fit check). Progress and warnings go to `reporter` (none: silent).
    """
    if isinstance(ref_or_text, (str, Path)):
        local = local_path(ref_or_text)
        if local is not None:
            return local
    ref = _as_ref(ref_or_text, file)
    if offline_mode(offline):
        cached = find_cached(ref)
        if cached is None:
            raise offline_miss(ref)
        return cached
    if not refresh or not download:
        cached = find_cached(ref)
        if cached is not None:
            return cached
        if not download:
            raise NotCached(f"{ref} is not downloaded yet", ref, "not_downloaded")
    bar = reporter or Silent()
    try:
        p = plan(ref, token)
    except remote.Unreachable as exc:
        cached = find_cached(ref)
        if cached is None:
            raise unreachable(ref, exc.reason, exc.timed_out) from None
        bar.warn(f"cannot reach the Hub at {endpoint()} ({exc.reason}); using the cached copy {cached}")
        return cached
    except select.Ambiguous:
        raise
    except HubError as exc:
        cached = find_cached(ref) if refresh else None
        if cached is None:
            raise
        bar.warn(f"{exc.message}; using the cached copy {cached}")
        return cached
    if p.missing() and before_download is not None:
        before_download(p)
    return download_plan(p, token=token, reporter=bar)


def remote_header(ref_or_text: str | ModelRef | Plan, *, file: str | None = None,
                  token: str | None = None) -> RemoteModel:
    """The chosen model's headers (every shard) read with HTTP range requests, no tensor data."""
    if isinstance(ref_or_text, Plan):
        p = ref_or_text
    else:
        ref = _as_ref(ref_or_text, file)
        try:
            p = plan(ref, token)
        except remote.Unreachable as exc:
            raise unreachable(ref, exc.reason, exc.timed_out) from None
    return read_model(p.ref.repo, p.metas, token)


def open_for_inspect(text: str, *, token: str | None = None) -> Any:
    """What `clover inspect` shows: a local file or the cached one when there is one, else the header
    read remotely (a few MB of a many-GB file; a `RemoteModel`, whose `bytes_read` says how much), so
    the summary and fit table come before any download."""
    from ..gguf_file import open_gguf

    local = local_path(text)
    if local is not None:
        return open_gguf(local)
    ref = parse_model_ref(text)
    cached = find_cached(ref)
    if cached is not None:
        return open_gguf(cached)
    if offline_mode():
        raise offline_miss(ref)
    return remote_header(ref, token=token)
