"""Download progress on stderr: a rich bar per file on a terminal (name, bar, %, bytes, rate, ETA);
when stderr is not a terminal, one log line per ~10 % so logs stay short and still show movement."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

NAME_WIDTH = 40


def human(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def short_name(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def _eta(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """Use as a context manager; `file()` returns the callback a download reports its bytes to."""

    def __init__(self, enabled: bool = True) -> None:
        from rich.console import Console

        self.enabled = enabled
        self.console = Console(file=sys.stderr, highlight=False, soft_wrap=True)
        self.tty = self.console.is_terminal
        self._bar: Any = None
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        if self.enabled and self.tty:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                     DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                     console=self.console, transient=False)
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def note(self, text: str) -> None:
        """A log line (above the bars while they are drawn)."""
        if self.enabled:
            self.console.print(text, markup=False, highlight=False)

    def file(self, path: str, total: int, done: int = 0) -> Callable[[int], None]:
        """Start showing one file; the returned callback takes the bytes now on disk."""
        if not self.enabled:
            return lambda n: None
        name = short_name(path)
        if self._bar is not None:
            task = self._bar.add_task(name, total=total, completed=done)
            return lambda n: self._bar.update(task, completed=n) if self._bar is not None else None
        self.note(f"downloading {name} ({human(total)})")
        start, first = time.monotonic(), done
        state = {"step": done * 10 // total if total else 10}

        def report(n: int) -> None:
            step = n * 10 // total if total else 10
            with self._lock:
                if step <= state["step"]:
                    return
                state["step"] = step
            elapsed = max(time.monotonic() - start, 1e-6)
            rate = (n - first) / elapsed
            eta = f", ETA {_eta((total - n) / rate)}" if rate > 0 and n < total else ""
            self.note(f"{name}: {step * 10}% ({human(n)} of {human(total)}, {human(rate)}/s{eta})")

        return report
