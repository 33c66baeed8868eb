"""Chunked Gated DeltaNet for prefill: the per-token recurrence of docs/architecture.md §4, in blocks.

Per value head h (key head κ = h % Hk), per token t:
    S ← exp(g_t)·S;  e = v_t − Sᵀk_t;  S ← S + k_t ⊗ (β_t·e);  o_t = Sᵀq_t.
Over a chunk of C tokens with cumulative decay G_i = Σ_{s≤i} g_s (from the chunk start) and S0
the state entering the chunk, the pseudo-values u_i = β_i·e_i solve a unit lower-triangular system
    u_i + β_i Σ_{j<i} e^{G_i−G_j} (k_i·k_j) u_j = β_i (v_i − e^{G_i} S0ᵀk_i),
after which o_i = e^{G_i} S0ᵀq_i + Σ_{j≤i} e^{G_i−G_j} (q_i·k_j) u_j and
S = e^{G_C} S0 + Σ_j e^{G_C−G_j} k_j ⊗ u_j. Every exponent is ≤ 0, so nothing overflows. The
state is read and written once per chunk instead of twice per token.
"""

from __future__ import annotations

import numpy as np

from .jit import njit, prange

CHUNK = 32


@njit(parallel=True, cache=True, fastmath={"contract", "nsz", "reassoc"})
def _gdn(q, k, v, g, beta, S, o, chunk):
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    for h in prange(Hv):
        kh = h % Hk
        St = S[h]
        Kc = np.empty((chunk, dk), np.float32)
        Qc = np.empty((chunk, dk), np.float32)
        U = np.empty((chunk, dv), np.float32)
        QS = np.empty((chunk, dv), np.float32)
        G = np.empty(chunk, np.float64)
        A = np.empty((chunk, chunk), np.float32)
        B = np.empty((chunk, chunk), np.float32)
        for t0 in range(0, T, chunk):
            n = min(chunk, T - t0)
            acc = 0.0
            for i in range(n):
                acc += g[t0 + i, h]
                G[i] = acc
                for a in range(dk):
                    Kc[i, a] = k[t0 + i, kh, a]
                    Qc[i, a] = q[t0 + i, kh, a]
            # S0ᵀk_i and S0ᵀq_i
            for i in range(n):
                U[i, :] = 0.0
                QS[i, :] = 0.0
                for a in range(dk):
                    ka, qa = Kc[i, a], Qc[i, a]
                    row = St[a]
                    for c in range(dv):
                        U[i, c] += ka * row[c]
                        QS[i, c] += qa * row[c]
            # decayed key-key and query-key products (lower triangle)
            for i in range(n):
                for j in range(i + 1):
                    skk = np.float32(0.0)
                    sqk = np.float32(0.0)
                    for a in range(dk):
                        skk += Kc[i, a] * Kc[j, a]
                        sqk += Qc[i, a] * Kc[j, a]
                    decay = np.float32(np.exp(G[i] - G[j]))
                    A[i, j] = skk * decay
                    B[i, j] = sqk * decay
            # forward substitution for the pseudo-values u_i (U holds S0ᵀk_i on entry)
            for i in range(n):
                b = beta[t0 + i, h]
                gi = np.float32(np.exp(G[i]))
                for c in range(dv):
                    U[i, c] = v[t0 + i, h, c] - gi * U[i, c]
                for j in range(i):
                    a_ij = A[i, j]
                    for c in range(dv):
                        U[i, c] -= a_ij * U[j, c]
                for c in range(dv):
                    U[i, c] *= b
            # outputs
            for i in range(n):
                gi = np.float32(np.exp(G[i]))
                for c in range(dv):
                    o[t0 + i, h, c] = gi * QS[i, c]
                for j in range(i + 1):
                    b_ij = B[i, j]
                    for c in range(dv):
                        o[t0 + i, h, c] += b_ij * U[j, c]
            # state at the chunk end
            g_end = G[n - 1]
            for j in range(n):
                G[j] = np.exp(g_end - G[j])
            total = np.float32(np.exp(g_end))
            for a in range(dk):
                row = St[a]
                for c in range(dv):
                    row[c] *= total
                for j in range(n):
                    w = np.float32(G[j]) * Kc[j, a]
                    for c in range(dv):
                        row[c] += w * U[j, c]


