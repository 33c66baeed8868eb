"""Whether a decode step's Q4_K/Q5_K rows take the eight-row pass (`gemv_x8`) on this machine:
measured once per process and thread count, not assumed from the CPU's flags.

The eight-row pass needs fewer instructions per weight (47 against ~75 for a Q4_K block on
AVX-512), so where one thread is bound by instructions it pays: a decode step 1.17-1.20x faster
on the VM where it was written. On an AMD EPYC of family 25, model 17 (Zen 4, whose 512-bit
shuffles take two passes through 256-bit units) the same pass first made a step 0.70x as fast:
its prefetches went into L1 there. With them stopping at L2, 32 KB ahead, it takes 0.71x the
one-row pass's time on this measurement at one thread and 0.93x at two (a decode step 1.29x and
1.02x faster). Both passes give the same bits, so the choice is only about speed: the first
decode step at a thread count times both on a 66 MB Q4_K matrix (past the last-level cache, as a
step's weights are), alternating, and keeps the eight-row pass only where it is at least 3 %
faster (~0.1 s, once per process and thread count; a record on disk could outlive the host a VM
runs on). `CLOVER_X8=on` or `off` skips the measurement.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

import numpy as np

from ..quants.formats import Q4_K
from .intdot import INT_GEOMETRY
from .intmatmul import INT_KERNELS
from .jit import current_threads
from .moe_rows import work_items
from .q8 import quantize_rows

ROWS, N_IN = 57344, 2048  # 66 MB of Q4_K rows
MARGIN = 0.97  # the eight-row pass must take at most this share of the one-row pass's time
_choice: dict[int, bool] = {}
_lock = threading.Lock()


def x8_pays() -> bool:
    """Whether one activation row takes the eight-row pass at the calling thread's kernel thread
    count (measured on first use; CLOVER_X8=on/off decides instead)."""
    mode = os.environ.get("CLOVER_X8", "").strip().lower()
    if mode in ("on", "1", "yes"):
        return True
    if mode in ("off", "0", "no"):
        return False
    n = current_threads()
    got = _choice.get(n)
    if got is None:
        with _lock:
            got = _choice.get(n)
            if got is None:
                x8_s, one_s = measure()
                got = _choice[n] = x8_s <= MARGIN * one_s
    return got


def measure(rounds: int = 5) -> tuple[float, float]:
    """Median seconds of the eight-row and of the one-row pass over ROWS x N_IN Q4_K weights
    against one activation row, the passes alternating (after one unmeasured pass each)."""
    tsize, block, _ = INT_GEOMETRY[Q4_K]
    n_blocks = N_IN // block
    raw = np.full(ROWS * n_blocks * tsize, 17, np.uint8)  # written, so every page is mapped; values do not matter
    xq = quantize_rows(np.ones((1, N_IN), np.float32), block)
    starts = np.array([0, 1], np.int64)
    dest = np.zeros(1, np.int64)
    items = work_items(np.zeros(1, np.int64), ROWS, 64)
    y = np.empty((1, ROWS), np.float32)
    kernel = INT_KERNELS[Q4_K]
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds + 1):
        for eight in (True, False):
            t0 = time.perf_counter()
            kernel(eight, raw, n_blocks, tsize, raw.size, xq.q, xq.d, xq.sums, starts, *items, dest, y)
            if i:
                times[eight].append(time.perf_counter() - t0)
    return statistics.median(times[True]), statistics.median(times[False])
