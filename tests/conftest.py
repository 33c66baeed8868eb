"""Shared pytest set-up: make tests/ importable for the helper modules that live beside the tests,
and give the whole session one compiled-kernel cache.

Many tests run the CLI in a subprocess with a fresh HOME or CLOVER_HOME, where clover would put
its numba cache (clover_runtime.kernels.jit), so each of them compiled every kernel again (tens of
seconds apiece). NUMBA_CACHE_DIR, which clover honours before its own choice, is set here before
any kernel module is imported, and subprocesses inherit it: the session compiles each kernel once.
The directory is new for each session, so a session never loads code compiled from older sources.
A NUMBA_CACHE_DIR already in the environment is kept.

CLOVER_HOME gets a session directory too (unless set), so tests that open model files never write
into the user's cache (`clover_runtime.file_cache` keeps parsed headers there); tests that need
their own home still set or remove it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

if not os.environ.get("NUMBA_CACHE_DIR"):
    _kernel_cache = tempfile.mkdtemp(prefix="clover-test-kernels-")
    os.environ["NUMBA_CACHE_DIR"] = _kernel_cache
    atexit.register(shutil.rmtree, _kernel_cache, ignore_errors=True)

if not os.environ.get("CLOVER_HOME"):
    _home = tempfile.mkdtemp(prefix="clover-test-home-")
    os.environ["CLOVER_HOME"] = _home
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
