"""Download progress on stderr: a rich bar per file on a terminal (bytes, rate, ETA), one log line
per ~10 % otherwise."""

from __future__ import annotations

import sys
import threading
from typing import Any


def warn(message: str) -> None:
    from rich.console import Console

    Console(file=sys.stderr).print(f"[yellow]warning:[/] {message}")


class Progress:
    def __init__(self, *, enabled: bool = True, note: str = "") -> None:
        from rich.console import Console

        self.enabled = enabled
        self.note = note
        self.con = Console(file=sys.stderr)
        self.tty = self.con.is_terminal
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}
        self._logged: dict[str, int] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        if not self.enabled:
            return self
        if self.note:
            self.con.print(self.note, markup=False, highlight=False)
        if self.tty:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.percentage:>3.0f}%"), DownloadColumn(), TransferSpeedColumn(),
                                     TimeRemainingColumn(), console=self.con)
            self._bar.start()
        return self

    def report(self, name: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        short = name.rsplit("/", 1)[-1]
        short = short if len(short) <= 40 else short[:39] + "…"
        with self._lock:
            if self._bar is not None:
                task = self._tasks.get(name)
                if task is None:
                    task = self._tasks[name] = self._bar.add_task(short, total=total)
                self._bar.update(task, completed=done)
                return
            pct = int(done * 100 / total) if total else 100
            step = pct // 10 * 10
            if step > self._logged.get(name, -1):
                self._logged[name] = step
                self.con.print(f"{short}: {step}% ({done:,} / {total:,} bytes)", markup=False, highlight=False)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
