"""Kernel throughput per quant type: the default kernels against the exact float kernels.

Prints weights/s and GFLOP/s for a dense (out, in) product at batch 1 and batch N, and for one MoE
layer's gate projection (256 experts x 512 x 2048, top-8) at batch 1 and a prefill-sized batch,
each for the default kernels (integer dot products with 8-bit activations, for the types that
have them) and for `exact=True` (the float kernels, the reference path). `--numpy` adds the
dequantize-then-BLAS path at batch 1. Medians of several runs; machines shared with other work
are noisy, so compare columns of one run.

    python benchmarks/kernels.py [--threads 2] [--types Q4_K,Q6_K] [--repeat 7] [--numpy]
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


def dense_rows(t: int, n_out: int, n_in: int, batch: int, repeat: int, exact: bool,
               numpy_too: bool = False) -> dict:
    rng = np.random.default_rng(0)
    raw = _fake_quantized(t, n_out, n_in, rng)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    k = _median_s(lambda: matmul(raw, t, n_out, n_in, x, exact=exact), repeat)
    w = n_out * n_in
    out = {"weights_per_s": w / k, "gflops": 2 * w * batch / k / 1e9}
    if numpy_too:
        out["numpy_weights_per_s"] = w / _median_s(lambda: _numpy_path(raw, t, n_out, n_in, x), max(1, repeat // 3))
    return out


def moe_rows(t: int, batch: int, repeat: int, exact: bool, n_expert: int = 256, n_ff: int = 512,
             n_in: int = 2048, top_k: int = 8) -> dict:
    rng = np.random.default_rng(1)
    raw = _fake_quantized(t, n_expert * n_ff, n_in, rng)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    ids = np.stack([rng.choice(n_expert, top_k, replace=False) for _ in range(batch)])
    s = _median_s(lambda: moe_matmul(raw, t, n_ff, n_in, x, ids, exact=exact), repeat)
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
    ap.add_argument("--numpy", action="store_true", help="also time the dequantize-then-BLAS path (slow)")
    args = ap.parse_args(argv)
    threads = set_threads(args.threads)
    n_in = 2048
    print(f"threads {threads}; dense {args.out}x{n_in}; MoE 256 experts x 512 x {n_in}, top-8; "
          "each cell: default kernels / exact float kernels (ratio)\n")
    head = (f"| type | b1 G weights/s | b{args.batch} GFLOP/s | MoE b1 ms | MoE b{args.moe_batch} GFLOP/s |"
            + (" b1 numpy G w/s |" if args.numpy else ""))
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for name in args.types.split(","):
        t = _BY_NAME[name.strip()]
        cells = []
        for key, fn in (("weights_per_s", lambda ex, t=t: dense_rows(t, args.out, n_in, 1, args.repeat, ex)),
                        ("gflops", lambda ex, t=t: dense_rows(t, args.out, n_in, args.batch, args.repeat, ex)),
                        ("ms", lambda ex, t=t: moe_rows(t, 1, args.repeat, ex)),
                        ("gflops", lambda ex, t=t: moe_rows(t, args.moe_batch, max(3, args.repeat // 2), ex))):
            new, old = fn(False)[key], fn(True)[key]
            scale = 1e9 if key == "weights_per_s" else 1
            gain = old / new if key == "ms" else new / old
            cells.append(f"{new / scale:.2f} / {old / scale:.2f} ({gain:.2f}x)")
        if args.numpy:
            ref = dense_rows(t, args.out, n_in, 1, args.repeat, True, True)
            cells.append(f"{ref['numpy_weights_per_s'] / 1e9:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
