"""One decode step of a Gated DeltaNet layer's recurrence at the real shape: numpy against the kernel.

    python benchmarks/gdn_step.py [--threads 1] [-r 40]

The numpy form (copy the state, the per-token recurrence, copy the new state back: what decode did
before `kernels.gdn_recurrent`) and the compiled kernel updating the state in place, alternated in
one process so that both see the same machine. Clover has 30 such layers per token.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from clover_runtime.engine.gdn import recurrent
from clover_runtime.kernels import gdn_recurrent, set_threads


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("-r", "--repetitions", type=int, default=40)
    args = p.parse_args(argv)
    set_threads(args.threads)
    rng = np.random.default_rng(0)
    hk, hv, d = 16, 32, 128  # Clover's key heads, value heads and head size
    q, k = (rng.standard_normal((1, hk, d)).astype(np.float32) for _ in range(2))
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(d)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((1, hv, d)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (1, hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (1, hv)).astype(np.float32)
    state = rng.standard_normal((hv, d, d)).astype(np.float32)
    gdn_recurrent(q, k, v, g, beta, state, state.copy())  # compile (or load) first
    numpy_s, kernel_s = [], []
    for _ in range(args.repetitions):
        t = time.perf_counter()
        _, new = recurrent(q, k, v, beta, g, state.copy())
        state[...] = new
        numpy_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        gdn_recurrent(q, k, v, g, beta, state, state)
        kernel_s.append(time.perf_counter() - t)
    for name, xs in (("numpy", numpy_s), ("kernel", kernel_s)):
        print(f"{name:6s} threads {args.threads}: median {np.median(xs) * 1e3:.3f} ms, min {min(xs) * 1e3:.3f} ms")
    print(f"speed-up (medians): {np.median(numpy_s) / np.median(kernel_s):.2f}x")


if __name__ == "__main__":
    main()
