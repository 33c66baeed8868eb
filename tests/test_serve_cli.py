"""`clover serve` in the foreground as users start it: flags from the environment, what it prints
at start-up, and one clear line (no traceback) for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from serve_helpers import tiny_model

from clover_cli.server.launch import bind

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve-cli"))


@pytest.fixture
def env(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOVER_")}
    return {**clean, "CLOVER_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8",
            "COLUMNS": "200"}


def _clover(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=timeout)


def _free_port() -> int:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_help_has_an_example(env):
    res = _clover(["serve", "--help"], env)
    assert res.returncode == 0
    assert "Example" in res.stdout and "clover serve" in res.stdout and "CLOVER_" in res.stdout


def test_every_option_reads_the_environment():
    import typer.main

    from clover_cli.app import app

    serve = typer.main.get_command(app).commands["serve"]
    options = [p for p in serve.params if p.param_type_name == "option" and p.name != "help"]
    assert len(options) >= 19
    for option in options:
        long = max(option.opts, key=len).lstrip("-").upper().replace("-", "_")
        assert option.envvar == f"CLOVER_{long}", option.opts


def test_foreground_start_up_from_environment(model, env):
    port = _free_port()
    env.update(CLOVER_MODEL=str(model), CLOVER_HOST="0.0.0.0", CLOVER_PORT=str(port), CLOVER_CTX_SIZE="512",
               CLOVER_PARALLEL="2", CLOVER_ALIAS="env-model", CLOVER_NO_WEBUI="1")
    proc = subprocess.Popen([sys.executable, "-m", "clover_cli", "serve"], cwd=ROOT, env=env, text=True,
                            encoding="utf-8", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        line = proc.stdout.readline()  # blocks until the server listens (or dies)
        assert line == f"listening on http://0.0.0.0:{port} (API at /v1)\n", "".join(err)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            models = c.get("/v1/models").json()
            assert c.get("/").status_code == 404  # CLOVER_NO_WEBUI
            props = c.get("/props").json()
        assert models["data"][0]["id"] == "env-model"
        assert props["total_slots"] == 2 and props["n_ctx"] == 1024 and props["n_ctx_slot"] == 512
        stopped = _clover(["stop", str(port)], env)
        assert stopped.returncode == 0, stopped.stderr
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(10)
    text = "".join(err)
    assert "context: 512 tokens per sequence × 2 parallel sequences = 1024 tokens in all (-c × -np)" in text
    assert "warning: listening on 0.0.0.0 without an API key" in text
    assert "Traceback" not in text


def test_web_ui_line_and_api_key_silences_the_warning(model, env):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "clover_cli", "serve", str(model), "--port", str(port),
                             "--host", "0.0.0.0", "-c", "512", "--api-key", "k1"], cwd=ROOT, env=env, text=True,
                            encoding="utf-8", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == f"listening on http://0.0.0.0:{port} (web UI at /, API at /v1)\n"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "without an API key" not in err and "context: 512 tokens per sequence × 1 parallel sequence" in err


@pytest.mark.parametrize(("args", "needle", "code"), [
    (["no-such-model.gguf"], "model file not found: no-such-model.gguf", 1),
    (["{model}", "--decode", "fast"], "--decode must be auto, diffusion or ar", 2),  # a usage error
    (["{model}", "-c", "999999"], "larger than the model's context length", 1),
    (["{model}", "--api-key-file", "missing-keys.txt"], "cannot read --api-key-file", 1),
    (["{model}", "--chat-template-file", "missing.jinja"], "chat template file not found", 1),
])
def test_bad_input_is_one_clear_line(model, env, args, needle, code):
    res = _clover(["serve", *(a.format(model=model) for a in args)], env)
    assert res.returncode == code, res.stdout
    assert needle in res.stderr and "Traceback" not in res.stderr


def test_refuses_with_the_fit_table_when_it_cannot_fit(env):
    from synth_models import real_shape_sparse_path

    big = real_shape_sparse_path(n_layer=4)  # the real shape; its data section takes no disk
    res = _clover(["serve", str(big), "-c", "131072", "-np", "256"], env)  # -c per sequence
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "KV cache" in res.stderr and "does not fit" in res.stderr and "131,072" in res.stderr
    assert "listening on" not in res.stdout


def test_port_in_use_is_one_clear_line(model, env):
    taken = bind("127.0.0.1", 0)
    try:
        res = _clover(["serve", str(model), "--port", str(taken.getsockname()[1]), "-c", "512"], env)
    finally:
        taken.close()
    assert res.returncode == 1
    assert "cannot listen on 127.0.0.1" in res.stderr and "--port" in res.stderr and "Traceback" not in res.stderr
