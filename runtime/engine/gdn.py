"""Gated DeltaNet layers: projections, the causal conv ring, the gated delta rule, the gated norm.

The delta rule has two exact forms: `recurrent` (one token at a time, used for decoding) and
`chunked` (the WY / UT-transform form, used for prefill), which agree to float32 round-off.
Value head h reads key head h % k_heads (the GGUF files store value heads in tiled order).

Preview (block diffusion) has two operators behind `preview`: "causal" runs the causal layer from
the committed state without writing back; "clover" is our reading of the vendor operator
(`clover_mix`), used only when the file carries the Clover-only tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model_config import ModelConfig
from .align import segments
from .layers import DeltaNetLayer
from .ops import compiled, l2_norm, rms_norm, sigmoid, silu, softplus
from .state import SequenceState
from .weights import Weights

CHUNK = 64  # rows per WY chunk
RECURRENT_MAX_ROWS = 32  # up to a block of rows the per-token loop (a verified commit then rounds as AR does)


@dataclass
class Projected:
    u: np.ndarray  # (n, conv_dim) pre-conv q|k|v rows
    z: np.ndarray  # (n, v_heads, v_dim) output gate
    beta: np.ndarray  # (n, v_heads)
    g: np.ndarray  # (n, v_heads) log decay, <= 0


def inputs(w: Weights, cfg: ModelConfig, L: DeltaNetLayer, h: np.ndarray) -> list[np.ndarray]:
    """The four input projections u (n, conv_dim), z (n, v_heads·v_dim), b, a (n, v_heads): a
    product per handle of `L.inputs` (fewer where some were fused at load, `Weights.fuse`), cut
    into the four as column views."""
    outs = w.products(list(L.inputs), h)
    if len(outs) == 4:
        return outs
    widths = (cfg.ssm_conv_dim, cfg.ssm_v_heads * cfg.ssm_v_dim, cfg.ssm_v_heads, cfg.ssm_v_heads)
    alone = outs[:-1]  # the fused product comes last (`layers.bind_deltanet`)
    fused, parts, c = outs[-1], [], 0
    for width in widths[len(alone):]:  # column views (np.split took ~10 us a layer)
        parts.append(fused[:, c:c + width])
        c += width
    return alone + parts


def project(w: Weights, cfg: ModelConfig, L: DeltaNetLayer, h: np.ndarray) -> Projected:
    n = h.shape[0]
    u, z, b, a = inputs(w, cfg, L, h)
    z = z.reshape(n, cfg.ssm_v_heads, cfg.ssm_v_dim)
    return Projected(u, z, sigmoid(b), L.a * softplus(a + L.dt_bias))


def conv(ring: np.ndarray, u: np.ndarray, taps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv over [ring; u] (tap kernel-1 multiplies the current row), before SiLU:
    each tap's product rounded, then added, tap by tap (these numpy passes, or where numba
    imports the compiled `gdn_inputs.causal_conv`, which rounds the same).

    Returns the conv output (n, conv_dim) and the new ring (the last kernel-1 pre-conv rows).
    """
    kernels = compiled("gdn_inputs")
    if kernels is not None:
        return kernels.causal_conv(ring, u, taps)
    kernel = taps.shape[1]
    n = u.shape[0]
    xx = np.concatenate([ring, u], axis=0)
    out = xx[0:n] * taps[:, 0]
    for j in range(1, kernel):
        out += xx[j:j + n] * taps[:, j]
    return out, xx[xx.shape[0] - (kernel - 1):].copy()


