"""The eight-row decode pass (`kernels.gemv_x8`) against the one-row pass, in one process.

Loads a GGUF file once and decodes random tokens, switching every bound matrix between the two
passes token by token (`Matrices.x8`), so both see the same memory, the same cache state and the
same neighbours on a shared machine; a separate process per form moved by ±15 % here. Both give
the same bits, so the text is not compared. Prints the median ms a token of each and their ratio.

    python benchmarks/gemv_x8.py FILE [--threads 1 2] [-n 16]

The runtime uses the eight-row pass (Q4_K, Q5_K) where its own quick measurement at startup finds
it faster (`kernels.x8_choice`, printed here beside the step timings); this script forces each
pass in turn (CLOVER_X8=on, then each matrix's `x8` switch) to show the whole step.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clover_runtime import load_model  # noqa: E402
from clover_runtime.kernels import set_threads  # noqa: E402

kernel_matmul = importlib.import_module("clover_runtime.kernels.matmul")  # the module: `kernels.matmul` is a function
x8_choice = importlib.import_module("clover_runtime.kernels.x8_choice")


def _matrices(model) -> list:
    w = model.weights
    return [m for m in (*w._bound.values(), *w._fused.values()) if isinstance(m, kernel_matmul.Matrices)]


def run(path: str, threads: int, n: int) -> tuple[float, float]:
    model = load_model(path, n_threads=threads)
    set_threads(threads)
    mats = [m for m in _matrices(model) if m.x8]
    before = os.environ.get("CLOVER_X8")
    state = model.new_state(n_ctx=1024)
    rng = np.random.default_rng(0)
    model.forward(rng.integers(0, 1000, 16), state=state, last_only=True)
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        os.environ["CLOVER_X8"] = "on"  # the pass as each matrix is set, whatever the measurement chose
        for i in range(n + 2):
            for on in (True, False):
                for m in mats:
                    m.x8 = on
                t0 = time.perf_counter()
                model.forward([int(rng.integers(0, 1000))], state=state, last_only=True)
                if i >= 2:  # the first two tokens of each form warm it up
                    times[on].append(time.perf_counter() - t0)
    finally:
        if before is None:
            os.environ.pop("CLOVER_X8", None)
        else:
            os.environ["CLOVER_X8"] = before
        model.close()
    return statistics.median(times[True]), statistics.median(times[False])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("-n", type=int, default=16, help="tokens of each form")
    args = ap.parse_args()
    print("| threads | eight-row pass (ms a token) | one-row pass | speed-up | startup measurement: eight-row / "
          "one-row ms (66 MB Q4_K) | the runtime's choice |")
    print("|---|---|---|---|---|---|")
    for t in args.threads:
        x8, one = run(args.file, t, args.n)
        set_threads(t)
        m8, m1 = x8_choice.measure()
        chosen = "eight-row" if m8 <= x8_choice.MARGIN * m1 else "one-row"
        print(f"| {t} | {1e3 * x8:.2f} | {1e3 * one:.2f} | **{one / x8:.2f}x** | {1e3 * m8:.2f} / {1e3 * m1:.2f} | "
              f"{chosen} |", flush=True)


if __name__ == "__main__":
    main()
