"""Consoles and the one-line error style shared by every subcommand.

Answers go to stdout; logs, progress and errors to stderr, so `clover run … > answer.txt`
holds only the answer. Colour follows the terminal, `NO_COLOR` and `--no-color`.
"""

from __future__ import annotations

import os
import re
import sys

from rich.console import Console
from rich.text import Text

_state = {"verbose": False, "no_color": bool(os.environ.get("NO_COLOR"))}


# C0 controls, DEL, C1 controls (0x9b is a one-byte CSI), bidi overrides and lone surrogates: anything
# that could move the cursor, recolour, retitle the window, add a hyperlink or reorder what is shown.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_WITH_LINES = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object, *, lines: bool = False) -> str:
    """Text from a file or a request as it may reach a terminal: every control character written
    as a visible escape (`\\x1b`), so a GGUF or a client cannot clear the screen, recolour it, set
    the window title or plant a hyperlink. `lines=True` keeps newlines and tabs (multi-line text
    such as a chat template); otherwise they are escaped too, so one line stays one line."""
    pattern = _UNSAFE if lines else _UNSAFE_WITH_LINES
    return pattern.sub(_escaped, str(text))


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


def _line(label: str, style: str, message: str) -> Text:
    """A styled label and a message that is never markup (it may quote a file or a request)."""
    return Text.assemble((label, style), safe(message))


def print_error(message: str, hint: str | None = None) -> None:
    """One red line (plus an optional dim hint line), never a traceback."""
    con = err()
    con.print(_line("error: ", "bold red", message), highlight=False, soft_wrap=True)
    if hint:
        con.print(Text(f"hint: {safe(hint)}", style="dim"), highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    err().print(_line("warning: ", "yellow", message), highlight=False, soft_wrap=True)


def info(message: str) -> None:
    err().print(safe(message), markup=False, highlight=False, emoji=False, soft_wrap=True)
