"""Whether files can be deleted now. Windows refuses to delete (or rename) a file another process
holds open without delete sharing, as a running `clover serve` does with the model it maps; POSIX
deletes open files. `clover rm` asks first, so it deletes all of a model or none of it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def locked_files(paths: Iterable[Path]) -> list[Path]:
    """The files among `paths` that cannot be renamed (hence not deleted) now: each is renamed to a
    sibling name and straight back, which succeeds for a file nothing holds. Symlinks and missing
    files are skipped (their targets are what holds the data)."""
    locked: list[Path] = []
    for path in dict.fromkeys(paths):
        if path.is_symlink() or not path.is_file():
            continue
        probe = path.with_name(f"{path.name}.clover-rm-check")
        try:
            os.rename(path, probe)
        except PermissionError:
            locked.append(path)
            continue
        except OSError:
            continue  # not a lock (the probe name exists, a read-only medium): `rm` itself reports those
        os.rename(probe, path)
    return locked
