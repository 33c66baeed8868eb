"""The first ten minutes on the command line (issue 39): pasted llama.cpp command lines run, usage
errors exit 2, `demo` is named wherever a newcomer looks, and the smaller fixes of item 7. Every test
runs the real `clover` entry point in a subprocess against a real synthetic model or the demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serve_helpers import serve_process
from synth_models import tiny_model_path


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOVER_", "HF_"))}
    env.update(HOME=str(home), NO_COLOR="1", PYTHONIOENCODING="utf-8", COLUMNS="120",
               HF_HUB_CACHE=str(home / "hub"), XDG_DATA_HOME=str(home / "data"))
    env.update(extra)
    return env


def _clover(*args: str, home: Path, stdin: str | None = None, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], capture_output=True, text=True,
                          encoding="utf-8", env=_env(home, **extra), timeout=300, input=stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None)


@pytest.fixture(scope="module")
def model() -> str:
    return str(tiny_model_path("Q8_0"))


# -- item 5: llama.cpp command lines run -----------------------------------------------------------------

PASTED = ["--jinja", "-fa", "on", "-b", "512", "-ub", "128", "--mlock", "--no-mmap", "-cnv"]


def test_a_pasted_llama_cli_line_warns_once_per_flag_and_answers_the_same(model: str, tmp_path: Path) -> None:
    base = ["run", model, "hello", "-n", "3", "--decode", "ar", "--no-think", "--temp", "0"]
    plain = _clover(*base, home=tmp_path)
    pasted = _clover(*base, *PASTED, home=tmp_path)
    assert plain.returncode == pasted.returncode == 0, pasted.stderr
    assert pasted.stdout == plain.stdout and plain.stdout.strip()
    warnings = [line for line in pasted.stderr.splitlines() if line.startswith("warning: clover run ignores ")]
    assert [w.split(":")[1].removeprefix(" clover run ignores ") for w in warnings] == [
        "--jinja", "-fa on", "-b 512", "-ub 128", "--mlock", "--no-mmap", "-cnv"]
    assert "Traceback" not in pasted.stderr


def test_a_pasted_llama_server_line_serves(model: str, tmp_path: Path) -> None:
    args = ["--jinja", "--flash-attn", "auto", "-cb", "--metrics", "--batch-size", "2048", "-c", "512"]
    with serve_process(Path(model), *args, home=tmp_path) as (_proc, port):
        res = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                         json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] > 0
    log = (tmp_path / "serve.log").read_text(encoding="utf-8")
    for shown in ("--jinja", "--flash-attn auto", "-cb", "--metrics", "--batch-size 2048"):
        assert f"warning: clover serve ignores {shown}: " in log, log


def test_a_flag_that_would_change_something_still_stops(model: str, tmp_path: Path) -> None:
    """Only flags that change nothing are passed over: --no-jinja asks for something clover lacks."""
    res = _clover("run", model, "hi", "--no-jinja", home=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: clover run has no --no-jinja yet: ")


@pytest.mark.parametrize("args,first", [
    (["run", "{model}", "hi", "--decode", "foo"], "error: --decode must be auto, diffusion or ar, not 'foo'"),
    (["bench", "{model}", "-o", "sql"], "error: -o must be md, csv, json or jsonl, not 'sql'"),
    (["run", "{model}", "hi", "-p", "there"], "error: the prompt is given twice (argument and -p)"),
    (["run", "{model}", "hi", "-t", "0"], "error: invalid value for '-t'"),
    (["run", "{model}", "hi", "-t", "-3"], "error: invalid value for '-t'"),
    (["serve", "{model}", "-t", "0"], "error: invalid value for '-t'"),
    (["bench", "{model}", "-t", "0"], "error: -t: threads must be at least 1"),
    (["bench", "{model}", "-p", "1-x"], "error: invalid number or range '1-x'"),
    (["serve", "{model}", "--decode", "fast"], "error: --decode must be auto, diffusion or ar"),
    (["inspect", "{model}", "-ctk", "q3"], "error: unknown --cache-type 'q3'"),
])
def test_every_usage_error_exits_2(args: list[str], first: str, model: str, tmp_path: Path) -> None:
    res = _clover(*(a.format(model=model) for a in args), home=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[0].startswith(first), res.stderr
    assert "Traceback" not in res.stderr and "compiling" not in res.stderr  # refused before loading
