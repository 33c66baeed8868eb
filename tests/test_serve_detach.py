"""`clover serve --detach`, `clover ps`, `clover stop`: a real background process, end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import tiny_model

ROOT = Path(__file__).resolve().parent.parent


def _clover(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, encoding="utf-8", timeout=timeout)


def test_detach_ps_stop_round_trip(tmp_path):
    model = tiny_model(tmp_path)
    home = tmp_path / "clover-home-ünï"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOVER_")}
    env = {**clean, "CLOVER_HOME": str(home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    started = _clover(["serve", str(model), "--port", "0", "-c", "512", "--detach",  # any free port
                       "--api-key", "secret-key", "--alias", "bg-model"], env)
    assert started.returncode == 0, started.stderr
    running = re.search(r"clover serve is running: http://127\.0\.0\.1:(\d+) \(pid (\d+)\)", started.stdout)
    assert running, started.stdout
    port = int(running.group(1))
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json() == {"status": "ok"}
        assert httpx.get(f"http://127.0.0.1:{port}/props", timeout=10).status_code == 401
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                       headers={"Authorization": "Bearer secret-key"},
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["model"] == "bg-model"

        listed = _clover(["ps", "--json"], env)
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        assert [(row["port"], row["model"]) for row in rows] == [(port, "bg-model")]
        pid = rows[0]["pid"]
        assert pid == int(running.group(2))
        log = Path(rows[0]["log"])
        assert log.is_file() and log.is_relative_to(home)
        assert f"listening on http://127.0.0.1:{port} (web UI at /, API at /v1)" in log.read_text("utf-8")
        assert "secret-key" not in " ".join(_cmdline(pid))
        table = _clover(["ps"], env)
        assert str(port) in table.stdout and "bg-model" in table.stdout

        again = _clover(["serve", str(model), "--port", str(port), "-c", "512", "--detach"], env)
        assert again.returncode == 1 and "port" in again.stderr and "Traceback" not in again.stderr
    finally:
        stopped = _clover(["stop", str(port)], env)
    assert stopped.returncode == 0, stopped.stderr
    assert f"port {port}" in stopped.stderr
    assert _gone(pid)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    assert json.loads(_clover(["ps", "--json"], env).stdout) == []
    none_left = _clover(["stop", "--all"], env)
    assert none_left.returncode == 0 and "no clover servers" in none_left.stderr
    missing = _clover(["stop", str(port)], env)
    assert missing.returncode == 1 and "no clover server is running on port" in missing.stderr


def _cmdline(pid: int) -> list[str]:
    import psutil

    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def _gone(pid: int, timeout: float = 10.0) -> bool:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_detached_server_checks_its_gpu_flags_in_the_child(tmp_path):
    """The parent of `serve --detach` never opens the GPU (its CUDA context would shrink the free
    memory the child sizes `-ngl auto` by): a device it cannot have fails in the child, and the
    parent reports that with the child's own line, and no server is left behind."""
    model = tiny_model(tmp_path)
    shim = tmp_path / "no-torch" / "torch"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n", encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOVER_")}
    env = {**clean, "CLOVER_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8",
           "PYTHONPATH": os.pathsep.join([str(shim.parent), os.environ.get("PYTHONPATH", "")])}
    res = _clover(["serve", str(model), "--port", "0", "-c", "256", "--detach", "--device", "cuda"], env)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: the background server exited during start-up (exit code 1)"], res.stderr
    assert 'GPU offload needs torch: pip install "clover-cli[gpu]"' in res.stderr
    assert json.loads(_clover(["ps", "--json"], env).stdout) == []
