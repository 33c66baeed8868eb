"""Replace a file all at once: readers see the old file or the new one, never a part of either.

The data goes to a fresh temporary file in the target's folder (created with O_EXCL, so a name
planted there, a symlink included, is never opened or followed), is flushed to disk, and is then
renamed onto the target. Concurrent writers each finish their own file and the last rename wins.
A failed write (a full disk) removes the temporary file and leaves the previous target intact.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
          | getattr(os, "O_CLOEXEC", 0))
_TRIES = 16


class AtomicFile:
    """The open temporary file: `write` writes every byte (through os.write) and counts them."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(self.fd, view[done:])
        self.size += done
        return done


def temp_name(target: Path) -> Path:
    """A fresh hidden name beside `target` for its temporary file."""
    return target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")


def _create(target: Path, mode: int) -> tuple[int, Path]:
    for _ in range(_TRIES):
        tmp = temp_name(target)
        try:
            return os.open(tmp, _FLAGS, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file beside {target}")


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX; Windows cannot open a folder this way)."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path, mode: int = 0o666) -> Iterator[AtomicFile]:
    """Write `path` through the yielded AtomicFile; it replaces `path` only when the block ends
    without an exception. OSError (a full disk, a read-only folder) propagates after cleanup."""
    path = Path(path)
    fd, tmp = _create(path, mode)
    out = AtomicFile(fd)
    try:
        try:
            yield out
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_folder(path.parent)


def write_bytes(path: Path, data: bytes, mode: int = 0o666) -> int:
    """Replace `path` with `data` atomically; returns the bytes written."""
    with atomic_file(path, mode) as fh:
        fh.write(data)
    return fh.size


def write_text(path: Path, text: str, mode: int = 0o666) -> int:
    """Replace `path` with `text` (UTF-8) atomically; returns the bytes written."""
    return write_bytes(path, text.encode("utf-8"), mode)
