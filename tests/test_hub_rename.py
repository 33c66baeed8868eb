"""The final rename of a download on Windows (issue 41): an antivirus that holds the fresh file for a
moment is waited out; a lock that stays is one line and the verified file is kept. `chattr +i`
(root, ext4) makes the rename fail with PermissionError as such a lock does."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from clover_runtime.errors import HubError
from clover_runtime.hub.download import replace_retrying


def _immutable(path: Path, on: bool) -> bool:
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


@pytest.fixture()
def locked(tmp_path: Path):
    src = tmp_path / "blob.incomplete"
    src.write_bytes(b"verified bytes")
    if not _immutable(src, True):
        pytest.skip("chattr +i is not available here (root and ext4/xfs/btrfs)")
    yield src
    _immutable(src, False)


def test_a_brief_lock_is_waited_out(locked: Path) -> None:
    dst = locked.with_name("blob")
    timer = threading.Timer(0.5, _immutable, (locked, False))  # the scanner lets go
    timer.start()
    try:
        replace_retrying(locked, dst)
    finally:
        timer.cancel()
    assert dst.read_bytes() == b"verified bytes" and not locked.exists()


def test_a_lock_that_stays_is_one_line_and_the_file_is_kept(locked: Path) -> None:
    dst = locked.with_name("blob")
    with pytest.raises(HubError) as err:
        replace_retrying(locked, dst, delays=(0.01, 0.02))
    assert err.value.message.startswith(f"cannot move blob.incomplete to {dst}: another program holds it")
    assert "run the same command again" in (err.value.hint or "")
    assert locked.read_bytes() == b"verified bytes" and not dst.exists()


def test_other_errors_are_not_retried(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        replace_retrying(tmp_path / "missing", tmp_path / "blob", delays=(5.0,))
