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

from .act import silu_inplace
from .jit import njit, prange
from .state_rows import ROWS, chunk_sums, chunk_update

CHUNK = 32


@njit(parallel=True, cache=True, fastmath={"contract", "nsz", "reassoc"})
def _gdn(q, k, v, g, beta, S, o, chunk, offset):
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
        W = np.empty((chunk, dk), np.float32)  # the chunk's rows' weights in the state update
        t0 = 0
        while t0 < T:
            n = min(chunk - (t0 + offset) % chunk, T - t0)  # chunks end at multiples in absolute positions
            acc = 0.0
            for i in range(n):
                acc += g[t0 + i, h]
                G[i] = acc
                for a in range(dk):
                    Kc[i, a] = k[t0 + i, kh, a]
                    Qc[i, a] = q[t0 + i, kh, a]
            # S0ᵀk_i and S0ᵀq_i, ROWS rows a pass over S0
            i = 0
            while n - i >= ROWS:
                chunk_sums(ROWS, St, Kc, Qc, i, U, QS)
                i += ROWS
            while i < n:
                chunk_sums(1, St, Kc, Qc, i, U, QS)
                i += 1
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
            for j in range(n):
                gj = np.float32(G[j])
                for a in range(dk):
                    W[j, a] = gj * Kc[j, a]
            chunk_update(St, total, W, U, n)
            t0 += n


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
                S0: np.ndarray, chunk: int = CHUNK, pos0: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gated DeltaNet over T tokens of one layer; returns (o, S), float32, S0 left unchanged.

    The first token sits at position `pos0`: chunks end at multiples of `chunk` in absolute
    positions, so a continuation from an aligned position computes the chunks a cold pass does.

    q, k: (T, Hk, dk), already L2-normalised per head, q also scaled by 1/sqrt(dk);
    v: (T, Hv, dv); g: (T, Hv) log-decay (ssm_a·softplus(a + dt), ≤ 0); beta: (T, Hv) = sigmoid(b);
    S0: (Hv, dk, dv) the state before the first token. Value head h reads key head h % Hk.
    o: (T, Hv, dv), each o_t read after token t's update; S: (Hv, dk, dv) after the last token.
    """
    q, k, v, g, beta = _checked(q, k, v, g, beta, S0)
    S = np.array(S0, dtype=np.float32, order="C", copy=True)
    o = np.empty((q.shape[0], *v.shape[1:]), np.float32)
    if q.shape[0]:
        chunk = max(1, int(chunk))
        _gdn(q, k, v, g, beta, S, o, chunk, int(pos0) % chunk)
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


@njit(inline="always")
def _sigmoid(x):
    if x >= 0:
        return np.float32(1.0) / (np.float32(1.0) + np.float32(np.exp(-x)))
    e = np.float32(np.exp(x))
    return e / (np.float32(1.0) + e)


@njit(parallel=True, cache=True, fastmath={"contract", "nsz", "reassoc"})
def _gdn_mixer(u, ring, taps, z, b, a, dt_bias, ssm_a, S_in, S_out, ring_out, norm_w, eps, nk, dk, y):
    """Every float sum runs in a loop that stores nothing. A loop that stores is compiled twice,
    vector and scalar, and picks one at run time by how close its arrays lie in memory; a sum's
    order (and so its rounding) then hung on where malloc put this call's scratch, and one decode
    of the same input differed from the next about one time in a thousand on two threads."""
    n, C = u.shape
    K = taps.shape[1]
    R = K - 1
    Hv, dv = z.shape[1], z.shape[2]
    xx = np.empty((R + n, C), np.float32)  # [ring; u]: the conv reads rows t..t+R of it
    for t in range(R):  # plain loops: outside a prange an array copy became a parallel launch
        for c in range(C):
            xx[t, c] = ring[t, c]
    for t in range(n):
        for c in range(C):
            xx[R + t, c] = u[t, c]
    x = np.empty((n, C), np.float32)
    e = np.empty(C, np.float32)
    bits = np.empty(C, np.int32)
    tk = np.empty((K, C), np.float32)  # the taps tap by tap: contiguous over channels (vector code)
    for c in range(C):
        for j in range(K):
            tk[j, c] = taps[c, j]
    for t in range(n):  # depthwise causal conv, then SiLU; channel loops are vector code
        xt = x[t]
        for c in range(C):
            xt[c] = xx[t, c] * tk[0, c]
        for j in range(1, K):
            for c in range(C):
                xt[c] += xx[t + j, c] * tk[j, c]
        silu_inplace(xt, e, bits)
    for t in range(R):  # the last R rows of [ring; u]
        for c in range(C):
            ring_out[t, c] = xx[n + t, c]
    inv_sqrt = np.float32(1.0 / np.sqrt(dk))
    for h in prange(Hv):
        kh = h % nk
        src = S_in[h]
        dst = S_out[h]
        q = np.empty(dk, np.float32)
        k = np.empty(dk, np.float32)
        sa = np.empty(dv, np.float32)
        sb = np.empty(dv, np.float32)
        o = np.empty(dv, np.float32)
        gz = np.empty(dv, np.float32)
        ez = np.empty(dv, np.float32)
        bz = np.empty(dv, np.int32)
        work = np.empty((min(n - 1, 2), dk, dv), np.float32)  # the steps before the last
        row_new = np.empty(dv, np.float32)
        for t in range(n):
            for i in range(dk):
                q[i] = x[t, kh * dk + i]
                k[i] = x[t, (nk + kh) * dk + i]
            ssq = np.float32(0.0)
            ssk = np.float32(0.0)
            for i in range(dk):  # sums in loops that store nothing: see _gdn_mixer's docstring
                ssq += q[i] * q[i]
                ssk += k[i] * k[i]
            fq = inv_sqrt / np.float32(np.sqrt(ssq + np.float32(1e-6)))
            fk = np.float32(1.0) / np.float32(np.sqrt(ssk + np.float32(1e-6)))
            for i in range(dk):
                q[i] *= fq
                k[i] *= fk
            qk = np.float32(0.0)
            for i in range(dk):
                qk += q[i] * k[i]
            ad = a[t, h] + dt_bias[h]
            soft = max(ad, np.float32(0.0)) + np.float32(np.log1p(np.exp(-abs(ad))))
            decay = np.float32(np.exp(ssm_a[h] * soft))
            bt = _sigmoid(b[t, h])
            sa[:] = 0.0
            sb[:] = 0.0
            for i in range(dk):
                ki, qi = k[i], q[i]
                row = src[i]
                for c in range(dv):
                    sa[c] += ki * row[c]
                    sb[c] += qi * row[c]
            v0 = (2 * nk * dk) + h * dv
            for c in range(dv):
                ec = (x[t, v0 + c] - decay * sa[c]) * bt
                sa[c] = ec
                o[c] = decay * sb[c] + qk * ec
            ms = np.float32(0.0)
            for c in range(dv):
                ms += o[c] * o[c]
            # The last step writes the new state where it belongs, a row aside then copied (dst
            # may be src); the steps before write straight into scratch, which a 32-row commit
            # needs: the copy a row made its mixer 1.3x slower.
            if t == n - 1:
                for i in range(dk):
                    ki = k[i]
                    rs = src[i]
                    for c in range(dv):  # never into src's memory: in place was compiled to scalar code
                        row_new[c] = decay * rs[c] + ki * sa[c]
                    rd = dst[i]
                    for c in range(dv):
                        rd[c] = row_new[c]
            else:
                nxt = work[t % 2]
                for i in range(dk):
                    ki = k[i]
                    rs = src[i]
                    rd = nxt[i]
                    for c in range(dv):
                        rd[c] = decay * rs[c] + ki * sa[c]
                src = nxt
            r = np.float32(1.0) / np.float32(np.sqrt(ms / dv + eps))
            for c in range(dv):
                gz[c] = z[t, h, c]
            silu_inplace(gz, ez, bz)
            for c in range(dv):
                y[t, h * dv + c] = o[c] * r * norm_w[c] * gz[c]


def gdn_mixer(u: np.ndarray, ring: np.ndarray, taps: np.ndarray, z: np.ndarray, b: np.ndarray,
              a: np.ndarray, dt_bias: np.ndarray, ssm_a: np.ndarray, S0: np.ndarray, norm_w: np.ndarray,
              eps: float, k_heads: int, S_out: np.ndarray | None = None,
              ring_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Gated DeltaNet layer's mixer for a few rows, between its input and output projections,
    in one compiled call: the causal conv over [ring; u] and SiLU, the q/k L2 norms, β = σ(b),
    g = ssm_a·softplus(a + dt), the delta-rule steps, and RMSNorm(o)·SiLU(z). Decode ran these as
    ~15 numpy passes (~2 ms a layer on the real shape, most of a layer's time outside its products).

    u: (n, conv_dim) pre-conv q|k|v rows; ring: (kernel-1, conv_dim); taps: (conv_dim, kernel);
    z: (n, v_heads, v_dim); b, a: (n, v_heads) raw projections; S0: (v_heads, k_dim, v_dim).
    Returns (y (n, v_heads·v_dim), new ring, new S). The new state and ring go to S_out / ring_out
    when given (they may be S0 / ring themselves, updated in place), else to new arrays.
    """
    u, taps, z, b, a, dt_bias, ssm_a, norm_w = (np.ascontiguousarray(t, np.float32) for t in
                                                (u, taps, z, b, a, dt_bias, ssm_a, norm_w))
    n, C = u.shape
    hv, dk, dv = S0.shape
    if (ring.shape != (taps.shape[1] - 1, C) or z.shape != (n, hv, dv) or b.shape != (n, hv)
            or a.shape != (n, hv) or C != 2 * k_heads * dk + hv * dv or hv % k_heads):
        raise ValueError(f"inconsistent GDN mixer shapes u{u.shape} ring{ring.shape} z{z.shape} S{S0.shape}")
    for arr in (S0, ring):
        if arr.dtype != np.float32 or not arr.flags.c_contiguous:
            raise ValueError("state and ring must be C-contiguous float32 (they may be updated in place)")
    S_out = np.empty_like(S0) if S_out is None else S_out
    ring_out = np.empty_like(ring) if ring_out is None else ring_out
    y = np.empty((n, hv * dv), np.float32)
    if n:
        _gdn_mixer(u, ring, taps, z, b, a, dt_bias, ssm_a, S0, S_out, ring_out, norm_w, np.float32(eps),
                   k_heads, dk, y)
    else:
        S_out[...] = S0
        ring_out[...] = ring
    return y, ring_out, S_out
