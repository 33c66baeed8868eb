"""llama.cpp's GPU flags on the real `clover` entry point: `-ngl`, `--cpu-moe`, `--n-cpu-moe`,
`--device`, `--main-gpu` in run, serve and bench. Without torch they answer one line saying how to
get it (a folder whose `torch` fails to import stands in for a machine without it); with torch,
`--device cpu` runs the torch backend on the CPU and says so in the banner and bench's JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synth_models import tiny_model_path

HINT = 'error: GPU offload needs torch: pip install "clover-cli[gpu]"'


def _clover(*args: str, home: Path, no_torch: bool = False,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "COLUMNS": "120",
           **(env or {})}
    for var in ("CLOVER_DEBUG", "CLOVER_HOME", "CLOVER_CACHE"):
        env.pop(var, None)
    if no_torch:
        shim = home / "no-torch" / "torch"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n", encoding="utf-8")
        env["PYTHONPATH"] = os.pathsep.join([str(shim.parent), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], capture_output=True, text=True,
                          encoding="utf-8", env=env, timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def model() -> str:
    return str(tiny_model_path("Q8_0"))


def _torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("command,args", [
    ("run", ["hello", "-n", "4", "-ngl", "99", "--device", "cuda"]),
    ("run", ["hello", "-n", "4", "--cpu-moe", "--device", "cuda"]),
    ("serve", ["--device", "cuda", "--port", "0"]),
    ("bench", ["-ngl", "all", "--device", "cuda", "-p", "0", "-n", "4", "-dg", "0", "-r", "1"]),
])
def test_without_torch_asking_for_a_device_says_how_to_get_it(command: str, args: list[str], model: str,
                                                              tmp_path: Path) -> None:
    res = _clover(command, model, *args, home=tmp_path, no_torch=True)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines()[0] == HINT, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("command,args", [
    ("run", ["hello", "-n", "4", "--no-think", "-v", "-ngl", "99"]),
    ("bench", ["-ngl", "all", "-p", "0", "-n", "4", "-dg", "0", "-r", "1", "-o", "json"]),
])
def test_without_torch_a_pasted_ngl_warns_and_runs_on_the_cpu(command: str, args: list[str], model: str,
                                                              tmp_path: Path) -> None:
    """llama.cpp runs `-ngl 99` on the CPU where there is no GPU; so does clover, saying so once."""
    res = _clover(command, model, *args, home=tmp_path, no_torch=True)
    assert res.returncode == 0, res.stderr
    flag = args[args.index("-ngl") + 1]
    warning = f"warning: -ngl {flag} ignored: {HINT.removeprefix('error: ')}; running on the CPU"
    assert res.stderr.splitlines().count(warning) == 1, res.stderr
    if command == "run":
        assert "weights: CPU only" in res.stderr and res.stdout.strip()
    else:
        assert json.loads(res.stdout)[0]["n_gpu_layers"] == 0


def test_without_torch_the_default_runs_on_the_cpu(model: str, tmp_path: Path) -> None:
    res = _clover("run", model, "hello", "-n", "4", "--no-think", "-v", home=tmp_path, no_torch=True)
    assert res.returncode == 0, res.stderr
    assert "weights: CPU only" in res.stderr


def test_a_bad_layer_count_is_one_line(model: str, tmp_path: Path) -> None:
    res = _clover("run", model, "hello", "-ngl", "lots", home=tmp_path)
    assert res.returncode == 2  # a usage error
    assert res.stderr.strip().splitlines()[0] == "error: -ngl takes a layer count, auto or all, not 'lots'"


@pytest.mark.skipif(not _torch_importable(), reason="torch is not installed (the gpu extra)")
def test_torch_on_the_cpu_device_runs_and_reports_the_placement(model: str, tmp_path: Path) -> None:
    res = _clover("run", model, "hello", "-n", "4", "--no-think", "-v", "-ngl", "99", "--device", "cpu",
                  "--n-cpu-moe", "2", home=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "weights: torch CPU: 4/4 layers and the head, routed experts of the first 2 layers on the CPU" \
        in res.stderr, res.stderr
    res = _clover("bench", model, "-ngl", "3", "--device", "cpu", "-p", "0", "-n", "4", "-dg", "0", "-r", "1",
                  "-o", "json", home=tmp_path)
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)[0]
    assert (rec["gpu_info"], rec["n_gpu_layers"], rec["backends"]) == ("torch CPU", 3, "torch-CPU,CPU")


@pytest.mark.skipif(not _torch_importable(), reason="torch is not installed (the gpu extra)")
def test_asking_for_a_gpu_where_there_is_none_warns_and_runs_on_the_cpu(model: str, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has a GPU")
    res = _clover("run", model, "hello", "-n", "4", "-ngl", "99", home=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines()[0] == ("warning: -ngl 99 ignored: no GPU found (torch sees no CUDA "
                                                  "device); running on the CPU"), res.stderr
    res = _clover("run", model, "hello", "-n", "4", "--device", "cuda", home=tmp_path)
    assert res.returncode == 1 and res.stderr.startswith("error: device 'cuda': torch sees no CUDA GPU")



@pytest.mark.parametrize("request_", [dict(), dict(n_gpu_layers=99, cpu_moe=True, device="cpu"),
                                      dict(n_gpu_layers=0), dict(n_cpu_moe=30, main_gpu=1, device="cuda")])
def test_a_detached_server_gets_the_same_gpu_flags(request_: dict) -> None:
    """`clover serve --detach` rebuilds its GPU flags for the child process: parsed by the same
    options, they give the same request."""
    import typer
    from clover_runtime.offload import OffloadRequest
    from typer.testing import CliRunner

    from clover_cli.options import (
        cpu_moe_option,
        device_option,
        main_gpu_option,
        n_cpu_moe_option,
        ngl_option,
        offload_request,
    )
    from clover_cli.serve_cmd import _offload_args

    seen = []

    def command(n_gpu_layers: str | None = ngl_option(), cpu_moe: bool = cpu_moe_option(),
                n_cpu_moe: int = n_cpu_moe_option(), device: str = device_option(),
                main_gpu: int = main_gpu_option()) -> None:
        seen.append(offload_request(n_gpu_layers, cpu_moe, n_cpu_moe, device, main_gpu))

    app = typer.Typer()
    app.command()(command)
    wanted = OffloadRequest(**request_)
    res = CliRunner().invoke(app, _offload_args(wanted), env={})
    assert res.exit_code == 0, res.output
    assert seen == [wanted]


@pytest.mark.skipif(os.name == "nt", reason="the stand-in nvidia-smi is a POSIX script")
@pytest.mark.skipif(not _torch_importable(), reason="the GPU path needs torch")
def test_the_check_before_loading_counts_ram_without_the_gpus_weights(model: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """A 16 GB card as nvidia-smi reports it (a stand-in script on PATH): with -ngl 99 the RAM
    check counts only the weights left in system memory, and the per-GPU fit is printed."""
    from clover_runtime.offload import OffloadRequest

    from clover_cli.model_setup import prepare

    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'Fake Card, 16384, 15872'\n", encoding="utf-8")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    plain = prepare(model, ctx=512)
    capsys.readouterr()
    offloaded = prepare(model, ctx=512, offload=OffloadRequest(99))
    err = capsys.readouterr().err
    assert "gpu: GPU 0 Fake Card: 15.5 GiB free of 16.0 GiB; -ngl 99 fits at -c 512 (" in err, err
    assert offloaded.verdict.needed < plain.verdict.needed  # the offloaded weights left the RAM sum


def _cpu_torch_machine(home: Path) -> dict[str, str]:
    """PyPI's Windows torch on an NVIDIA machine: a stand-in `torch` that is a CPU-only build (no
    CUDA version) and a stand-in nvidia-smi that lists a 16 GB card."""
    shim = home / "cpu-torch" / "torch"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text(
        "__version__ = '2.9.1+cpu'\n"
        "class version:\n    cuda = None\n    hip = None\n"
        "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n"
        "class backends:\n    mps = None\n", encoding="utf-8")
    smi = home / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text("#!/bin/sh\necho 'NVIDIA GeForce RTX 4080, 16376, 15000'\n", encoding="utf-8")
    smi.chmod(0o755)
    return {"PYTHONPATH": os.pathsep.join([str(shim.parent), os.environ.get("PYTHONPATH", "")]),
            "PATH": os.pathsep.join([str(smi.parent), os.environ["PATH"]])}


CUDA_LINE = "pip install torch --index-url https://download.pytorch.org/whl/cu128"


@pytest.mark.skipif(os.name == "nt", reason="the stand-in nvidia-smi is a POSIX script")
def test_a_cpu_torch_beside_an_nvidia_gpu_says_how_to_get_the_cuda_build(model: str, tmp_path: Path) -> None:
    env = _cpu_torch_machine(tmp_path)
    res = _clover("run", model, "hello", "-n", "4", "--no-think", home=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    warning = [line for line in res.stderr.splitlines() if "CPU-only build" in line]
    assert warning == ["warning: torch 2.9.1+cpu is a CPU-only build, so NVIDIA GeForce RTX 4080 is not used; "
                       f"for GPU offload install the CUDA build: {CUDA_LINE}"], res.stderr

    # a pasted -ngl 99 runs on the CPU, as llama.cpp does, and its one warning says how to fix torch
    res = _clover("run", model, "hello", "-n", "4", "-ngl", "99", "--no-think", home=tmp_path, env=env)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    warning = [line for line in res.stderr.splitlines() if line.startswith("warning: -ngl")]
    assert warning == ["warning: -ngl 99 ignored: torch 2.9.1+cpu is a CPU-only build, so it cannot use the NVIDIA "
                       f"GPU; install the CUDA build: {CUDA_LINE}; running on the CPU"], res.stderr

    res = _clover("doctor", "--json", home=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["cpu_torch"] == "2.9.1+cpu"
    assert report["system"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 4080"
    res = _clover("doctor", home=tmp_path, env=env)
    assert CUDA_LINE in res.stderr, res.stderr


def test_without_an_nvidia_gpu_nothing_is_said_about_the_cuda_build(model: str, tmp_path: Path) -> None:
    res = _clover("run", model, "hello", "-n", "4", "--no-think", home=tmp_path, no_torch=True)
    assert res.returncode == 0, res.stderr
    assert "CPU-only build" not in res.stderr
    res = _clover("doctor", "--json", home=tmp_path, no_torch=True)
    assert json.loads(res.stdout)["cpu_torch"] is None
