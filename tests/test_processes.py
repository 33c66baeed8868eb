"""How clover starts processes on each OS and what it says per OS (issue 41): no console window on
Windows for the detached server or a helper, a new session on POSIX for the server, nvidia-smi found
where the Windows driver puts it when it is not on PATH, and the REPL's end-of-input keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from clover_runtime.processes import (
    CREATE_NEW_PROCESS_GROUP,
    CREATE_NO_WINDOW,
    creation_kwargs,
    nvidia_smi,
    windows_nvidia_smi_paths,
)


def test_windows_flags_hide_the_console_and_never_detach_it() -> None:
    assert creation_kwargs(detached=True, os_name="nt") == {
        "creationflags": CREATE_NO_WINDOW | CREATE_NEW_PROCESS_GROUP}
    assert creation_kwargs(os_name="nt") == {"creationflags": CREATE_NO_WINDOW}
    detached_process = 0x00000008  # a detached console program's console children each open a window
    assert not creation_kwargs(detached=True, os_name="nt")["creationflags"] & detached_process


def test_posix_servers_get_their_own_session_and_helpers_nothing() -> None:
    assert creation_kwargs(detached=True, os_name="posix") == {"start_new_session": True}
    assert creation_kwargs(os_name="posix") == {}


def test_the_constants_are_windows_own() -> None:
    """The values stand in for subprocess's, which exist only on Windows."""
    if os.name != "nt":
        pytest.skip("subprocess.CREATE_NO_WINDOW exists only on Windows")
    assert CREATE_NO_WINDOW == subprocess.CREATE_NO_WINDOW
    assert CREATE_NEW_PROCESS_GROUP == subprocess.CREATE_NEW_PROCESS_GROUP


def test_the_kwargs_start_a_real_process_here() -> None:
    for detached in (False, True):
        res = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True,
                             timeout=60, **creation_kwargs(detached=detached))
        assert res.stdout.strip() == "ok"


@pytest.mark.parametrize("where", ["System32", "NVSMI"])
def test_nvidia_smi_is_found_in_the_windows_driver_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           where: str) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # not on PATH
    env = {"SystemRoot": str(tmp_path / "Windows"), "ProgramFiles": str(tmp_path / "Program Files")}
    system32, nvsmi = windows_nvidia_smi_paths(env)
    assert system32 == tmp_path / "Windows" / "System32" / "nvidia-smi.exe"
    assert nvsmi == tmp_path / "Program Files" / "NVIDIA Corporation" / "NVSMI" / "nvidia-smi.exe"
    assert nvidia_smi(env, os_name="nt") is None
    exe = system32 if where == "System32" else nvsmi
    exe.parent.mkdir(parents=True)
    exe.write_bytes(b"MZ")
    assert nvidia_smi(env, os_name="nt") == str(exe)
    assert nvidia_smi(env, os_name="posix") is None  # those folders mean nothing elsewhere


def test_nvidia_smi_on_path_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.name == "nt":
        pytest.skip("the stand-in nvidia-smi is a POSIX script")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Fake Card, 16384, 15872'\n", encoding="utf-8")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_smi({}, os_name="nt") == str(smi)
    from clover_runtime.memory_fit import nvidia_gpus

    assert [g.name for g in nvidia_gpus()] == ["Fake Card"]


def test_the_repl_names_the_end_of_input_keys_of_each_os() -> None:
    from clover_cli import repl

    assert repl.eof_key("nt") == "Ctrl-Z then Enter"
    assert repl.eof_key("posix") == "Ctrl-D"
    assert repl.EXIT_HINT == f"Use {repl.eof_key()} or /bye to exit."
    assert f"leave (also {repl.eof_key()})" in repl.HELP