def _checked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
             S0: np.ndarray) -> tuple[np.ndarray, ...]:
    """The inputs as contiguous float32, after checking their shapes agree with each other and S0."""
    q, k, v, g, beta = (np.ascontiguousarray(a, np.float32) for a in (q, k, v, g, beta))
    T, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if k.shape != q.shape or v.shape[0] != T or g.shape != (T, hv) or beta.shape != (T, hv):
        raise ValueError(f"inconsistent shapes q{q.shape} k{k.shape} v{v.shape} g{g.shape} beta{beta.shape}")
    if S0.shape != (hv, dk, dv) or hv % hk:
        raise ValueError(f"state must be ({hv}, {dk}, {dv}) with value heads a multiple of key heads")
    return q, k, v, g, beta


def gdn_chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                S0: np.ndarray, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Gated DeltaNet over T tokens of one layer; returns (o, S), float32, S0 left unchanged.

    q, k: (T, Hk, dk), already L2-normalised per head, q also scaled by 1/sqrt(dk);
    v: (T, Hv, dv); g: (T, Hv) log-decay (ssm_a·softplus(a + dt), ≤ 0); beta: (T, Hv) = sigmoid(b);
    S0: (Hv, dk, dv) the state before the first token. Value head h reads key head h % Hk.
    o: (T, Hv, dv), each o_t read after token t's update; S: (Hv, dk, dv) after the last token.
    """
    q, k, v, g, beta = _checked(q, k, v, g, beta, S0)
    S = np.array(S0, dtype=np.float32, order="C", copy=True)
    o = np.empty((q.shape[0], *v.shape[1:]), np.float32)
    if q.shape[0]:
        _gdn(q, k, v, g, beta, S, o, max(1, int(chunk)))
    return o, S


@njit(parallel=True, cache=True, fastmath={"contract", "nsz", "reassoc"})
def _gdn_steps(q, k, v, g, beta, S_in, S_out, o):
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    for h in prange(Hv):
        kh = h % Hk
        src = S_in[h]
        dst = S_out[h]
        a = np.empty(dv, np.float32)
        b = np.empty(dv, np.float32)
        e = np.empty(dv, np.float32)
        for t in range(T):
            decay = np.float32(np.exp(g[t, h]))
            a[:] = 0.0
            b[:] = 0.0
            qk = np.float32(0.0)
            for i in range(dk):
                ki, qi = k[t, kh, i], q[t, kh, i]
                qk += qi * ki
                row = src[i]
                for c in range(dv):
                    a[c] += ki * row[c]
                    b[c] += qi * row[c]
            bt = beta[t, h]
            for c in range(dv):
                e[c] = (v[t, h, c] - decay * a[c]) * bt
                o[t, h, c] = decay * b[c] + qk * e[c]
            for i in range(dk):
                ki = k[t, kh, i]
                rs = src[i]
                rd = dst[i]
                for c in range(dv):
                    rd[c] = decay * rs[c] + ki * e[c]
            src = dst


def gdn_recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                  S0: np.ndarray, S_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule token by token for a few rows (decode, a short commit): per value head,
    in parallel over heads, one read of S for Sᵀk and Sᵀq and one read-write for the update
    (o_t = e^{g}·Sᵀq + (q·k)·e, with e = β(v − e^{g}·Sᵀk)), where the numpy form makes five
    passes over the state and copies it twice. Same arguments and result as `gdn_chunked`; the
    new state goes to `S_out` (it may be S0 itself: each element is read before it is written)."""
    q, k, v, g, beta = _checked(q, k, v, g, beta, S0)
    if S0.dtype != np.float32 or not S0.flags.c_contiguous:
        raise ValueError("state must be C-contiguous float32 (it is updated where it lies)")
    if S_out is None:
        S_out = np.empty_like(S0)
    elif S_out.shape != S0.shape or S_out.dtype != np.float32 or not S_out.flags.c_contiguous:
        raise ValueError("S_out must be a C-contiguous float32 array shaped like the state")
    o = np.empty((q.shape[0], *v.shape[1:]), np.float32)
    if q.shape[0]:
        _gdn_steps(q, k, v, g, beta, S0, S_out, o)
    else:
        S_out[...] = S0
    return o, S_out
