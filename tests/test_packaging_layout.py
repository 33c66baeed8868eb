"""The installed import names: `clover_runtime` (from the `runtime/` folder) and `clover_cli`, never `runtime`."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _folders_with_init(top: str, import_name: str) -> set[str]:
    return {
        ".".join([import_name, *p.parent.relative_to(ROOT / top).parts])
        for p in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in p.parts
    }


def test_every_package_folder_is_listed_under_its_import_name() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert config["package-dir"] == {"clover_runtime": "runtime"}
    expected = _folders_with_init("runtime", "clover_runtime") | _folders_with_init("clover_cli", "clover_cli")
    assert set(config["packages"]) == expected


@pytest.mark.timeout(300)
def test_the_wheel_holds_clover_runtime_and_no_top_level_runtime(tmp_path: Path) -> None:
    import shutil
    import subprocess

    src = tmp_path / "src"  # a copy, so setuptools' build/ folder never lands in the checkout
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("runtime", "clover_cli"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("clover_cli-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"clover_cli", "clover_runtime"}
    assert "clover_runtime/text/templates/qwen3.6.jinja" in names
    assert "clover_runtime/engine/model.py" in names
    assert "clover_cli/server/static/index.html" in names
    assert "clover_runtime/demo/clover-demo-Q8_0.gguf" in names  # `clover run demo` works from a wheel
