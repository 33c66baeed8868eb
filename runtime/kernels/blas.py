"""Keep numpy's BLAS to one thread while the kernels run, and give large products a thread pool.

OpenBLAS worker threads spin for a while after every call; interleaved with numba's parallel
kernels (one weight product after another) the two pools fight over the cores and both slow down
several-fold. So the compiled path runs sgemm single-threaded, splitting large products into tiles
on its own pool of Python threads (numpy and the nogil kernels release the GIL).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads_64_",
            "openblas_set_num_threads64_", "openblas_set_num_threads", "MKL_Set_Num_Threads")
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_blas_threads: int | None = None  # the count last applied (the setting is process-wide)


def _candidates() -> list[Path]:
    import numpy as np

    root = Path(np.__file__).resolve().parent
    found = []
    for folder in (root.parent / "numpy.libs", root / ".dylibs"):
        if folder.is_dir():
            found += [p for p in folder.iterdir() if any(k in p.name.lower() for k in ("openblas", "mkl_rt"))]
    if sys.platform.startswith("linux"):
        try:
            maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
            found += [Path(line.split()[-1]) for line in maps.splitlines()
                      if "openblas" in line.lower() and line.split()[-1].startswith("/")]
        except OSError:
            pass
    return found


@functools.cache
def _setter() -> Callable[[ctypes.c_int], object] | None:
    """numpy's BLAS thread-count function, found once (a scan of the loaded libraries costs ms)."""
    for path in dict.fromkeys(_candidates()):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn
    return None


def set_blas_threads(n: int) -> bool:
    """Set numpy's BLAS thread count where the library lets us; False when it could not be found.

    The count is process-wide, so a repeated request for the count already set costs nothing.
    """
    global _blas_threads
    fn = _setter()
    if fn is None:
        return False
    if _blas_threads != int(n):
        fn(ctypes.c_int(int(n)))
        _blas_threads = int(n)
    return True


def pool(n_threads: int) -> ThreadPoolExecutor:
    """The shared pool for tiled products, resized when the thread count changes."""
    global _pool, _pool_size
    if _pool is None or _pool_size != n_threads:
        if _pool is not None:
            _pool.shutdown(wait=True)
        _pool = ThreadPoolExecutor(max_workers=max(1, n_threads), thread_name_prefix="clover-blas")
        _pool_size = n_threads
    return _pool
