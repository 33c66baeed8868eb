"""The PyInstaller recipe for clover.exe (issue 41): it collects the installed packages
(`clover_cli`, `clover_runtime`) with every data file pyproject ships, and, where PyInstaller is
installed (it is not in the test extra: a build takes minutes), a real one-file build on this OS
runs the demo model and keeps its compiled kernels in the user's cache across working folders."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "windows" / "clover.spec"
SOURCE_DIR = {"clover_cli": ROOT / "clover_cli", "clover_runtime": ROOT / "runtime"}


def _spec_tree() -> ast.Module:
    return ast.parse(SPEC.read_text(encoding="utf-8"))


def _spec_package_data() -> dict[str, list[str]]:
    for node in _spec_tree().body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PACKAGE_DATA" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("clover.spec has no PACKAGE_DATA")


def _calls(name: str) -> list[str]:
    return [node.args[0].value for node in ast.walk(_spec_tree())
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == name
            and node.args and isinstance(node.args[0], ast.Constant)]


def test_the_spec_ships_what_pyproject_ships() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert _spec_package_data() == pyproject["tool"]["setuptools"]["package-data"]


def test_the_spec_collects_the_installed_package_names() -> None:
    assert {"clover_cli", "clover_runtime"} <= set(_calls("collect_data_files"))
    assert {"clover_cli", "clover_runtime"} <= set(_calls("collect_submodules"))
    assert "runtime" not in _calls("collect_data_files") + _calls("collect_submodules")


@pytest.mark.parametrize("package,pattern", [(p, g) for p, globs in _spec_package_data().items() for g in globs])
def test_every_listed_data_pattern_names_real_files(package: str, pattern: str) -> None:
    top, *sub = package.split(".")
    folder = SOURCE_DIR[top].joinpath(*sub)
    assert list(folder.glob(pattern)), f"{package}: {pattern} matches nothing in {folder}"


def _build(tmp_path: Path) -> Path:
    """clover installed (not editable) into a folder, then the spec built against it."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("runtime", "clover_cli"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env.pop("CLOVER_PYI_GPU", None)
    res = subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--distpath",
                          str(tmp_path / "dist"), "--workpath", str(tmp_path / "build"), str(SPEC)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    exe = tmp_path / "dist" / ("clover.exe" if os.name == "nt" else "clover")
    assert exe.is_file()
    return exe


@pytest.mark.timeout(2400)
@pytest.mark.skipif(importlib.util.find_spec("PyInstaller") is None,
                    reason="PyInstaller is not installed (pip install pyinstaller; the build takes minutes)")
def test_a_one_file_build_runs_the_demo_and_compiles_its_kernels_once(tmp_path: Path) -> None:
    exe = _build(tmp_path)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOVER_", "NUMBA_", "PYTHON"))}
    env.update({"CLOVER_HOME": str(home), "NO_COLOR": "1"})
    runs = []
    for n in range(2):  # a new working folder each time, as a user starting clover.exe from anywhere
        cwd = tmp_path / f"cwd{n}"
        cwd.mkdir()
        res = subprocess.run([str(exe), "run", "demo", "What is 2 + 2?", "--no-think", "-n", "32"], cwd=cwd,
                             env=env, capture_output=True, text=True, encoding="utf-8", timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        runs.append(res)
    assert "2 + 2 = 4" in runs[0].stdout, runs[0].stdout
    assert runs[1].stdout == runs[0].stdout
    assert "compiling kernels" in runs[0].stderr  # a fresh cache: the first run compiles...
    assert "compiling kernels" not in runs[1].stderr, runs[1].stderr  # ...and the second loads them
    cached = list((home / "cache" if (home / "cache").is_dir() else home).rglob("*.nbi"))
    assert cached, f"no compiled kernels under {home}"
    page = subprocess.run([str(exe), "completion", "powershell"], env=env, capture_output=True, timeout=120)
    assert page.returncode == 0 and b"Register-ArgumentCompleter" in page.stdout
