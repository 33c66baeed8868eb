"""`--help` as llama.cpp prints it: one line per flag (all its names, then a wrapped description),
options grouped under `----- model -----` style headings, at any terminal width from 80 up.

Typer's rich tables give each of four columns a share of the width, so at 80 columns long names
were cut with `…` and descriptions squeezed into 17 characters over 240 lines. Plain text with a
fixed name column keeps every name whole and every line within the terminal.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import typer.core

from .options import PANELS

MIN_WIDTH = 80
MAX_WIDTH = 120  # wider than this, descriptions get hard to read: llama.cpp's lines are about as long
NAME_COLUMN = 30  # names up to this long share the line with their description; longer ones sit above it
OTHER = "options"


def width() -> int:
    """The terminal's width (COLUMNS wins), kept between 80 and 120 columns."""
    columns = os.environ.get("COLUMNS", "")
    cols = int(columns) if columns.isdigit() else shutil.get_terminal_size((MIN_WIDTH, 24)).columns
    return max(MIN_WIDTH, min(cols, MAX_WIDTH))


def _metavar(param: Any) -> str:
    """The placeholder after an option's names: its own metavar, else llama.cpp's N or FILE, else the
    option's name in capitals."""
    if getattr(param, "metavar", None):
        return param.metavar
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation in (int, float):
        return "N"
    if annotation is Path:
        return "FILE"
    return param.name.removesuffix("_opt").upper()


def _names(param: Any) -> str:
    """Short names first (`-c, --ctx-size N`), both sides of a `--think/--no-think` switch."""
    opts = sorted(param.opts, key=lambda o: (o.startswith("--"), len(o)))
    text = ", ".join(opts)
    if param.secondary_opts:
        text += ", " + ", ".join(param.secondary_opts)
    if not (param.is_flag or param.count):
        text += " " + _metavar(param)
    return text


def _default(param: Any) -> str | None:
    """`default: X` where a default says something the description does not already."""
    if param.show_default is False or "default" in (param.help or "").lower():
        return None
    value = param.default
    if param.is_flag and param.secondary_opts:
        return f"default: {(param.opts if value else param.secondary_opts)[-1]}"
    if param.is_flag or value is None or value == () or value == []:
        return None
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return f"default: {value}"


def _description(param: Any, env: bool) -> str:
    text = (param.help or "").strip()
    extra = [x for x in (_default(param),) if x]
    envvar = getattr(param, "envvar", None)
    if env and isinstance(envvar, str):
        extra.append(f"env: {envvar}")
    return " ".join([text] + [f"({x})" for x in extra]).strip()


def _entry(names: str, description: str, cols: int, column: int, indent: int = 2) -> list[str]:
    """One flag: its names, then the description wrapped in the `column`-wide space beside them
    (below them when the names are longer)."""
    lead = " " * indent + names
    body = textwrap.wrap(description, cols - indent - column - 2, break_on_hyphens=False) or [""]
    pad = " " * (indent + column + 2)
    if len(lead) <= indent + column:
        first = lead.ljust(indent + column + 2) + body[0]
        return [first.rstrip()] + [pad + line for line in body[1:]]
    return [lead] + [pad + line for line in body]


def _paragraphs(text: str, cols: int) -> list[str]:
    """A docstring: indented lines (examples) as they are, the rest wrapped to the width."""
    out: list[str] = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        if all(line.startswith(" ") for line in lines):
            out += ["  " + line.strip() for line in lines]
        else:
            out += textwrap.wrap(" ".join(line.strip() for line in lines), cols, break_on_hyphens=False)
        out.append("")
    return out


def _usage(command: Any, ctx: Any) -> str:
    pieces = " ".join(command.collect_usage_pieces(ctx))
    return f"usage: {ctx.command_path} {pieces}"


def _groups(command: Any, ctx: Any) -> dict[str, list[Any]]:
    """Options by their help panel: the panels in `options.PANELS` order, then any other, then the
    ungrouped ones (help among them)."""
    groups: dict[str, list[Any]] = {}
    for param in command.get_params(ctx):
        if param.param_type_name == "option" and not param.hidden:
            groups.setdefault(getattr(param, "rich_help_panel", None) or OTHER, []).append(param)
    rank = {name: i for i, name in enumerate(PANELS)}
    order = sorted(groups, key=lambda name: (name == OTHER, rank.get(name, len(rank))))
    return {name: groups[name] for name in order}


def _conventional(param: Any) -> bool:
    """Whether the option reads CLOVER_<ONE OF ITS LONG NAMES> (`--ctx-size`: CLOVER_CTX_SIZE)."""
    return any(param.envvar == "CLOVER_" + name.lstrip("-").upper().replace("-", "_")
               for name in param.opts if name.startswith("--"))


def _environment(options: list[Any]) -> str | None:
    """One note for a command most of whose options read the environment by the CLOVER_<NAME> rule,
    instead of an `env:` on every line; None where each option says it for itself."""
    shown = [p for p in options if p.name != "help"]
    readers = [p for p in shown if p.envvar]
    if not readers or len(readers) * 2 < len(shown) or not all(_conventional(p) for p in readers):
        return None
    note = ("Options also read CLOVER_<LONG NAME> from the environment (--ctx-size: CLOVER_CTX_SIZE); "
            "the command line wins.")
    others = [min(p.opts, key=len) for p in shown if not p.envvar]
    return note + (f" Not: {', '.join(others)}." if others else "")


def render(command: Any, ctx: Any, cols: int | None = None) -> str:
    """The whole help page of `command` as plain text, no line longer than `cols`."""
    cols = cols or width()
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    args = [p for p in command.get_params(ctx) if p.param_type_name == "argument"]
    if args:
        sections.append(("arguments", [((a.metavar or a.name).upper(), (getattr(a, "help", None) or "").strip())
                                       for a in args]))
    sub = getattr(command, "commands", None)
    if sub:
        sections.append(("commands", [(name, sub[name].get_short_help_str(limit=300))
                                      for name in command.list_commands(ctx)]))
    groups = _groups(command, ctx)
    note = _environment([p for params in groups.values() for p in params])
    for title, params in groups.items():
        sections.append((title, [(_names(p), _description(p, note is None)) for p in params]))
    widest = max((len(names) for _, entries in sections for names, _ in entries), default=0)
    column = min(NAME_COLUMN, widest)
    lines = [_usage(command, ctx), ""]
    lines += _paragraphs(command.help or "", cols)
    for title, entries in sections:
        lines.append(f"----- {title} -----")
        for names, description in entries:
            lines += _entry(names, description, cols, column)
        lines.append("")
    if note:
        lines += textwrap.wrap(note, cols, break_on_hyphens=False)
    return "\n".join(lines).rstrip() + "\n"


class HelpCommand(typer.core.TyperCommand):
    """A Typer command whose --help is `render`'s plain text."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(render(self, ctx))


class HelpGroup(typer.core.TyperGroup):
    """The `clover` group, with the same help layout as its commands."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(render(self, ctx))
