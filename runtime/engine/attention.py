"""Gated full attention: q/k norms, partial NEOX RoPE, GQA, a KV cache, a sigmoid output gate.

The causal form writes the chunk's K/V into the cache and attends over the cache with a causal
mask; the preview form attends over the cached prefix plus the block's own K/V (bidirectional
inside the block) and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model_config import ModelConfig
from .align import ALIGN, segments
from .layers import AttentionLayer
from .ops import compiled, inverse_frequencies, rms_norm, sigmoid
from .state import SequenceState
from .weights import Weights

KERNEL_ROWS = 32  # up to a block of rows (decode, commits) the compiled kernel reads the cache
_SCORE_BUDGET = 1 << 23  # float32 scores held at once (32 MiB): query rows are processed in slices


@dataclass
class AttentionInputs:
    q: np.ndarray  # (n, heads, head_dim), normed and rotated
    gate: np.ndarray  # (n, heads * v_dim)
    k: np.ndarray  # (n, kv_heads, head_dim), normed and rotated
    v: np.ndarray  # (n, kv_heads, v_dim)


def rope_tables(positions: np.ndarray, rope_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of pos · base^(-2j/rope_dim) for j < rope_dim/2: each (n, rope_dim/2) float32."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inverse_frequencies(rope_dim, base)[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rotate(x: np.ndarray, pos0: int, cfg: ModelConfig) -> np.ndarray:
    """x (n, heads, dim) at positions pos0.. with the partial NEOX RoPE: one compiled call where
    numba imports (`kernels.attention.rope`), else the tables and `apply_rope`."""
    positions = np.arange(pos0, pos0 + x.shape[0])
    kernels = compiled("attention")
    if kernels is not None:
        return kernels.rope(x, positions, inverse_frequencies(cfg.rope_dim, cfg.rope_base))
    cos, sin = rope_tables(positions, cfg.rope_dim, cfg.rope_base)
    return apply_rope(x, cos, sin)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NEOX rotation of pairs (d_j, d_{j+rope_dim/2}) on the first rope_dim dims of (n, heads, dim)."""
    half = cos.shape[1]
    if half == 0:
        return x
    c, s = cos[:, None, :], sin[:, None, :]
    x1 = x[..., :half]
    x2 = x[..., half:2 * half]
    out = x.copy()
    out[..., :half] = x1 * c - x2 * s
    out[..., half:2 * half] = x2 * c + x1 * s
    return out


def project(w: Weights, cfg: ModelConfig, L: AttentionLayer, h: np.ndarray, pos0: int) -> AttentionInputs:
    """Projections for rows at positions pos0..pos0+n-1 (fused `attn_qkv` or split q/k/v)."""
    n = h.shape[0]
    hd, hv = cfg.head_dim, cfg.head_dim_v
    nq = cfg.n_head * hd * 2
    nk = cfg.n_head_kv * hd
    if L.qkv is not None:
        qkv = L.qkv.matmul(h)
        qg, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
    else:
        qg, k, v = w.products([L.q, L.k, L.v], h)
    qg = qg.reshape(n, cfg.n_head, 2 * hd)
    q = rms_norm(qg[..., :hd], L.q_norm, cfg.rms_eps)
    gate = np.ascontiguousarray(qg[..., hd:]).reshape(n, cfg.n_head * hd)
    k = rms_norm(k.reshape(n, cfg.n_head_kv, hd), L.k_norm, cfg.rms_eps)
    return AttentionInputs(rotate(q, pos0, cfg), gate, rotate(k, pos0, cfg),
                           np.ascontiguousarray(v).reshape(n, cfg.n_head_kv, hv))


