"""Shared pieces of the Hub tests: running the real `clover` against the test Hub, and model files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from hub_server import HubServer

ROOT = Path(__file__).resolve().parents[1]


def clover_env(endpoint: str, cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a user whose Hub is the test server and whose cache is `cache`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "CLOVER_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                        "CLOVER_CTX_SIZE", "MODEL_ENDPOINT")}
    env.update({"HF_ENDPOINT": endpoint, "CLOVER_CACHE": str(cache), "HF_HOME": str(cache.parent / "hf-home"),
                "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"})
    env.update(extra or {})
    return env


def run_clover(hub: HubServer | str, cache: Path, *args: str, extra: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    endpoint = hub if isinstance(hub, str) else hub.endpoint
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], env=clover_env(endpoint, cache, extra),
                          capture_output=True, text=True, encoding="utf-8", timeout=timeout, cwd=ROOT)


def pulled_path(res: subprocess.CompletedProcess) -> Path:
    """The path `clover pull` printed on stdout (`done: <path>`)."""
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith("done: "), res.stdout
    return Path(line.removeprefix("done: "))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def error_line(res: subprocess.CompletedProcess) -> str:
    """The one `error:` line a failed command printed (and check it printed no traceback)."""
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, res.stderr
    return lines[0].removeprefix("error: ")


def split_model(folder: Path, name: str = "Split-F32.gguf") -> list[Path]:
    """A real three-shard split set (gguf's writer), as llama.cpp's gguf-split makes them."""
    from inspect_helpers import write_model

    folder.mkdir(parents=True, exist_ok=True)
    first = write_model(folder / name, split_tensors=30, seed=3)
    return sorted(first.parent.glob(f"{Path(name).stem}-*-of-00003.gguf"))


def blobs(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("blobs/*"))
