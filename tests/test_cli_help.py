"""`--help` fits a terminal (issue 39, item 4): every command's help, rendered by the real `clover`
entry point at 80 and 120 columns, keeps each option's names whole on one line, never runs past the
width, groups the options like llama.cpp's --help, and is about half as long as the rich tables were."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from typer.main import get_command

from clover_cli.app import app

COMMANDS = ["", *sorted(get_command(app).commands)]  # type: ignore[attr-defined]


def _help(command: str, columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    env.pop("CLOVER_DEBUG", None)
    args = [command, "--help"] if command else ["--help"]
    res = subprocess.run([sys.executable, "-m", "clover_cli", *args], capture_output=True, text=True,
                         encoding="utf-8", env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    return res.stdout


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_the_terminal_and_names_every_flag_whole(command: str, columns: int) -> None:
    text = _help(command, columns)
    lines = text.splitlines()
    assert "…" not in text
    wide = [line for line in lines if len(line) > columns]
    assert not wide, f"lines wider than {columns}: {wide}"
    group = get_command(app)
    cmd = group.commands[command] if command else group  # type: ignore[attr-defined]
    for param in cmd.params:
        if param.param_type_name != "option" or param.hidden:
            continue
        names = [*param.opts, *param.secondary_opts]
        # every name of the option on one line, each as a whole word
        assert any(all(re.search(rf"(^|[ ,]){re.escape(n)}([ ,]|$)", line) for n in names) for line in lines), \
            f"clover {command} --help does not show {', '.join(names)} on one line"


def test_run_and_serve_help_are_grouped_like_llama_cpp() -> None:
    run = _help("run", 80)
    serve = _help("serve", 80)
    for heading in ("model", "chat", "context", "sampling", "diffusion", "output", "placement"):
        assert re.search(rf"^----- {heading}\b.* -----$", run, re.M), f"run --help has no {heading} group"
    for heading in ("model", "context", "diffusion", "server", "placement"):
        assert re.search(rf"^----- {heading}\b.* -----$", serve, re.M), f"serve --help has no {heading} group"
    sampling = run.split("----- sampling -----")[1].split("-----")[0]
    assert "--temp N" in sampling and "--top-p N" in sampling and "--threads" not in sampling


def test_help_is_short_and_the_environment_is_said_once() -> None:
    """Before: 242 (run) and 275 (serve) lines at 80 columns, with a 17-column description."""
    run, serve = _help("run", 80), _help("serve", 80)
    assert len(run.splitlines()) <= 130 and len(serve.splitlines()) <= 130
    assert "CLOVER_<LONG NAME>" in serve and "env: CLOVER_PORT" not in serve
    assert re.search(r"^Not: |Not: .*-p, -f", run, re.M)


def test_every_example_uses_a_model_that_exists() -> None:
    """The examples name demo (which ships with clover), never a tiny.gguf the reader does not have."""
    for command in ("run", "serve", "bench", "inspect"):
        example = _help(command, 80).split("Example:")[1].split("-----")[0]
        assert f"clover {command} demo" in example, example
    assert "tiny.gguf" not in _help("run", 80)
