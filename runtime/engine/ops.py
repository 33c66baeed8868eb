"""Element-wise pieces of the forward pass, in float32 and written to stay finite for any input."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np

F32 = np.float32


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) ⊙ weight over the last axis (weights already hold the +1 offset).
    One compiled call whenever numba imports (`kernels.norm`), at every size, so a row rounds
    the same alone or in a block."""
    norm = compiled("norm")
    if norm is not None and (weight is None or weight.size == x.shape[-1]):
        return norm.rms_norm(x, weight, eps)
    x = x.astype(F32, copy=False)
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=F32)
    out = x / np.sqrt(ms + F32(eps))
    if weight is not None:
        out *= weight
    return out


def l2_norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(Σx² + eps) over the last axis (the GDN query/key normalisation)."""
    ss = np.sum(np.square(x), axis=-1, keepdims=True, dtype=F32)
    return x / np.sqrt(ss + F32(eps))


@functools.cache
def inverse_frequencies(rope_dim: int, base: float) -> np.ndarray:
    """RoPE's base^(-2j/rope_dim) for j < rope_dim/2, float64 (read-only: shared by every call,
    the attention layers' and the one-call decode layer's, `Weights.attention_step`)."""
    inv = base ** (-np.arange(rope_dim // 2, dtype=np.float64) * 2.0 / rope_dim)
    inv.flags.writeable = False
    return inv


@functools.cache
def compiled(name: str) -> Any:
    """The compiled kernels module `kernels.<name>`, or None where numba does not import (the
    numpy forms then run)."""
    try:
        return importlib.import_module(f"{__package__.rpartition('.')[0]}.kernels.{name}")
    except Exception:  # noqa: BLE001 - any numba import failure means: numpy only
        return None


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) without overflow for large |x|: e = e^-|x| ≤ 1, then 1/(1+e) or e/(1+e).
    The compiled loop whenever numba imports (numpy's float32 exp and five passes were ~8 % of a
    prefill), at every size: one form for every batch, so a row rounds the same decoded alone or
    in a block (a verified commit must match AR's one-row steps bit for bit)."""
    x = np.asarray(x, dtype=F32)
    act = compiled("act")
    if act is not None:
        return act.sigmoid(x)
    e = np.exp(-np.abs(x))
    r = F32(1) / (F32(1) + e)
    return np.where(x >= 0, r, e * r).astype(F32, copy=False)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(F32(0), x).astype(F32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=F32)
    act = compiled("act")
    return act.silu(x) if act is not None else x * sigmoid(x)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax that tolerates rows of -inf entries mixed with finite ones."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)
