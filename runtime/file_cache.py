"""A cache on disk of what clover derives from a model file, so the next start can skip the work.

Parsing the header of a file with a real 248k-token vocabulary costs about half a second on every
start, and the result depends only on the file. Entries live under the user cache directory
(`cache_dir()/files`, so CLOVER_HOME moves them), one per file path and kind, and record the
file's resolved path, size and modification time: a file that changed, moved or was replaced
never reuses an entry. Every problem with the cache (a missing, stale, truncated or corrupt
entry, an unwritable directory) only means the work is done again: `load` returns None and
`store` does nothing. Writes go to a temporary file renamed into place, so readers never see
half an entry, and only the most recently used entries are kept.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from .paths import cache_dir

FORMAT = 1
MAX_ENTRIES = 16  # a real-vocabulary header is ~8 MB, so at most ~130 MB
_MAGIC = b"CLOVER-FILE-CACHE\n"
_FIXED = struct.Struct("<IQQII")  # format, file size, file mtime_ns, path length, payload crc32
_STALE_TEMP_S = 3600


@dataclass(frozen=True)
class FileKey:
    """What identifies one version of a file: its resolved path, size and modification time."""

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileKey | None:
        """The key of `path` now; None when it cannot be resolved or read."""
        try:
            resolved = path.resolve()
            st = resolved.stat()
        except (OSError, RuntimeError):
            return None
        return cls(str(resolved), st.st_size, st.st_mtime_ns)


def cache_root() -> Path:
    """The directory of the per-file cache."""
    return cache_dir() / "files"


def _entry_path(key: FileKey, kind: str) -> Path:
    digest = hashlib.sha256(key.path.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return cache_root() / f"{digest}.{kind}"


def _prefix(key: FileKey, payload: bytes) -> bytes:
    path = key.path.encode("utf-8", "surrogatepass")
    fixed = _FIXED.pack(FORMAT, key.size, key.mtime_ns, len(path), zlib.crc32(payload))
    return _MAGIC + fixed + path


def load(key: FileKey, kind: str) -> bytes | None:
    """The payload stored for this version of the file, or None (no entry, stale, damaged)."""
    entry = _entry_path(key, kind)
    try:
        data = entry.read_bytes()
    except OSError:
        return None
    path = key.path.encode("utf-8", "surrogatepass")
    start = len(_MAGIC) + _FIXED.size + len(path)
    if len(data) < start or not data.startswith(_MAGIC):
        return None
    fmt, size, mtime_ns, path_len, crc = _FIXED.unpack_from(data, len(_MAGIC))
    if (fmt, size, mtime_ns, path_len) != (FORMAT, key.size, key.mtime_ns, len(path)):
        return None
    if data[len(_MAGIC) + _FIXED.size:start] != path:
        return None
    payload = data[start:]
    if zlib.crc32(payload) != crc:
        return None
    try:
        os.utime(entry)  # most recently used: kept longest by `_prune`
    except OSError:
        pass
    return payload


def store(key: FileKey, kind: str, payload: bytes) -> None:
    """Keep `payload` for this version of the file (replacing any older entry for its path)."""
    entry = _entry_path(key, kind)
    tmp: str | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=f".{kind}")
        with os.fdopen(fd, "wb") as fh:
            fh.write(_prefix(key, payload))
            fh.write(payload)
        os.replace(tmp, entry)
        tmp = None
        _prune(entry.parent)
    except OSError:
        pass  # a read-only or full cache directory only means no cache
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _prune(folder: Path) -> None:
    """Keep the MAX_ENTRIES most recently used entries; drop temporary files left by a crash."""
    entries: list[tuple[float, Path]] = []
    now = time.time()
    for p in folder.iterdir():
        try:
            mtime = p.stat().st_mtime
        except OSError:
            continue
        if p.name.startswith(".tmp-"):
            if now - mtime > _STALE_TEMP_S:
                p.unlink(missing_ok=True)
        else:
            entries.append((mtime, p))
    entries.sort(reverse=True)
    for _, p in entries[MAX_ENTRIES:]:
        p.unlink(missing_ok=True)
