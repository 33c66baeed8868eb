"""Reading a line at the REPL prompt: line editing and a history kept across sessions.

GNU readline (or libedit on macOS) gives arrow keys, Ctrl-A/E/K/U/W and Ctrl-R wherever Python
ships it; on Windows, where it usually does not, `pyreadline3` provides the same module when it is
installed, and without either the prompt is plain `input()`: typing still works, only editing keys
and history do not. The history is a plain text file in clover's data directory.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

HISTORY_LINES = 1000


def _readline() -> ModuleType | None:
    try:
        import readline
    except ImportError:  # Windows without pyreadline3
        return None
    return readline


def history_path() -> Path:
    """`<data dir>/history`, e.g. ~/.local/share/clover/history."""
    from clover_runtime import paths

    return paths.data_dir() / "history"


class LineReader:
    """`reader(prompt)` reads one line like `input()`; accepted lines go to the history file at once,
    so a crash or a second Ctrl-C loses nothing."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else history_path()
        self.readline = _readline()
        if self.readline is None:
            return
        self.readline.set_history_length(HISTORY_LINES)
        try:
            self.readline.read_history_file(str(self.path))
        except (OSError, UnicodeDecodeError):
            pass  # no history yet, or an unreadable one: start afresh

    @property
    def editing(self) -> bool:
        return self.readline is not None

    def __call__(self, prompt: str) -> str:
        line = input(prompt)
        if self.readline is not None and line.strip():
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if not self.path.exists():
                    self.path.touch()
                self.readline.append_history_file(1, str(self.path))
            except (OSError, AttributeError):  # a read-only home, or a readline without append
                pass
        return line

    def pending(self) -> str | None:
        """What was typed on the line when Ctrl-C came; None when that cannot be known."""
        return self.readline.get_line_buffer() if self.readline is not None else None

    def close(self) -> None:
        """Trim the file to the last HISTORY_LINES lines."""
        if self.readline is None or not self.path.exists():
            return
        try:
            self.readline.write_history_file(str(self.path))
        except OSError:
            pass
