"""Strings from a GGUF file or the command line reach the terminal with control characters
escaped and are never read as rich markup (`inspect`, error lines, the JSON dump)."""

from __future__ import annotations

import json

import pytest
from inspect_helpers import run_clover, write_model

from clover_cli.console import safe

HOSTILE = ("\x1b[2J\x1b[H"  # clear screen
           "\x1b]0;pwned\x07"  # window title (OSC 0)
           "\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\"  # hyperlink (OSC 8)
           "\x1b[31mred\x9b1m[bold]x[/bold][/]\u202e")


def assert_no_raw_controls(text: str) -> None:
    for seq in ("\x1b[2J", "\x1b]", "\x07", "\x9b", "\u202e", "\x1b[31mred"):
        assert seq not in text, repr(seq)


def test_safe_escapes_every_control_character():
    assert safe("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert safe("x\ny\tz\r") == "x\\ny\\tz\\r"
    assert safe("x\ny\tz", lines=True) == "x\ny\tz"
    assert safe("\x00\x7f\x9b\u202e\u2066\ud800") == "\\x00\\x7f\\x9b\\u202e\\u2066\\ud800"
    assert safe("[bold]ünïcode ✓[/]") == "[bold]ünïcode ✓[/]"
    for code in list(range(0x20)) + list(range(0x7f, 0xa0)):
        assert "\\x" in safe(chr(code)) or safe(chr(code)) in ("\\n", "\\t", "\\r")


@pytest.mark.parametrize("force_terminal", [False, True])
def test_inspect_shows_a_hostile_name_escaped(tmp_path, capsys, monkeypatch, force_terminal):
    if force_terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("COLUMNS", "400")
    path = write_model(tmp_path / "evil.gguf", name=HOSTILE, template="{{ '\x1b]0;t\x07' }}\nline two")
    code, out, err = run_clover(["inspect", str(path), "--metadata"], capsys, monkeypatch)
    assert code == 0, err
    assert_no_raw_controls(out + err)
    assert "\\x1b[2J" in out and "\\x1b]0;pwned\\x07" in out
    assert "[bold]x[/bold][/]" in out  # shown as written, not interpreted
    code, out, err = run_clover(["inspect", str(path), "--template"], capsys, monkeypatch)  # the template alone
    assert code == 0, err
    assert_no_raw_controls(out + err)
    assert "\\x1b]0;t\\x07" in out and out.splitlines()[-1] == "line two"  # escaped, and it keeps its lines
    code, out, err = run_clover(["inspect", str(path), "--json"], capsys, monkeypatch)
    assert code == 0 and "\x9b" not in out and "\x1b" not in out
    assert json.loads(out)["metadata"]["general.name"]["value"] == HOSTILE


@pytest.mark.parametrize("arg", ["[/]", "[bold]x[/bold]", "\x1b]0;title\x07.gguf", "[/]x.gguf"])
def test_error_lines_are_never_markup(capsys, monkeypatch, arg):
    code, out, err = run_clover(["inspect", arg], capsys, monkeypatch)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and all(x.startswith("hint: ") for x in lines[1:]), err
    assert "Traceback" not in err and "MarkupError" not in err
    assert_no_raw_controls(err)
    assert safe(arg) in lines[0]


def test_hostile_architecture_in_an_error_line(tmp_path, capsys, monkeypatch):
    path = write_model(tmp_path / "arch.gguf", arch="[/]\x1b[2J")
    code, out, err = run_clover(["inspect", str(path)], capsys, monkeypatch)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == ["error: unknown architecture '[/]\\x1b[2J' (supported: clover-moe, "
                                        "qwen35moe, qwen3next)"]
