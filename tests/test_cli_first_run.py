"""First-run experience: the guide, --version, help examples, doctor, one-line errors, and a home
directory whose name holds non-ASCII characters and spaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_helpers import expected_verdict

ROOT = Path(__file__).resolve().parent.parent


def _clover(*args: str, home: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    for var in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "CLOVER_HOME", "CLOVER_CACHE",
                "HF_HOME", "HF_HUB_CACHE", "CLOVER_DEBUG"):
        full.pop(var, None)
    if home is not None:
        local = str(home / "AppData" / "Local")
        full.update({"HOME": str(home), "USERPROFILE": str(home), "LOCALAPPDATA": local})
    full.update(env or {})
    full["PYTHONIOENCODING"] = "utf-8"
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], capture_output=True, text=True,
                          encoding="utf-8", env=full, timeout=timeout, cwd=str(home or ROOT))


@pytest.fixture()
def odd_home(tmp_path: Path) -> Path:
    home = tmp_path / "Jöhn Dœ 用户 home"
    home.mkdir()
    return home


def test_no_arguments_prints_a_guide(odd_home: Path) -> None:
    res = _clover(home=odd_home)
    assert res.returncode == 0
    for word in ("clover inspect", "clover make-model", "--help"):
        assert word in res.stdout
    assert "Usage:" not in res.stderr


def test_version() -> None:
    import clover_cli

    res = _clover("--version")
    assert res.returncode == 0
    assert res.stdout.startswith(f"clover {clover_cli.__version__} (")


def test_every_subcommand_help_has_an_example() -> None:
    from typer.main import get_command

    from clover_cli.app import app

    names = sorted(get_command(app).commands)  # type: ignore[attr-defined]
    assert {"inspect", "make-model", "doctor"} <= set(names)
    for name in names:
        res = _clover(name, "--help")
        assert res.returncode == 0, name
        assert "Example" in res.stdout, f"clover {name} --help has no example"


def test_doctor_under_a_non_ascii_home(odd_home: Path) -> None:
    res = _clover("doctor", "--json", home=odd_home)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["system"]["ram_total"] > 0
    assert report["system"]["physical_cores"] >= 1
    assert str(odd_home) in report["hf_cache"]["path"]
    assert str(odd_home) in report["numba_cache"]["path"]
    fit = report["fit"]
    assert fit["verdict"]["verdict"] == expected_verdict(fit["estimate"], fit["verdict"]["available"])
    assert report["fit"]["estimate"]["kv_per_token"] == 40 * 1024  # float32 K and V, as the engine keeps them
    try:
        import torch  # noqa: F401

        has_torch = True
    except ImportError:
        has_torch = False
    offload = report["gpu_offload"]
    if has_torch:
        assert offload["torch"] and not offload["problem"], offload
    else:
        assert offload == {"torch": None, "device": None, "name": "", "free_bytes": None,
                           "problem": 'GPU offload needs torch: pip install "clover-cli[gpu]"'}
    text = _clover("doctor", home=odd_home)
    assert text.returncode == 0
    assert "Default model" in text.stdout and "Diffuspace/Clover-35B-A3B-Preview-GGUF:Q4_K_M" in text.stdout
    offload_line = next(line for line in text.stdout.splitlines() if "GPU offload" in line)
    if has_torch and offload["device"] is None:
        assert "no CUDA device (--device mps opts in" in offload_line, offload_line
    elif not has_torch:
        assert 'not available: GPU offload needs torch: pip install "clover-cli[gpu]"' in offload_line


def test_errors_are_one_line_and_debug_shows_the_traceback(odd_home: Path) -> None:
    bad = odd_home / "not a módel.gguf"
    bad.write_bytes(b"NOPE" * 64)
    res = _clover("inspect", str(bad), home=odd_home)
    assert res.returncode == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not a GGUF file" in lines[0]
    assert "Traceback" not in res.stderr
    dbg = _clover("inspect", str(bad), home=odd_home, env={"CLOVER_DEBUG": "1"})
    assert dbg.returncode != 0
    assert "Traceback" in dbg.stderr


def test_make_model_and_inspect_under_a_non_ascii_home(odd_home: Path) -> None:
    out = odd_home / "modèles" / "tiny ü.gguf"
    out.parent.mkdir()
    made = _clover("make-model", str(out), home=odd_home)
    assert made.returncode == 0, made.stderr
    res = _clover("inspect", str(out), "--json", home=odd_home)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["summary"]["architecture"] in ("clover-moe", "qwen35moe", "qwen3next")
