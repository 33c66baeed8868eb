"""Weights read into the process's own memory, on huge pages where the OS gives them.

A decode step streams every weight it uses from DRAM once. Mapped from the file, those bytes sit
on 4 KiB pages: the CPU's prefetchers stop at each page boundary and each page costs a TLB entry.
Read into private anonymous memory that asks for transparent huge pages (2 MiB), the same kernels
ran a real-shape decode step 6-10 % faster (benchmarks/RESULTS.md, issue 38). llama.cpp gets the
same effect from its repacked weights, which it copies into its own buffers at load.

The copy costs RAM that the page cache could give back, so `keep_in_memory` takes it only where
the OS has huge pages to give and the weights fit well inside the memory available now; `--mmap`
and `--no-mmap` decide it outright.
"""

from __future__ import annotations

import mmap
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .errors import ModelFileError

HUGE_PAGE = 2 << 20
FIT_SHARE = 0.7  # the weights may take this share of the memory available when the model loads
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_offered() -> bool:
    """Whether this OS backs anonymous memory with transparent huge pages on request (Linux with
    THP set to `always` or `madvise`)."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        mode = _THP.read_text(encoding="ascii")
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def keep_in_memory(weight_bytes: int, available_bytes: int | None = None) -> bool:
    """The automatic choice: read the weights into memory when huge pages are offered and the
    weights take at most FIT_SHARE of the memory available now; else leave them mapped."""
    if not huge_pages_offered():
        return False
    if available_bytes is None:
        import psutil

        available_bytes = int(psutil.virtual_memory().available)
    return weight_bytes <= FIT_SHARE * available_bytes


def anonymous_bytes(n: int) -> np.ndarray:
    """n writable bytes of private anonymous memory, 2 MiB-aligned and marked for huge pages where
    the OS has them (the array keeps its mapping alive)."""
    if n == 0:
        return np.empty(0, np.uint8)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    region = mmap.mmap(-1, n + HUGE_PAGE, flags=flags) if flags else mmap.mmap(-1, n + HUGE_PAGE)
    whole = np.frombuffer(region, np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            region.madvise(mmap.MADV_HUGEPAGE)
        except (OSError, ValueError):
            pass  # the kernel refused: plain pages, the same bytes
    return whole[start:start + n]


def read_bytes(path: Path, offset: int, n: int) -> np.ndarray:
    """Bytes offset..offset+n of a file read into `anonymous_bytes` (read, not mapped, so the
    file's pages never count in this process's memory), read-only."""
    return read_slices([(path, offset, n)], 1)


def read_slices(sources: Sequence[tuple[Path, int, int]], count: int) -> np.ndarray:
    """Byte ranges (path, offset, n), each made of `count` equal slices (a stack of experts),
    read into one `anonymous_bytes` buffer slice by slice: slice 0 of every range in order, then
    slice 1, ... (so each expert's matrices of several stacks lie together), read-only."""
    sizes = [n // count for _, _, n in sources]
    if any(size * count != n for size, (_, _, n) in zip(sizes, sources, strict=True)):
        raise ValueError(f"byte ranges are not {count} equal slices each")
    out = anonymous_bytes(sum(sizes) * count)
    view = memoryview(out)
    handles: dict[Path, BinaryIO] = {}
    try:
        pos = 0
        for e in range(count):
            for (path, offset, _), size in zip(sources, sizes, strict=True):
                fh = handles.get(path)
                if fh is None:
                    fh = handles[path] = open(path, "rb")  # noqa: SIM115 - closed in the finally
                _read_into(fh, path, offset + e * size, view[pos:pos + size])
                pos += size
    finally:
        for fh in handles.values():
            fh.close()
    out.flags.writeable = False
    return out


def _read_into(fh: BinaryIO, path: Path, offset: int, view: memoryview) -> None:
    fh.seek(offset)
    done = 0
    while done < len(view):
        got = fh.readinto(view[done:])
        if not got:
            raise ModelFileError(f"{path.name}: truncated file (a tensor ends past the end of the file)")
        done += got
