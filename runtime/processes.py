"""How clover starts other processes without a window flashing up on Windows.

A console program started from a process that has no console window of its own (a detached server,
`clover.exe` under a GUI) gets a new, visible console. `CREATE_NO_WINDOW` gives it a console
without a window instead, which its own children (nvidia-smi) inherit, so nothing flashes, and
closing the terminal that ran `clover serve --detach` does not close the server.
`CREATE_NEW_PROCESS_GROUP` keeps that terminal's Ctrl+C away from it. `DETACHED_PROCESS` is not
used: a detached console program's every console child opens a new window.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# The values of subprocess.CREATE_NO_WINDOW / CREATE_NEW_PROCESS_GROUP, which exist only on Windows.
CREATE_NO_WINDOW = 0x08000000
CREATE_NEW_PROCESS_GROUP = 0x00000200


def creation_kwargs(*, detached: bool = False, os_name: str | None = None) -> dict:
    """Keyword arguments for `subprocess.Popen`/`run`: a helper (`detached=False`) runs without a
    window; a detached server also leaves the caller's process group (POSIX: its session)."""
    name = os.name if os_name is None else os_name
    if name == "nt":
        flags = CREATE_NO_WINDOW | (CREATE_NEW_PROCESS_GROUP if detached else 0)
        return {"creationflags": flags}
    return {"start_new_session": True} if detached else {}


def nvidia_smi(environ: dict[str, str] | None = None, os_name: str | None = None) -> str | None:
    """The nvidia-smi program: on PATH, else where the Windows driver installs it (the DCH driver puts
    it in System32; older drivers in Program Files\\NVIDIA Corporation\\NVSMI, not on PATH)."""
    found = shutil.which("nvidia-smi")
    if found:
        return found
    if (os.name if os_name is None else os_name) != "nt":
        return None
    env = os.environ if environ is None else environ
    for path in windows_nvidia_smi_paths(env):
        if path.is_file():
            return str(path)
    return None


def windows_nvidia_smi_paths(environ: dict[str, str]) -> list[Path]:
    """The places the Windows NVIDIA driver installs nvidia-smi.exe, in the order they are tried."""
    places = []
    system_root = environ.get("SystemRoot") or environ.get("SYSTEMROOT") or r"C:\Windows"
    places.append(Path(system_root) / "System32" / "nvidia-smi.exe")
    program_files = environ.get("ProgramFiles") or environ.get("PROGRAMFILES") or r"C:\Program Files"
    places.append(Path(program_files) / "NVIDIA Corporation" / "NVSMI" / "nvidia-smi.exe")
    return places
