"""Driving `clover run` as a terminal user does: one environment (a private home, no colour, a fixed
width) for subprocess and pseudo-terminal runs, a spawn that starts it as a shell would, and the
screen a terminal emulator (pyte) shows for the raw output."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pexpect

COLS, ROWS = 100, 40


def terminal_env(home: Path) -> dict[str, str]:
    """The environment of a user with `home` as their home: no colour, COLS columns, UTF-8 pipes."""
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "NO_COLOR": "1",
           "PYTHONIOENCODING": "utf-8", "COLUMNS": str(COLS), "TERM": "xterm"}
    for var in ("CLOVER_DEBUG", "CLOVER_HOME"):
        env.pop(var, None)
    return env


def _as_a_terminal_starts_it() -> None:
    """A shell starts a foreground program with SIGINT at its default and unblocked; a test worker may
    have it ignored or blocked (both survive exec), and then Ctrl-C at the prompt would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def spawn_run(args: list[str], home: Path, timeout: int = 120) -> pexpect.spawn:
    """`clover run ARGS` in a pseudo-terminal of COLS x ROWS."""
    return pexpect.spawn(sys.executable, ["-m", "clover_cli", "run", *args], env=terminal_env(home),
                         encoding="utf-8", codec_errors="replace", timeout=timeout, dimensions=(ROWS, COLS),
                         preexec_fn=_as_a_terminal_starts_it)


def screen(raw: str) -> list[str]:
    """What a COLS x ROWS terminal shows after `raw`, one string per row (trailing blanks kept)."""
    import pyte

    term = pyte.Screen(COLS, ROWS)
    pyte.Stream(term).feed(raw)
    return term.display
