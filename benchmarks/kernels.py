"""Kernel throughput per quant type: compiled kernels (clover_runtime.kernels) against the numpy path.

Prints weights/s and GFLOP/s for a dense (out, in) product at batch 1 and batch N, and for one MoE
layer's gate projection (256 experts x 512 x 2048, top-8) at batch 1 and a prefill-sized batch.
Medians of several runs; machines shared with other work are noisy, so compare columns of one run.

    python benchmarks/kernels.py [--threads 2] [--types Q4_K,Q6_K] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clover_runtime.kernels import matmul, moe_matmul, set_threads  # noqa: E402
from clover_runtime.quants import dequantize_rows, quantize, type_name  # noqa: E402
from clover_runtime.quants.formats import SUPPORTED_TYPES  # noqa: E402

_BY_NAME = {type_name(t): t for t in SUPPORTED_TYPES}


def _median_s(fn, repeat: int) -> float:
    fn()  # compile / warm caches
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _numpy_path(raw: np.ndarray, t: int, n_out: int, n_in: int, x: np.ndarray) -> np.ndarray:
    """The reference: dequantize the whole matrix, then BLAS."""
    return x @ dequantize_rows(raw, t, n_in, slice(0, n_out)).T


def _fake_quantized(t: int, n_rows: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """A valid tensor of n_rows rows without quantizing millions of weights: tile a small one."""
    base = quantize(rng.standard_normal((64, n_in)).astype(np.float32), t).reshape(64, -1)
    return np.tile(base, (n_rows // 64, 1)).reshape(-1)


def dense_rows(t: int, n_out: int, n_in: int, batch: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    raw = _fake_quantized(t, n_out, n_in, rng)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    k = _median_s(lambda: matmul(raw, t, n_out, n_in, x), repeat)
    r = _median_s(lambda: _numpy_path(raw, t, n_out, n_in, x), max(1, repeat // 3))
    w = n_out * n_in
    return {"weights_per_s": w / k, "gflops": 2 * w * batch / k / 1e9, "numpy_weights_per_s": w / r,
            "speedup": r / k}


def moe_rows(t: int, batch: int, repeat: int, n_expert: int = 256, n_ff: int = 512, n_in: int = 2048,
             top_k: int = 8) -> dict:
    rng = np.random.default_rng(1)
    raw = _fake_quantized(t, n_expert * n_ff, n_in, rng)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    ids = np.stack([rng.choice(n_expert, top_k, replace=False) for _ in range(batch)])
    s = _median_s(lambda: moe_matmul(raw, t, n_ff, n_in, x, ids), repeat)
    touched = len(np.unique(ids)) * n_ff * n_in
    return {"ms": s * 1e3, "weights_per_s": touched / s, "gflops": 2 * batch * top_k * n_ff * n_in / s / 1e9}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,F16,BF16")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", type=int, default=8192, help="rows of the dense matrix")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--moe-batch", type=int, default=32)
    args = ap.parse_args(argv)
    threads = set_threads(args.threads)
    n_in = 2048
    print(f"threads {threads}; dense {args.out}x{n_in}; MoE 256 experts x 512 x {n_in}, top-8\n")
    print("| type | b1 G weights/s | b1 numpy G w/s | b1 speed-up | "
          f"b{args.batch} GFLOP/s | b{args.batch} numpy GFLOP/s | MoE b1 ms | MoE b1 G w/s | "
          f"MoE b{args.moe_batch} GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.types.split(","):
        t = _BY_NAME[name.strip()]
        one = dense_rows(t, args.out, n_in, 1, args.repeat)
        many = dense_rows(t, args.out, n_in, args.batch, args.repeat)
        moe1 = moe_rows(t, 1, args.repeat)
        moen = moe_rows(t, args.moe_batch, max(3, args.repeat // 2))
        print(f"| {name} | {one['weights_per_s'] / 1e9:.2f} | {one['numpy_weights_per_s'] / 1e9:.2f} | "
              f"{one['speedup']:.1f}x | {many['gflops']:.1f} | "
              f"{many['gflops'] / many['speedup']:.1f} | {moe1['ms']:.2f} | "
              f"{moe1['weights_per_s'] / 1e9:.2f} | {moen['gflops']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
