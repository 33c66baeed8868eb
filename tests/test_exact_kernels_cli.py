"""`--exact-kernels` on run, serve and bench: the float kernels instead of the integer ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from bench_helpers import run_bench
from clover_runtime.synth import SynthSpec
from clover_runtime.text.vocab import small_vocab
from decoding_models import successor_overrides
from synth_models import model_path, tiny_model_path


def _successor_q8() -> str:
    spec = SynthSpec.small(quant="Q8_0")
    return str(model_path(spec, tensors_override=successor_overrides(spec, mask_id=small_vocab().special["mask"])))


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "clover_cli", "run", *args], input="", capture_output=True,
                          text=True, env=env, timeout=180)


def test_run_gives_the_same_answer_with_exact_kernels(tmp_path: Path) -> None:
    model = _successor_q8()
    args = [model, "Hello there", "-n", "8", "--decode", "ar", "--no-think"]
    fast = _run(args, tmp_path)
    exact = _run([*args, "--exact-kernels"], tmp_path)
    assert fast.returncode == 0 and exact.returncode == 0, fast.stderr + exact.stderr
    assert fast.stdout.strip() and fast.stdout == exact.stdout


def test_bench_names_the_exact_kernels() -> None:
    model = str(tiny_model_path("Q8_0"))
    res = run_bench(model, "-p", "8", "-n", "2", "-dg", "0", "-r", "1", "-t", "1", "--exact-kernels", "-o", "json")
    assert res.exit_code == 0, res.output
    records = json.loads(res.stdout)
    assert records and all(r["clover_backend"] == "numba exact" and r["avg_ts"] > 0 for r in records)
    res = run_bench(model, "-p", "8", "-n", "0", "-dg", "0", "-r", "1", "-t", "1", "-o", "json")
    assert all(r["clover_backend"] == "numba" for r in json.loads(res.stdout))


def test_serve_answers_with_exact_kernels(tmp_path: Path) -> None:
    from clover_cli.server.launch import bind

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLOVER_")},
           "CLOVER_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.Popen([sys.executable, "-m", "clover_cli", "serve", _successor_q8(), "--port", str(port),
                             "-c", "512", "--exact-kernels"], env=env, text=True, encoding="utf-8",
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline().startswith(f"listening on http://127.0.0.1:{port}")
        body = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0,
                "decode": "ar"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
            deadline = time.monotonic() + 300
            while c.get("/health").status_code == 503 and time.monotonic() < deadline:  # still loading
                time.sleep(0.2)
            r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
    finally:
        proc.terminate()
        proc.wait(30)
