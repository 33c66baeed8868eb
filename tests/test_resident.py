"""Weights read into memory (`--no-mmap`, and the default where they fit): the same bytes and the
same logits as the mapped file, on memory the OS was asked to back with huge pages, and the choice
made by the documented rule.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clover_runtime.errors import ModelFileError
from clover_runtime.loader import load_model
from clover_runtime.resident import (
    FIT_SHARE,
    HUGE_PAGE,
    anonymous_bytes,
    huge_pages_offered,
    keep_in_memory,
    read_bytes,
)
from serve_helpers import ROOT, clover_env
from synth_models import small_model_path

GIB = 1 << 30


def test_the_automatic_choice_follows_the_rule() -> None:
    if not huge_pages_offered():
        assert not keep_in_memory(1, 64 * GIB)  # no huge pages: the copy buys nothing, keep the mapping
        return
    assert keep_in_memory(int(FIT_SHARE * 32 * GIB), 32 * GIB)
    assert not keep_in_memory(int(FIT_SHARE * 32 * GIB) + 1, 32 * GIB)
    assert not keep_in_memory(21 * GIB, 28 * GIB)  # the Q4_K_M file on a 32 GB machine stays mapped


def test_read_bytes_are_the_file_s_bytes_on_aligned_memory(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 3 * HUGE_PAGE + 123, dtype=np.uint8)
    f = tmp_path / "blob"
    f.write_bytes(data.tobytes())
    got = read_bytes(f, 1000, 2 * HUGE_PAGE + 7)
    assert np.array_equal(got, data[1000:1000 + 2 * HUGE_PAGE + 7])
    assert got.ctypes.data % HUGE_PAGE == 0 and not got.flags.writeable
    with pytest.raises(ModelFileError, match="truncated"):
        read_bytes(f, data.size - 10, 11)
    assert anonymous_bytes(0).size == 0


@pytest.mark.skipif(not huge_pages_offered(), reason="this OS offers no transparent huge pages")
def test_anonymous_bytes_are_marked_for_huge_pages() -> None:
    buf = anonymous_bytes(4 * HUGE_PAGE)
    buf[:] = 1
    start = buf.ctypes.data
    smaps = Path("/proc/self/smaps").read_text(encoding="ascii")
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", smaps):
        lo, hi = (int(v, 16) for v in block.split()[0].split("-"))
        if lo <= start < hi:
            assert re.search(r"^VmFlags:.*\bhg\b", block, re.M), block  # MADV_HUGEPAGE took
            return
    raise AssertionError("the buffer's mapping is not in /proc/self/smaps")


def test_weights_in_memory_give_the_mapped_file_s_logits() -> None:
    path = small_model_path("Q4_K")
    ids = [5, 17, 3, 99, 42, 7]
    logits = {}
    for in_memory in (False, True):
        with load_model(path, n_threads=1, in_memory=in_memory) as m:
            assert m.weights.in_memory is in_memory
            mapped = np.frombuffer(m.file._maps[0], np.uint8)
            head = m.head.matrix.raw
            assert np.shares_memory(head, mapped) is (not in_memory)
            logits[in_memory] = m.forward(ids, m.new_state(64))
    np.testing.assert_array_equal(logits[True], logits[False])


def test_run_takes_mmap_and_no_mmap(tmp_path: Path) -> None:
    path = str(small_model_path("Q4_K"))
    outs = []
    for flag in ("--mmap", "--no-mmap"):
        res = subprocess.run([sys.executable, "-m", "clover_cli", "run", path, "hello", "-n", "4", "--decode", "ar",
                              "--no-think", "--temp", "0", flag], cwd=ROOT, env=clover_env(tmp_path),
                             capture_output=True, text=True, encoding="utf-8", timeout=300)
        assert res.returncode == 0 and "ignores" not in res.stderr, res.stderr
        outs.append(res.stdout)
    assert outs[0] == outs[1] and outs[0].strip()