def attend(q: np.ndarray, segments: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]) -> np.ndarray:
    """Softmax attention of q (n, heads, d) over key segments, jointly normalised.

    Each segment is (K (kv_heads, m, d), V (kv_heads, m, dv), mask) where mask is an (n, m)
    boolean array of allowed pairs or None for all. Query head h uses KV head h // (heads/kv_heads).
    Per-head K and V rows are contiguous (the cache layout), so nothing is copied. Returns (n, heads, dv).
    """
    n, heads, d = q.shape
    kvh = segments[0][0].shape[0]
    dv = segments[0][1].shape[2]
    g = heads // kvh
    scale = np.float32(1.0 / np.sqrt(d))
    total = sum(s[0].shape[1] for s in segments)
    step = max(1, _SCORE_BUDGET // max(1, heads * total))
    out = np.empty((n, heads, dv), dtype=np.float32)
    kt = [k.transpose(0, 2, 1) for k, _, _ in segments]  # (kvh, d, m) views
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        r = r1 - r0
        # the g query heads of a KV head and their rows form one (g·r, d) operand, so each KV
        # head's keys and values are read once (a broadcast batch axis made numpy read them g
        # times: 34 ms per layer and token at depth 16K instead of ~5)
        qs = (q[r0:r1].reshape(r, kvh, g, d).transpose(1, 2, 0, 3) * scale).reshape(kvh, g * r, d)
        scores = []
        for (_, _, mask), k_t in zip(segments, kt, strict=True):
            s = (qs @ k_t).reshape(kvh, g, r, -1)
            if mask is not None:
                s = np.where(mask[r0:r1], s, np.float32(-np.inf))
            scores.append(s)
        m = np.max([np.max(s, axis=-1) for s in scores], axis=0)[..., None]
        probs = [np.exp(s - m) for s in scores]
        denom = sum(np.sum(p, axis=-1) for p in probs)[..., None]
        o = sum(p.reshape(kvh, g * r, -1) @ v for p, (_, v, _) in zip(probs, segments, strict=True))
        o = o.reshape(kvh, g, r, dv) / denom  # (kvh, g, r, dv)
        out[r0:r1] = o.transpose(2, 0, 1, 3).reshape(r, heads, dv)
    return out


def _output(L: AttentionLayer, o: np.ndarray, gate: np.ndarray) -> np.ndarray:
    return L.output.matmul(o.reshape(o.shape[0], -1) * sigmoid(gate))


def causal(w: Weights, cfg: ModelConfig, L: AttentionLayer, h: np.ndarray, state: SequenceState) -> np.ndarray:
    """Attention for rows continuing `state` (at positions n_past...); appends their K/V."""
    pos0 = state.n_past
    n = h.shape[0]
    a = project(w, cfg, L, h, pos0)
    kc, vc = state.kv(L.index)
    kc[:, pos0:pos0 + n] = a.k.transpose(1, 0, 2)
    vc[:, pos0:pos0 + n] = a.v.transpose(1, 0, 2)
    small = KERNEL_ROWS if w.attention_kernel is not None else 0
    o = np.empty((n, cfg.n_head, cfg.head_dim_v), np.float32)
    for r0, r1 in segments(pos0, n, small):
        if r1 - r0 <= small:
            o[r0:r1] = w.attention_kernel(a.q[r0:r1], kc, vc, pos0 + r0 + 1 + np.arange(r1 - r0))
        else:
            _causal_rows(a.q, kc, vc, pos0, r0, r1, o)
    return _output(L, o, a.gate)


def _causal_rows(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos0: int, r0: int, r1: int,
                 out: np.ndarray) -> None:
    """Rows r0..r1 (positions pos0 + r) over the cache, in slices of rows aligned to absolute
    positions, each over the keys up to its last row: a row's scores, sums and products then
    have the same shapes whichever call computes it (and the masked upper triangle is skipped)."""
    heads = q.shape[1]
    p, p1 = pos0 + r0, pos0 + r1
    while p < p1:
        block_end = (p // ALIGN + 1) * ALIGN
        fit = max(1, _SCORE_BUDGET // (heads * block_end))
        size = min(ALIGN, 1 << (fit.bit_length() - 1))  # a power of two: slices never straddle ALIGN
        end = min(p1, (p // size + 1) * size)
        rows = slice(p - pos0, end - pos0)
        mask = None if end - p == 1 else np.arange(end)[None, :] <= np.arange(p, end)[:, None]
        out[rows] = attend(q[rows], [(kc[:, :end], vc[:, :end], mask)])
        p = end


def preview(w: Weights, cfg: ModelConfig, L: AttentionLayer, h: np.ndarray, state: SequenceState) -> np.ndarray:
    """Block rows see the whole cached prefix and every row of the block; the cache is untouched."""
    pos0 = state.n_past
    a = project(w, cfg, L, h, pos0)
    k = np.ascontiguousarray(a.k.transpose(1, 0, 2))
    v = np.ascontiguousarray(a.v.transpose(1, 0, 2))
    segments = [(k, v, None)]
    if pos0:
        kc, vc = state.kv(L.index)
        segments.insert(0, (kc[:, :pos0], vc[:, :pos0], None))
    o = attend(a.q, segments)
    return _output(L, o, a.gate)
