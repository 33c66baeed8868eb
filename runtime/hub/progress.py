"""How the Hub layer reports what it is doing without printing anything itself: a `Reporter` gets the
log lines, the warnings and each file's bytes as they arrive, and the caller decides how to show them
(`clover_cli.hub_progress` draws bars on a terminal, log lines elsewhere). `Silent` drops everything."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Reporter(Protocol):
    """What a download tells its caller; `file` may be called from several threads at once."""

    def note(self, text: str) -> None:
        """A log line (what is downloaded, a resume, a retry, a verified checksum)."""

    def warn(self, text: str) -> None:
        """Something the user should know that does not stop the command (a cached copy used instead)."""

    def file(self, path: str, total: int, done: int = 0) -> Callable[[int], None]:
        """A file starts; the returned callback takes the bytes now on disk."""
        ...


class Silent:
    """The reporter of library calls that asked for none: nothing is shown."""

    def note(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass

    def file(self, path: str, total: int, done: int = 0) -> Callable[[int], None]:
        return lambda n: None


def human(n: float) -> str:
    """Bytes the way download logs say them (1.5 GB)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
