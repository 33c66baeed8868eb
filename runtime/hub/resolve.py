"""From what a user typed to a local GGUF path: a local file as is, a cached model (also offline),
or a download; plus reading a remote header with range requests, so `inspect` and the fit check
work before 21 GB are fetched."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HubError
from . import download
from .refs import ModelRef, parse_model_ref


def offline_mode(offline: bool) -> bool:
    return offline or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or \
        os.environ.get("CLOVER_OFFLINE", "").lower() in ("1", "true", "yes")


def _from_cache(ref: ModelRef) -> Path | None:
    snap, listing = download.cached_listing(ref.repo, ref.revision)
    if snap is None:
        return None
    try:
        shards, _ = download.pick_files(ref, listing)
    except HubError:
        return None
    if all((snap / s).is_file() for s in shards):
        return snap / shards[0]
    return None


def _offline_error(ref: ModelRef) -> HubError:
    snap, listing = download.cached_listing(ref.repo, ref.revision)
    want = ref.file or (f"{ref.quant} file" if ref.quant else "a GGUF file")
    return HubError(f"required file is not available in cache (offline mode): {ref.repo}/{want}")


def resolve_model(text: str | None, *, file: str | None = None, offline: bool = False, token: str | None = None,
                  download_missing: bool = True, progress: bool = True,
                  before_download: Callable[[ModelRef, list[download.RemoteFile]], None] | None = None) -> Path:
    """The local path of the model's first shard, downloading what is missing."""
    if text and Path(text).expanduser().exists():
        return Path(text).expanduser()
    ref = parse_model_ref(text, file)
    if offline_mode(offline):
        cached = _from_cache(ref)
        if cached is None:
            raise _offline_error(ref)
        return cached
    try:
        files, _ = download.list_remote(ref, token)
    except Exception as exc:  # noqa: BLE001 - network or Hub failure: fall back to the cache when we can
        cached = _from_cache(ref)
        err = exc if isinstance(exc, HubError) else download.translate(exc, ref.repo, cached is not None)
        if cached is not None and "not found" not in err.message and "access denied" not in err.message:
            from .progress import warn

            warn(f"{err.message}; using the cached copy")
            return cached
        raise err from None
    by_path = {f.path: f for f in files}
    shards, why = download.pick_files(ref, list(by_path))
    wanted = [by_path[s] for s in shards]
    snap, have_list = download.cached_listing(ref.repo, ref.revision)
    have = {p for p in have_list if snap is not None and (snap / p).is_file()
            and (snap / p).stat().st_size == by_path.get(p, download.RemoteFile(p, -1, None)).size}
    missing = [f for f in wanted if f.path not in have]
    if not missing and snap is not None:
        return snap / shards[0]
    if not download_missing:
        raise HubError(f"{ref} is not downloaded yet", hint=f"clover pull {ref}")
    download.check_disk(wanted, have)
    if before_download is not None:
        before_download(ref, wanted)
    from .progress import Progress

    with Progress(enabled=progress, note=f"{ref.repo}: {why}") as bar:
        paths = download.download_files(ref, wanted, token=token, report=bar.report)
    return paths[0]


class RemoteHeader:
    """A GGUF header read over HTTP: enough for `inspect` and the memory fit."""

    def __init__(self, header: Any, name: str, size: int, bytes_read: int) -> None:
        self.header = header
        self.metadata = header.metadata
        self.value_types = header.value_types
        self.version = header.version
        self.tensors = {t.name: t for t in header.tensors}
        self.paths = [Path(name)]
        self.file_size = size
        self.bytes_read = bytes_read

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())

    def close(self) -> None:
        """Nothing is mapped; present so callers can treat it like an opened file."""


def remote_header(text: str | ModelRef, *, token: str | None = None, start: int = 1 << 20) -> RemoteHeader:
    """Read the chosen file's header with range requests, growing the window until it parses."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import get_session

    from ..gguf_file import HeaderTruncated, parse_header

    ref = text if isinstance(text, ModelRef) else parse_model_ref(text)
    try:
        files, _ = download.list_remote(ref, token)
    except Exception as exc:  # noqa: BLE001
        raise download.translate(exc, ref.repo) from None
    by_path = {f.path: f for f in files}
    shards, _ = download.pick_files(ref, list(by_path))
    rf = by_path[shards[0]]
    url = hf_hub_url(ref.repo, rf.path, revision=ref.revision, endpoint=os.environ.get("HF_ENDPOINT") or None)
    headers = {}
    tok = download.token_from(token)
    if tok:
        headers["authorization"] = f"Bearer {tok}"
    session = get_session()
    want = min(start, rf.size)
    buf = b""
    while True:
        if want > len(buf):
            headers["Range"] = f"bytes={len(buf)}-{want - 1}"
            try:
                resp = session.get(url, headers=headers, follow_redirects=True)
            except Exception as exc:  # noqa: BLE001 - a network failure is one line
                raise HubError(f"cannot read the header of {rf.path} from the Hub ({type(exc).__name__})") from None
            if resp.status_code not in (200, 206):
                raise HubError(f"the Hub answered HTTP {resp.status_code} reading the header of {rf.path}")
            chunk = resp.content
            buf = chunk if resp.status_code == 200 else buf + chunk
        try:
            header = parse_header(buf, file_size=rf.size, name=rf.path.rsplit("/", 1)[-1])
            return RemoteHeader(header, rf.path, rf.size, len(buf))
        except HeaderTruncated as need:
            if len(buf) >= rf.size:
                raise HubError(f"{rf.path}: truncated file (ends inside the GGUF header)") from None
            want = min(rf.size, max(need.needed + (1 << 16), len(buf) * 2))


def open_for_inspect(text: str) -> Any:
    """What `clover inspect` shows for a Hub id: the cached file, else the remote header."""
    from ..gguf_file import open_gguf

    ref = parse_model_ref(text)
    cached = _from_cache(ref)
    if cached is not None:
        return open_gguf(cached)
    if offline_mode(False):
        raise _offline_error(ref)
    got = remote_header(ref)
    print(f"read the header remotely ({got.bytes_read:,} of {got.file_size:,} bytes)", file=sys.stderr)
    return got
