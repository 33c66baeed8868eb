"""numba, imported with its compile cache in a writable per-user directory.

numba reads NUMBA_CACHE_DIR when it is imported, and its default (next to the source file) is not
writable in a site-packages install, so every kernel module imports numba through here: the first
run compiles (seconds per kernel), later runs load the cached machine code (a fraction of a second).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import sys
import threading
from pathlib import Path

from ..paths import numba_cache_dir


def kernel_cache_dir() -> Path:
    """The per-user cache directory for clover's compiled kernels (honours CLOVER_HOME)."""
    return numba_cache_dir()


def _sources_stamp() -> str:
    """A short digest of this package's sources (and of CLOVER_SIMD, which picks the code they
    generate), naming the cache directory of this version.

    numba checks only the modification time of the file defining a cached function, not of the
    files its callees live in (the vector code generators), so a changed callee needs a fresh cache.
    """
    h = hashlib.sha1()
    if getattr(sys, "frozen", False):  # clover.exe: its sources are inside it, so the executable names the version
        st = Path(sys.executable).stat()
        h.update(f"frozen:{st.st_size}:{st.st_mtime_ns}".encode())
        return h.hexdigest()[:12]
    for f in sorted(Path(__file__).parent.glob("*.py")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    h.update(f"simd:{os.environ.get('CLOVER_SIMD', '').strip().lower()}".encode())  # intdot.x86_avx512
    return h.hexdigest()[:12]


def _configure() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    path = kernel_cache_dir() / _sources_stamp()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # numba then falls back to its own choice; kernels still work, only uncached
    os.environ["NUMBA_CACHE_DIR"] = str(path)


_configure()

import numba  # noqa: E402  (must follow the cache configuration)

if not numba.config.CACHE_DIR and os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]  # numba was imported before us

def _frozen_cache_locator() -> None:
    """Cache the kernels of a frozen clover.exe in the user's kernel cache under stable names.

    A PyInstaller one-file build unpacks its modules into a new temporary folder on every start.
    numba's own locators then either find no source file, or (its user-wide locator) name the cache
    after that folder and hash the whole executable: every run compiled the kernels again. This
    locator names each module's cache by its import name inside NUMBA_CACHE_DIR, which already
    carries the executable's stamp (`_sources_stamp`)."""
    if not getattr(sys, "frozen", False) or not numba.config.CACHE_DIR:
        return
    from numba.core import caching

    class FrozenCacheLocator(caching._CacheLocator):
        def __init__(self, py_func: object, py_file: str) -> None:
            self._lineno = py_func.__code__.co_firstlineno  # type: ignore[attr-defined]
            self._cache_path = os.path.join(numba.config.CACHE_DIR, py_func.__module__)  # type: ignore[attr-defined]

        def get_cache_path(self) -> str:
            return self._cache_path

        def get_source_stamp(self) -> object:
            st = os.stat(sys.executable)
            return st.st_mtime, st.st_size

        def get_disambiguator(self) -> str:
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func: object, py_file: str) -> FrozenCacheLocator | None:
            self = cls(py_func, py_file)
            try:
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)  # numba ≥ 0.61: public
    locators = getattr(impl, "_locator_classes", None)
    if isinstance(locators, list) and not any(c.__name__ == "FrozenCacheLocator" for c in locators):
        locators.insert(0, FrozenCacheLocator)


_frozen_cache_locator()

# numba's `workqueue` threading layer aborts the process when two threads run parallel kernels at
# once, which the server's slots (`-np 2`) do. It is the fallback where neither TBB nor OpenMP loads
# (macOS pip installs, Windows without the VC++ OpenMP runtime): pick a thread-safe layer that loads,
# else serialise the model's passes (`pass_lock`).
_SAFE_LAYERS = (("tbb", "tbbpool"), ("omp", "omppool"))


def _layer_loads(module: str) -> bool:
    try:
        importlib.import_module(f"numba.np.ufunc.{module}")
    except (ImportError, OSError):
        return False
    return True


def choose_threading_layer() -> str:
    """The numba threading layer clover uses: NUMBA_THREADING_LAYER when the user set one, else the
    first thread-safe layer whose library loads (tbb, omp), else `workqueue`."""
    asked = os.environ.get("NUMBA_THREADING_LAYER", "").strip().lower()
    if asked and asked != "default":
        return asked
    return next((name for name, module in _SAFE_LAYERS if _layer_loads(module)), "workqueue")


THREADING_LAYER = choose_threading_layer()
numba.config.THREADING_LAYER = THREADING_LAYER
# One pass at a time across threads when the layer cannot run two (reentrant: a pass may call another).
_SERIAL = threading.RLock() if THREADING_LAYER == "workqueue" else None


def serialized() -> bool:
    """True when parallel kernels run one thread's pass at a time (the `workqueue` layer)."""
    return _SERIAL is not None


def pass_lock() -> threading.RLock | None:
    """The lock a model's passes take on `workqueue` (one pass at a time across threads), else None."""
    return _SERIAL


njit = numba.njit
prange = numba.prange
_local = threading.local()  # the count set_threads applied in each thread


@functools.cache
def _default_threads() -> int:
    return default_threads()


def default_threads() -> int:
    """Physical cores (hyper-threads share the vector units the kernels saturate)."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # noqa: BLE001 - a fallback, never a failure
        n = None
    return int(n or os.cpu_count() or 1)


def set_threads(n: int | None) -> int:
    """Use `n` threads in the kernels (None: physical cores); returns the number in use.

    numba's setting belongs to the calling thread: call this in the thread that runs forwards.
    numpy's BLAS is set to one thread: large products get their own pool (see `blas`).
    """
    from .blas import set_blas_threads

    want = max(1, min(int(n or _default_threads()), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != want:
        numba.set_num_threads(want)
    set_blas_threads(1)
    _local.threads = want
    return want


PARALLEL_VALUES = 32768  # fewer values are worked in the calling thread (`parallel_pays`)


def parallel_pays(values: int) -> bool:
    """Whether an element-wise kernel over `values` floats runs its parallel form: only with
    more than one thread and enough work. A parallel launch costs ~5 us even at one thread,
    more than quantizing, norming or gating a 32-row block of the demo model (4,096 values,
    ~2 us serially), and a block pass makes ~100 such calls."""
    return values >= PARALLEL_VALUES and current_threads() > 1


def current_threads() -> int:
    """The kernels' thread count in the calling thread, as last set here (cheaper than asking numba)."""
    n = getattr(_local, "threads", None)
    return n if n is not None else numba.get_num_threads()
