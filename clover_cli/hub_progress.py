"""How the CLI shows the Hub layer's reports (`clover_runtime.hub.Reporter`) on stderr: a rich bar per
file on a terminal (name, bar, %, bytes, rate, ETA), one log line per ~10 % elsewhere so logs stay
short and still show movement. Colour follows `--no-color` and NO_COLOR like every other line."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rich.text import Text

from .console import err, safe

NAME_WIDTH = 40


def short_name(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def _eta(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class HubProgress:
    """A Reporter for the length of a `with` block; the bars start with the first file, so lines
    printed before (the fit check) are not drawn over, and stop when the block ends."""

    def __init__(self) -> None:
        self.console = err()
        self.tty = self.console.is_terminal
        self._bar: Any = None
        self._lock = threading.Lock()

    def __enter__(self) -> HubProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None

    def note(self, text: str) -> None:
        self.console.print(safe(text), markup=False, highlight=False, emoji=False, soft_wrap=True)

    def warn(self, text: str) -> None:
        self.console.print(Text.assemble(("warning: ", "yellow"), safe(text)), highlight=False, soft_wrap=True)

    def _bars(self) -> Any:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        with self._lock:
            if self._bar is None:
                self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                     DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                     console=self.console, transient=False)
                self._bar.start()
            return self._bar

    def file(self, path: str, total: int, done: int = 0) -> Callable[[int], None]:
        name = short_name(safe(path))
        if self.tty:
            bar = self._bars()
            task = bar.add_task(name, total=total, completed=done)
            return lambda n: bar.update(task, completed=n)
        from clover_runtime.hub.progress import human

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
