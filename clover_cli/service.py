"""Background servers: start one detached, remember it in a state file, list them, stop them.

Each running `clover serve` writes `<data dir>/servers/<port>.json` (pid, port, host, model, log,
a shutdown token) once it listens, and removes it when it exits. `clover stop` asks the server to
shut down over HTTP with that token, which works the same on POSIX and Windows and lets the server
cancel its in-flight generations and close its connections cleanly; a signal is the fallback.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from clover_runtime import atomic_write, paths
from clover_runtime.errors import CloverError
from clover_runtime.processes import creation_kwargs

LOG_ENV = "CLOVER_SERVE_LOG"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


@dataclass
class ServerRecord:
    pid: int
    port: int
    host: str
    model: str
    started: float
    token: str
    log: str | None = None
    version: str = ""
    shutdown_timeout: float = 0.0  # its --shutdown-timeout: `clover stop` waits that much longer

    @property
    def url(self) -> str:
        return f"http://{display_host(self.host)}:{self.port}"

    @property
    def local_url(self) -> str:
        """Where this machine reaches it (a wildcard bind is reached through loopback)."""
        host = self.host
        if host in ("0.0.0.0", "", "*"):
            host = "127.0.0.1"
        elif host in ("::", "[::]"):
            host = "::1"
        return f"http://{display_host(host)}:{self.port}"


def display_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def state_dir() -> Path:
    return paths.data_dir() / "servers"


def record_path(port: int) -> Path:
    return state_dir() / f"{port}.json"


def new_token() -> str:
    return secrets.token_urlsafe(24)


def write_record(record: ServerRecord) -> Path:
    """Atomically write the record, readable only by this user (it holds the shutdown token)."""
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = record_path(record.port)
    # Created 0600 and exclusively under a fresh name, so the token is never readable by others, not
    # even briefly (Windows ignores POSIX modes: the data folder is under the user's own profile).
    atomic_write.write_text(path, json.dumps(asdict(record), indent=2), mode=0o600)
    return path


def remove_record(port: int, pid: int | None = None) -> None:
    """Forget a server; with `pid`, only if the record is still that process's."""
    path = record_path(port)
    try:
        if pid is not None:
            data = json.loads(path.read_text(encoding="utf-8"))
            if int(data.get("pid", -1)) != pid:
                return
        path.unlink()
    except (OSError, ValueError):
        pass


def _read(path: Path) -> ServerRecord | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        fields = ServerRecord.__dataclass_fields__
        return ServerRecord(**{k: v for k, v in data.items() if k in fields})
    except (OSError, ValueError, TypeError):
        return None


def pid_alive(pid: int, started: float | None = None) -> bool:
    """True if `pid` runs and (given `started`) was not started after the record (pid reuse)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or proc.create_time() <= started + 5.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def list_servers(prune: bool = True) -> list[ServerRecord]:
    """Running servers, by port; records of processes that are gone are deleted on the way."""
    folder = state_dir()
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = _read(path)
        if record is None or not pid_alive(record.pid, record.started):
            if prune:
                path.unlink(missing_ok=True)
            continue
        records.append(record)
    return sorted(records, key=lambda r: r.port)


def find_server(port: int) -> ServerRecord | None:
    return next((r for r in list_servers() if r.port == port), None)


def http_get_status(url: str, timeout: float = 2.0) -> int | None:
    """Status code of GET `url`, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as res:  # noqa: S310 - our own loopback URL
            return res.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


def child_command(args: list[str]) -> list[str]:
    """How to run `clover serve ARGS` again: the frozen exe, or this interpreter with `-m clover_cli`."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "serve", *args]
    return [sys.executable, "-m", "clover_cli", "serve", *args]


def spawn_detached(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `clover serve ARGS` in its own session / process group, output appended to `log_path`;
    on Windows without a console window (`processes.creation_kwargs`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ if env is None else env)
    child_env[LOG_ENV] = str(log_path)
    child_env["PYTHONIOENCODING"] = "utf-8"
    child_env.setdefault("NO_COLOR", "1")
    with open(log_path, "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} clover serve {' '.join(args)}\n".encode())
        log.flush()
        return subprocess.Popen(child_command(args), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=child_env, close_fds=True,
                                **creation_kwargs(detached=True))


def tail(path: Path, n: int = 8) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def wait_ready(proc: subprocess.Popen, port: int, log_path: Path, timeout: float) -> ServerRecord:
    """Block until the detached server's /health is 200; fail with the log's tail if it dies first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        record = _read(record_path(port))
        if record is not None and pid_alive(record.pid, record.started):
            if http_get_status(f"{record.local_url}/health") == 200:
                return record
        elif code is not None:
            raise CloverError(f"the background server exited during start-up (exit code {code})",
                              f"see {log_path}:\n{tail(log_path)}")
        time.sleep(0.2)
    raise CloverError(f"the background server did not become ready within {timeout:g} s",
                      f"it may still be loading; check `clover ps` and {log_path}")


def stop_server(record: ServerRecord, timeout: float = 30.0) -> str:
    """Stop one server cleanly; returns how ("stopped" or "killed"). The server's own
    --shutdown-timeout (running replies finishing) is waited for on top of `timeout`."""
    import psutil

    try:
        proc = psutil.Process(record.pid)
    except psutil.NoSuchProcess:
        remove_record(record.port)
        return "stopped"
    if not _request_shutdown(record):
        proc.terminate()  # SIGTERM on POSIX (uvicorn shuts down gracefully); TerminateProcess on Windows
    how = "stopped"
    if not _wait_gone(proc, timeout + max(0.0, float(record.shutdown_timeout or 0.0))):
        proc.kill()
        how = "killed"
        if not _wait_gone(proc, 5.0):
            raise CloverError(f"the server on port {record.port} (pid {record.pid}) did not exit")
    remove_record(record.port)
    return how


def _wait_gone(proc: object, timeout: float) -> bool:
    """True once the process has exited. An exited child its parent has not reaped yet (a zombie,
    e.g. a foreground server started by a script) counts as gone: it holds no port and runs nothing."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:  # type: ignore[attr-defined]
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _request_shutdown(record: ServerRecord) -> bool:
    req = urllib.request.Request(f"{record.local_url}/_clover/shutdown", data=b"{}", method="POST",
                                 headers={"X-Clover-Shutdown-Token": record.token,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as res:  # noqa: S310 - our own loopback URL
            return res.status == 202
    except (urllib.error.URLError, OSError, ValueError):
        return False


def format_uptime(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"
