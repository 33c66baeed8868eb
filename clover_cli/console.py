"""Consoles and the one-line error style shared by every subcommand.

Answers go to stdout; logs, progress and errors to stderr, so `clover run … > answer.txt`
holds only the answer. Colour follows the terminal, `NO_COLOR` and `--no-color`.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

_state = {"verbose": False, "no_color": bool(os.environ.get("NO_COLOR"))}


def set_options(*, verbose: bool, no_color: bool) -> None:
    _state["verbose"] = verbose
    _state["no_color"] = _state["no_color"] or no_color


def verbose() -> bool:
    return bool(_state["verbose"])


def out() -> Console:
    """Console for answers (stdout); plain text when piped."""
    return Console(file=sys.stdout, no_color=_state["no_color"], highlight=False, soft_wrap=True)


def err() -> Console:
    """Console for logs, progress and errors (stderr)."""
    return Console(file=sys.stderr, no_color=_state["no_color"], highlight=False, soft_wrap=True)


def print_error(message: str, hint: str | None = None) -> None:
    """One red line (plus an optional dim hint line), never a traceback."""
    con = err()
    con.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    if hint:
        con.print(f"[dim]hint: {hint}[/]")


def warn(message: str) -> None:
    err().print(f"[yellow]warning:[/] {message}")


def info(message: str) -> None:
    err().print(message, markup=False)
