"""Conventions a llama.cpp or Ollama user expects of the `clover` command line (issue 17, items 8-11):
llama.cpp flags clover lacks, global flags after the subcommand, one-line usage errors, help texts,
the guide, one meaning of -c, and the smaller fixes. Every test runs the real `clover` entry point."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from synth_models import tiny_model_path


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "COLUMNS": "120",
           "HF_HUB_CACHE": str(home / "hub"), "XDG_DATA_HOME": str(home / "data")}
    for var in ("CLOVER_DEBUG", "CLOVER_HOME", "CLOVER_CACHE", "HF_HOME"):
        env.pop(var, None)
    env.update(extra)
    return env


def _clover(*args: str, home: Path, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], capture_output=True, text=True,
                          encoding="utf-8", env=_env(home, **extra), timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def model() -> str:
    return str(tiny_model_path("Q8_0"))


# -- item 10: flags ---------------------------------------------------------------------------------

@pytest.mark.parametrize("command,args,flag", [
    ("run", ["-ngl", "99", "hello"], "-ngl"),
    ("run", ["-cnv"], "-cnv"),
    ("run", ["-ctk", "q8_0"], "-ctk"),
    ("run", ["--jinja", "-p", "hi"], "--jinja"),
    ("serve", ["-ngl", "99", "-c", "4096"], "-ngl"),
    ("serve", ["--jinja"], "--jinja"),
    ("serve", ["-fa", "on"], "-fa"),
    ("serve", ["--n-gpu-layers=99"], "--n-gpu-layers"),
    ("bench", ["-ngl", "99"], "-ngl"),
])
def test_llama_cpp_flags_clover_lacks_get_one_line(command: str, args: list[str], flag: str, tmp_path: Path) -> None:
    res = _clover(command, *args, home=tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: clover {command} has no {flag} yet: "), res.stderr
    assert len(lines) == 2 and lines[1] == f"hint: clover {command} --help lists its options"
    assert "Invalid value" not in res.stderr and res.stdout == ""


def test_a_flag_the_command_has_is_not_refused(model: str, tmp_path: Path) -> None:
    """inspect has -ctk (to estimate llama.cpp's cache sizes): only flags a command lacks are refused."""
    res = _clover("inspect", model, "-ctk", "q8_0", "--json", home=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["memory"]["cache_type"] == "q8_0"


@pytest.mark.parametrize("args,expect", [
    (["run", "-n", "gl"], "error: invalid value for '-n'"),
    (["run", "--bogus"], "error: no such option: --bogus"),
    (["serve", "-c", "-5"], "error: invalid value for '-c'"),
    (["inspect"], "error: missing argument 'MODEL'"),
    (["frobnicate"], "error: no such command 'frobnicate'"),
])
def test_usage_errors_are_one_line(args: list[str], expect: str, tmp_path: Path) -> None:
    res = _clover(*args, home=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith(expect), res.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: clover") and lines[1].endswith("--help lists the options")
    assert "Usage:" not in res.stderr and "╭" not in res.stderr


def test_verbose_works_after_the_subcommand(model: str, tmp_path: Path) -> None:
    """-v before or after `run` shows the banner (on stderr) in a one-shot answer; without it, none."""
    base = ["-n", "2", "--decode", "ar", "--no-think", "--temp", "0"]
    after = _clover("run", model, "hi", *base, "-v", home=tmp_path)
    before = _clover("-v", "run", model, "hi", *base, home=tmp_path)
    quiet = _clover("run", model, "hi", *base, home=tmp_path)
    assert after.returncode == before.returncode == quiet.returncode == 0, after.stderr
    assert "clover ·" in after.stderr and "clover ·" in before.stderr and "clover ·" not in quiet.stderr
    assert after.stdout == before.stdout == quiet.stdout


def test_a_prompt_given_twice_is_an_error(model: str, tmp_path: Path) -> None:
    res = _clover("run", model, "hello", "-p", "there", home=tmp_path)
    assert res.returncode == 1
    assert res.stderr.splitlines()[0] == "error: the prompt is given twice (argument and -p)"
    res = _clover("run", "-m", model, "extra.gguf", "hello", home=tmp_path)
    assert res.returncode == 1 and res.stderr.startswith("error: the model is given twice")


def test_help_texts_say_what_the_commands_take(tmp_path: Path) -> None:
    serve = _clover("serve", "--help", home=tmp_path).stdout
    inspect = _clover("inspect", "--help", home=tmp_path).stdout
    flat = " ".join(serve.split())
    assert "hf://" not in flat and "hf.co/owner/repo[:QUANT]" in flat
    flat = " ".join(inspect.split())
    assert "Path to a .gguf file" not in flat and "owner/repo[:QUANT]" in flat


def test_the_guide_lists_every_command(tmp_path: Path) -> None:
    from typer.main import get_command

    from clover_cli.app import app

    res = _clover(home=tmp_path)
    assert res.returncode == 0
    for name in get_command(app).commands:  # type: ignore[attr-defined]
        assert re.search(rf"^  clover {re.escape(name)}\b", res.stdout, re.M), f"the guide lacks clover {name}"
