"""Seeded test tensors for the quantization and kernel tests: the awkward cases a format must survive."""

from __future__ import annotations

import numpy as np


def awkward_matrix(n_rows: int, n_cols: int, seed: int = 0) -> np.ndarray:
    """Gaussian rows whose scales span 1e-3..1e3 across rows and vary 30x between 256-blocks.

    Also planted: an all-zero 32-block, an all-zero 256-block, an all-positive and an all-negative
    block, a constant block and a few 8-sigma outliers (where n_cols allows them).
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    x *= np.logspace(-3, 3, n_rows, dtype=np.float32)[rng.permutation(n_rows)][:, None]
    n_super = max(1, n_cols // 256)
    block_scale = rng.uniform(0.2, 6.0, (n_rows, n_super)).astype(np.float32)
    x *= np.repeat(block_scale, 256, axis=1)[:, :n_cols] if n_cols >= 256 else block_scale[:, :1]
    x[0, :32] = 0.0
    if n_rows > 1 and n_cols >= 256:
        x[1, :256] = 0.0
    if n_rows > 2:
        x[2, :32] = np.abs(x[2, :32])
    if n_rows > 3:
        x[3, :32] = -np.abs(x[3, :32])
    if n_rows > 4:
        x[4, :32] = x[4, 0]
    if n_rows > 5:
        cols = rng.integers(0, n_cols, 3)
        x[5, cols] *= 8.0
    return x
