"""Completion scripts are current, completion is cheap, and models complete from the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clover_cli.completion import SHELL_FILES, render

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "numba", "gguf", "huggingface_hub")


@pytest.mark.parametrize("shell", sorted(SHELL_FILES))
def test_checked_in_scripts_are_current(shell: str) -> None:
    shipped = (ROOT / "completions" / SHELL_FILES[shell]).read_text(encoding="utf-8")
    stale = f"completions/{SHELL_FILES[shell]} is stale: run python -m clover_cli.completion"
    assert shipped == render(shell), stale


def test_powershell_script_leaves_user_settings_alone() -> None:
    script = render("powershell")
    assert "ExecutionPolicy" not in script
    assert "Set-PSReadLineKeyHandler" not in script
    assert "Register-ArgumentCompleter" in script


def _complete(words: str, cword: int, env: dict[str, str]) -> list[str]:
    code = (
        "import sys\n"
        "from clover_cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    full_env = {**os.environ, **env, "_CLOVER_COMPLETE": "complete_bash", "COMP_WORDS": words,
                "COMP_CWORD": str(cword)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                         cwd=env.get("CWD", str(ROOT)), timeout=60)
    return res.stdout.splitlines()


def test_completing_a_command_imports_nothing_heavy() -> None:
    lines = _complete("clover ins", 1, {})
    assert "inspect" in lines
    assert lines[-1] == "HEAVY=", f"completion imported {lines[-1]}"


def test_import_of_the_cli_is_light() -> None:
    code = f"import sys, clover_cli.app; print([m for m in {HEAVY!r} if m in sys.modules])"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.strip() == "[]"


def test_model_argument_completes_from_cache_and_gguf_files(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snap = cache / "models--Diffuspace--Clover-35B-A3B-Preview-GGUF" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "Clover-35B-A3B-Preview-Q4_K_M.gguf").write_bytes(b"GGUF")
    (snap / "Clover-35B-A3B-Preview-Q8_0-00001-of-00002.gguf").write_bytes(b"GGUF")
    (snap / "Clover-35B-A3B-Preview-Q8_0-00002-of-00002.gguf").write_bytes(b"GGUF")
    work = tmp_path / "wörk dir"
    work.mkdir()
    (work / "tiny model.gguf").write_bytes(b"GGUF")
    (work / "notes.txt").write_text("x", encoding="utf-8")
    env = {"CLOVER_CACHE": str(cache), "CWD": str(work)}
    lines = _complete("clover inspect ", 2, env)
    assert "Diffuspace/Clover-35B-A3B-Preview-GGUF:Q4_K_M" in lines
    assert "Diffuspace/Clover-35B-A3B-Preview-GGUF:Q8_0" in lines
    assert "tiny model.gguf" in lines
    assert "demo" in lines  # the shipped demo model
    assert "notes.txt" not in lines
    assert lines[-1] == "HEAVY="


@pytest.mark.parametrize("shell", sorted(SHELL_FILES))
def test_the_completion_command_prints_the_shipped_script(shell: str) -> None:
    """An installed clover (pip wheel, clover.exe) prints the script without a checkout."""
    res = subprocess.run([sys.executable, "-m", "clover_cli", "completion", shell], capture_output=True,
                         timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode("utf-8") == (ROOT / "completions" / SHELL_FILES[shell]).read_text(encoding="utf-8")


def test_the_completion_command_refuses_an_unknown_shell_in_one_line() -> None:
    res = subprocess.run([sys.executable, "-m", "clover_cli", "completion", "tcsh"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.splitlines()[0] == "error: no completion for shell 'tcsh'"