def split_heads(cfg: ModelConfig, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Post-conv rows -> q, k (n, k_heads, k_dim) L2-normed (q also / sqrt(k_dim)); v (n, v_heads, v_dim)."""
    n = x.shape[0]
    nk, dk = cfg.ssm_k_heads, cfg.ssm_state
    q = l2_norm(x[:, :nk * dk].reshape(n, nk, dk)) * np.float32(1.0 / np.sqrt(dk))
    k = l2_norm(x[:, nk * dk:2 * nk * dk].reshape(n, nk, dk))
    v = x[:, 2 * nk * dk:].reshape(n, cfg.ssm_v_heads, cfg.ssm_v_dim)
    return q, k, np.ascontiguousarray(v)


def conv_heads(w: Weights, cfg: ModelConfig, ring: np.ndarray, u: np.ndarray, taps: np.ndarray,
               right: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v (`split_heads` of SiLU(conv)) and the new conv ring for rows u after `ring`; `right`:
    a block preview's look-ahead taps (column j-1 multiplies row t+j). One compiled call split
    across the kernel threads where numba imports (`kernels.gdn_inputs`), else numpy passes.
    Previews only, for now. In a causal prefill (6-7 % faster pp512 on the real shape) its
    rounding made tests/test_prompt_cache_exact.py fail: there a continuation computes its last
    prompt row with the few-row kernels and the cold forward it is compared with computes that
    row inside a 38-row chunk; the two always differed by round-off (1.9e-6 in the logits), and
    with this form's round-off a near-tie in that row's expert routing flipped (0.065). The
    outputs themselves agree with the numpy form to 5e-7."""
    if w.conv_kernel is not None:
        return w.conv_kernel(u, ring, taps, cfg.ssm_k_heads, cfg.ssm_state, cfg.ssm_v_heads, right)
    x, new_ring = conv(ring, u, taps)
    n = u.shape[0]
    for j in range(1, 0 if right is None else right.shape[1] + 1):
        if j < n:
            x[:n - j] += u[j:] * right[:, j - 1]
    return (*split_heads(cfg, silu(x)), new_ring)


def to_value_heads(x: np.ndarray, n_v_heads: int) -> np.ndarray:
    """(n, k_heads, d) -> (n, v_heads, d): value head h reads key head h % k_heads (tiled order)."""
    return x[:, np.arange(n_v_heads) % x.shape[1]]


def recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
              s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule one token at a time; s (v_heads, k_dim, v_dim) is updated in place.

    q, k: (n, k_heads, k_dim); v: (n, v_heads, v_dim); beta, g: (n, v_heads).
    Per value head: S <- exp(g)·S; e = v - Sᵀk; S <- S + k ⊗ (β·e); o = Sᵀq (after the update).
    """
    n, nv, dv = v.shape
    q, k = to_value_heads(q, nv), to_value_heads(k, nv)
    out = np.empty((n, nv, dv), dtype=np.float32)
    decay = np.exp(g).astype(np.float32)
    for t in range(n):
        s *= decay[t][:, None, None]
        kt = k[t]
        e = (v[t] - np.matmul(kt[:, None, :], s)[:, 0]) * beta[t][:, None]
        s += kt[:, :, None] * e[:, None, :]
        out[t] = np.matmul(q[t][:, None, :], s)[:, 0]
    return out, s


def chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
            s: np.ndarray, chunk: int = CHUNK, pos0: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The same recurrence in chunks (WY / UT transform); returns (o, new S) and leaves `s` alone.

    Chunks end at multiples of `chunk` in absolute positions (the first row is at `pos0`).

    Inside a chunk, with Γ the cumulative log decay: u = (I + A)⁻¹(βv − βe^Γ k S₀) where
    A[i,j] = β_i e^{Γ_i−Γ_j} k_i·k_j (j < i); o_i = e^{Γ_i} q_i S₀ + Σ_{j≤i} e^{Γ_i−Γ_j} (q_i·k_j) u_j;
    S₁ = e^{Γ_C} S₀ + Σ_j e^{Γ_C−Γ_j} k_j u_jᵀ. Every exponent is ≤ 0, so nothing overflows.
    """
    n, nv, dv = v.shape
    Q = np.ascontiguousarray(to_value_heads(q, nv).transpose(1, 0, 2))
    K = np.ascontiguousarray(to_value_heads(k, nv).transpose(1, 0, 2))
    V = np.ascontiguousarray(v.transpose(1, 0, 2))
    B = np.ascontiguousarray(beta.T)
    G = np.ascontiguousarray(g.T).astype(np.float64)
    out = np.empty((nv, n, dv), dtype=np.float32)
    s = s.copy()
    bounds = [0, *range(chunk - pos0 % chunk, n, chunk), n]
    for c0, c1 in zip(bounds, bounds[1:], strict=False):
        c = c1 - c0
        qc, kc, vc, bc = Q[:, c0:c1], K[:, c0:c1], V[:, c0:c1], B[:, c0:c1]
        gam = np.cumsum(G[:, c0:c1], axis=1)
        lower = np.tri(c, dtype=bool)
        decay = np.exp(np.where(lower, gam[:, :, None] - gam[:, None, :], -np.inf)).astype(np.float32)
        kk = (kc @ kc.transpose(0, 2, 1)) * decay * bc[:, :, None]
        a = np.where(np.tri(c, k=-1, dtype=bool), kk, np.float32(0)) + np.eye(c, dtype=np.float32)
        eg = np.exp(gam).astype(np.float32)
        rhs = np.concatenate([vc * bc[:, :, None], kc * (bc * eg)[:, :, None]], axis=-1)
        x = np.linalg.solve(a, rhs)
        u = x[..., :dv] - x[..., dv:] @ s
        out[:, c0:c1] = (qc * eg[:, :, None]) @ s + ((qc @ kc.transpose(0, 2, 1)) * decay) @ u
        tail = np.exp(gam[:, -1:] - gam).astype(np.float32)
        s = s * eg[:, -1][:, None, None] + (kc * tail[:, :, None]).transpose(0, 2, 1) @ u
    return out.transpose(1, 0, 2), s


def delta_rule(w: Weights, q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
               s: np.ndarray, s_out: np.ndarray | None = None, pos0: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-token loop for a few rows, chunked form for more (compiled with the numba backend).

    Returns (o, new S). `s` itself is left unchanged unless it is `s_out`, where the new state
    goes when given (the compiled per-token form then updates it without a copy).
    """
    if q.shape[0] <= RECURRENT_MAX_ROWS:
        if w.gdn_step_kernel is not None:
            return w.gdn_step_kernel(q, k, v, g, beta, s, s_out)
        o, s_new = recurrent(q, k, v, beta, g, s.copy())
    elif w.gdn_kernel is not None:
        o, s_new = w.gdn_kernel(q, k, v, g, beta, s, pos0=pos0)
    else:
        o, s_new = chunked(q, k, v, beta, g, s, pos0=pos0)
    if s_out is None:
        return o, s_new
    s_out[...] = s_new
    return o, s_out


def output(cfg: ModelConfig, L: DeltaNetLayer, o: np.ndarray, z: np.ndarray) -> np.ndarray:
    """RMSNorm(o; ssm_norm) ⊙ SiLU(z) per value head, then `ssm_out`."""
    y = rms_norm(o, L.ssm_norm, cfg.rms_eps) * silu(z)
    return L.out.matmul(y.reshape(o.shape[0], -1))


def causal(w: Weights, cfg: ModelConfig, L: DeltaNetLayer, h: np.ndarray, state: SequenceState) -> np.ndarray:
    """The layer for rows continuing `state`; advances its conv ring and recurrent state."""
    r0, s0 = state.gdn(L.index)
    parts = []
    for a, b in segments(state.n_past, h.shape[0], RECURRENT_MAX_ROWS):
        out, ring, _ = _causal(w, cfg, L, h[a:b], state, s_out=s0, pos0=state.n_past + a)
        r0[...] = ring
        parts.append(out)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _causal(w: Weights, cfg: ModelConfig, L: DeltaNetLayer, h: np.ndarray, state: SequenceState,
            s_out: np.ndarray | None = None, pos0: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(output, new conv ring, new S); the new S goes to `s_out` when given (the state's own)."""
    if w.gdn_mixer_kernel is not None and h.shape[0] <= RECURRENT_MAX_ROWS:
        return _fused(w, cfg, L, h, state, s_out)
    pr = project(w, cfg, L, h)
    ring, s = state.gdn(L.index)
    x, new_ring = conv(ring, pr.u, L.conv)  # rounded as numpy's passes: see `conv_heads`
    q, k, v = split_heads(cfg, silu(x))
    o, s_new = delta_rule(w, q, k, v, pr.beta, pr.g, s, s_out, pos0)
    return output(cfg, L, o, pr.z), new_ring, s_new


def _fused(w: Weights, cfg: ModelConfig, L: DeltaNetLayer, h: np.ndarray, state: SequenceState,
           s_out: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_causal` for a few rows with everything between the projections in one compiled call."""
    n = h.shape[0]
    ring, s = state.gdn(L.index)
    u, z, b, a = inputs(w, cfg, L, h)
    if state.mixer_inputs is not None:
        state.mixer_inputs.setdefault(L.index, []).append((u, b, a))
    y, new_ring, s_new = w.gdn_mixer_kernel(
        u, ring, L.conv, z.reshape(n, cfg.ssm_v_heads, cfg.ssm_v_dim), b, a, L.dt_bias, L.a, s,
        L.ssm_norm, cfg.rms_eps, cfg.ssm_k_heads, S_out=s_out)
    return L.out.matmul(y), new_ring, s_new


def replay(w: Weights, cfg: ModelConfig, L: DeltaNetLayer, inputs: list[tuple[np.ndarray, ...]], n: int,
           start: SequenceState, state: SequenceState) -> None:
    """Set `state`'s conv ring and recurrent state of layer L to those after the first `n` rows of
    a pass that began at `start`, from the mixer inputs the pass recorded (`_fused`): the same
    compiled steps over the same inputs, so the same bits as a pass of those `n` rows alone,
    without their projections."""
    ring0, s0 = start.gdn(L.index)
    ring, s = state.gdn(L.index)
    u, b, a = (np.concatenate([part[j] for part in inputs])[:n] for j in range(3))
    ring[...] = ring0
    s[...] = s0
    for r0, r1 in segments(start.n_past, n, RECURRENT_MAX_ROWS):
        z = np.zeros((r1 - r0, cfg.ssm_v_heads, cfg.ssm_v_dim), np.float32)  # gates only the output
        _, new_ring, _ = w.gdn_mixer_kernel(u[r0:r1], ring, L.conv, z, b[r0:r1], a[r0:r1], L.dt_bias, L.a, s,
                                            L.ssm_norm, cfg.rms_eps, cfg.ssm_k_heads, S_out=s)
        ring[...] = new_ring


def clover_mix(q: np.ndarray, k: np.ndarray, v: np.ndarray, s: np.ndarray, scale: np.ndarray,
               hist_bias: np.ndarray, hist_c: np.ndarray) -> np.ndarray:
    """OUR READING of the vendor's GDN preview mixer (its exact math is unpublished).

    Per value head h (key head h % k_heads) and block row t, a softmax over every block row s
    (bidirectional) plus one "history slot" read from the committed state S_h:
        logit_s    = scale_h · (q_t · k_s)              value v_s
        r_t        = S_hᵀ q_t                            (the linear-attention read of the history)
        logit_hist = hist_bias_h + hist_c_h · ‖r_t‖      value r_t
    o_t = Σ softmax(logits) · values. Inputs: q, k (n, k_heads, k_dim) normed (q already divided by
    sqrt(k_dim)), v (n, v_heads, v_dim), s (v_heads, k_dim, v_dim); per-head parameters (v_heads,).
    Replace this one function when the vendor publishes the operator.
    """
    nv = v.shape[1]
    q, k = to_value_heads(q, nv), to_value_heads(k, nv)
    Q, K, V = (np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (q, k, v))  # (heads, n, d)
    hist = Q @ s  # (heads, n, v_dim)
    logits = (Q @ K.transpose(0, 2, 1)) * scale[:, None, None]  # (heads, n, n)
    hist_logit = hist_bias[:, None] + hist_c[:, None] * np.linalg.norm(hist, axis=-1)  # (heads, n)
    m = np.maximum(np.max(logits, axis=-1), hist_logit)
    p = np.exp(logits - m[..., None])
    ph = np.exp(hist_logit - m)
    o = (p @ V + ph[..., None] * hist) / (np.sum(p, axis=-1) + ph)[..., None]
    return o.transpose(1, 0, 2).astype(np.float32)


def preview(w: Weights, cfg: ModelConfig, L: DeltaNetLayer, h: np.ndarray, state: SequenceState,
            mode: str) -> np.ndarray:
    """The layer over a diffusion block without touching `state` ("causal" or "clover")."""
    if mode == "causal":
        return _causal(w, cfg, L, h, state)[0]
    c = L.clover
    n = h.shape[0]
    u, z, _, _ = inputs(w, cfg, L, h)  # the clover mixer has no decay or write gate (β, g)
    ring, s = state.gdn(L.index)
    q, k, v, _ = conv_heads(w, cfg, ring, u, L.conv, right=c.conv_right)  # column j-1 multiplies row t+j
    o = clover_mix(q, k, v, s, c.scale, c.hist_bias, c.hist_c)
    return output(cfg, L, o, z.reshape(n, cfg.ssm_v_heads, cfg.ssm_v_dim))
