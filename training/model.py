"""The Clover architecture in torch, computed exactly as clover's engine computes it.

One forward runs two streams layer by layer: the clean sequence (the causal pass: prefill,
decode and commit) and, optionally, diffusion blocks placed on it (the preview pass: a block
sees the clean tokens before its start causally and itself bidirectionally; Gated DeltaNet
layers run the Clover block operator from the causal state at the block start). Parameters
have the GGUF tensors' numpy shapes, so `gguf_tensors` is a plain renaming, and the shape of
the model is a `SynthSpec`, the same description clover's GGUF writer takes.

The maths follows clover-model.md §4-5 and the engine (`clover_runtime.engine`): RMSNorm
weights hold their +1 offset, `ssm_a` is stored as -exp(A_log), value head h reads key head
h % k_heads, RoPE is NEOX on the first `rope_dim` dims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from clover_runtime.synth import SynthSpec
from torch import Tensor, nn

RIGHT_TAPS = 3  # look-ahead conv taps of the Clover block operator (`ssm_conv1d_right`)
CHUNK = 32  # rows per chunk of the gated delta rule


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def l2_norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def _param(*shape: int, std: float | None = None, value: float | None = None) -> nn.Parameter:
    if value is not None:
        return nn.Parameter(torch.full(shape, float(value)))
    return nn.Parameter(torch.randn(*shape) * (std if std is not None else 1.0 / math.sqrt(shape[-1])))


@dataclass
class Streams:
    """Activations of one layer: the clean rows (B, T, H) and the block rows (B, nb, L, H) or None."""

    x: Tensor
    xn: Tensor | None


@dataclass(frozen=True)
class Past:
    """What a mixer keeps after a prefix shared by every row of a batch (computed once, batch 1):
    its row count and, per layer kind, the K/V (attention) or the conv ring and state (GDN)."""

    rows: int
    tensors: tuple[Tensor, ...]


def rope(x: Tensor, pos: Tensor, rope_dim: int, base: float) -> Tensor:
    """NEOX rotation of (d_j, d_{j+rope_dim/2}) for x (..., n, heads, d) at positions pos (..., n)."""
    half = rope_dim // 2
    if half == 0:
        return x
    inv = base ** (-torch.arange(half, dtype=torch.float64) * 2.0 / rope_dim)
    ang = pos.to(torch.float64)[..., None] * inv
    cos, sin = ang.cos().float()[..., None, :], ang.sin().float()[..., None, :]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Softmax attention: q (..., n, H, d) over k (..., m, Hkv, d), v (..., m, Hkv, dv); mask
    broadcastable to (..., H, n, m). Query head h uses KV head h // (H / Hkv)."""
    group = q.shape[-2] // k.shape[-2]
    k = k.repeat_interleave(group, dim=-2)
    v = v.repeat_interleave(group, dim=-2)
    scores = torch.einsum("...nhd,...mhd->...hnm", q, k) / math.sqrt(q.shape[-1])
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.einsum("...hnm,...mhd->...nhd", p, v)


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, wanted: list[int],
               chunk: int = CHUNK, S0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule from state S0 (zero if None) in the chunked (WY / UT-transform) form, batched.

    q, k (B, T, nv, dk) in value-head order, v (B, T, nv, dv), beta, g (B, T, nv). Per value
    head: S <- exp(g)·S; e = v - Sᵀk; S <- S + k ⊗ (β·e); o = Sᵀq. Inside a chunk, with Γ the
    cumulative log decay: u = (I + A)⁻¹(βv − βe^Γ k S₀), A[i,j] = β_i e^{Γ_i−Γ_j} k_i·k_j (j < i);
    o_i = e^{Γ_i} q_i S₀ + Σ_{j≤i} e^{Γ_i−Γ_j} (q_i·k_j) u_j; the state after row i is
    e^{Γ_i} S₀ + Σ_{j≤i} e^{Γ_i−Γ_j} k_j u_jᵀ. Returns o (B, T, nv, dv) and the states after the
    `wanted` rows (B, len(wanted), nv, dk, dv).
    """
    B, T, nv, dk = k.shape
    dv = v.shape[-1]
    n = -(-T // chunk)
    pad = n * chunk - T

    def chunks(x: Tensor) -> Tensor:  # (B, T, nv, ...) -> (B, nv, n, chunk, ...)
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)) if pad else x
        return x.unflatten(1, (n, chunk)).movedim(3, 1)

    Q, K, V = chunks(q), chunks(k), chunks(v)
    bet, gam = chunks(beta), chunks(g).cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    decay = (gam[..., :, None] - gam[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    kk = (K @ K.transpose(-1, -2)) * decay * bet[..., None]
    A = kk.masked_fill(~torch.ones(chunk, chunk, dtype=torch.bool).tril(-1), 0.0) + torch.eye(chunk)
    eg = gam.exp()
    rhs = torch.cat([V * bet[..., None], K * (bet * eg)[..., None]], dim=-1)
    x = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    qk = (Q @ K.transpose(-1, -2)) * decay
    S = q.new_zeros(B, nv, dk, dv) if S0 is None else S0.expand(B, nv, dk, dv)
    outs, kept = [], {}
    for c in range(n):
        u = x[:, :, c, :, :dv] - x[:, :, c, :, dv:] @ S
        outs.append((Q[:, :, c] * eg[:, :, c, :, None]) @ S + qk[:, :, c] @ u)
        for t in (t for t in wanted if c * chunk <= t < (c + 1) * chunk):
            i = t - c * chunk
            w = decay[:, :, c, i, :, None] * K[:, :, c]  # (B, nv, chunk, dk), zero past row i
            kept[t] = eg[:, :, c, i, None, None] * S + w.transpose(-1, -2) @ u
        S = S * eg[:, :, c, -1, None, None] + (K[:, :, c] * decay[:, :, c, -1, :, None]).transpose(-1, -2) @ u
    o = torch.stack(outs, dim=2).flatten(2, 3)[:, :, :T].transpose(1, 2)
    states = torch.stack([kept[t] for t in wanted], dim=1) if wanted else q.new_zeros(B, 0, nv, dk, dv)
    return o, states


class Attention(nn.Module):
    """Gated full attention: q/k RMSNorm, partial RoPE, GQA, a sigmoid output gate."""

    def __init__(self, s: SynthSpec) -> None:
        super().__init__()
        self.s = s
        h, hd, hv = s.hidden, s.head_dim, s.v_head_dim
        self.q = _param(s.n_head * hd * 2, h)
        self.k = _param(s.n_head_kv * hd, h)
        self.v = _param(s.n_head_kv * hv, h)
        self.q_norm = _param(hd, value=1.0)
        self.k_norm = _param(hd, value=1.0)
        self.o = _param(h, s.n_head * hv, std=1.0 / math.sqrt(2 * s.n_layer * s.n_head * hv))

    def _project(self, h: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        s = self.s
        qg = F.linear(h, self.q).unflatten(-1, (s.n_head, 2 * s.head_dim))
        q = rope(rms_norm(qg[..., :s.head_dim], self.q_norm, s.rms_eps), pos, s.rope_dim, s.rope_base)
        gate = qg[..., s.head_dim:].flatten(-2)
        k = rms_norm(F.linear(h, self.k).unflatten(-1, (s.n_head_kv, s.head_dim)), self.k_norm, s.rms_eps)
        v = F.linear(h, self.v).unflatten(-1, (s.n_head_kv, s.v_head_dim))
        return q, gate, rope(k, pos, s.rope_dim, s.rope_base), v

    def _out(self, o: Tensor, gate: Tensor) -> Tensor:
        return F.linear(o.flatten(-2) * torch.sigmoid(gate), self.o)

    def forward(self, h: Tensor, hn: Tensor | None, starts: Tensor | None,
                past: Past | None = None) -> tuple[Tensor, Tensor | None, tuple[Tensor, ...]]:
        """Clean rows h (B, T, H) after `past` (the K/V of a shared prefix, batch 1), block rows hn;
        returns both outputs and this call's K/V (the cache a prefix pass hands on)."""
        B, T = h.shape[:2]
        P = 0 if past is None else past.rows
        q, gate, k, v = self._project(h, P + torch.arange(T))
        keys, vals = k, v
        if past is not None:
            pk, pv = past.tensors
            keys = torch.cat([pk.expand(B, *pk.shape[1:]), k], dim=1)
            vals = torch.cat([pv.expand(B, *pv.shape[1:]), v], dim=1)
        causal = torch.ones(T, P + T, dtype=torch.bool).tril(P)
        out = self._out(attend(q, keys, vals, causal), gate)
        if hn is None:
            return out, None, (k, v)
        assert starts is not None
        nb, L = hn.shape[1:3]
        qn, gn, kn, vn = self._project(hn, starts[..., None] + torch.arange(L))
        keys = torch.cat([keys[:, None].expand(B, nb, *keys.shape[1:]), kn], dim=2)
        vals = torch.cat([vals[:, None].expand(B, nb, *vals.shape[1:]), vn], dim=2)
        seen = torch.cat([torch.arange(P + T) < starts[..., None], torch.ones(B, nb, L, dtype=torch.bool)], dim=-1)
        return out, self._out(attend(qn, keys, vals, seen[:, :, None, None, :]), gn), (k, v)


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet with the Clover-only block operator for diffusion blocks."""

    def __init__(self, s: SynthSpec) -> None:
        super().__init__()
        self.s = s
        h, nv, cd = s.hidden, s.ssm_v_heads, s.conv_dim
        self.qkv = _param(cd, h)
        self.gate = _param(s.ssm_inner, h)
        self.beta = _param(nv, h)
        self.alpha = _param(nv, h)
        dt = torch.exp(torch.empty(nv).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.a_log = nn.Parameter(torch.log(torch.empty(nv).uniform_(1.0, 16.0)))
        self.conv = nn.Parameter(torch.empty(cd, s.conv_kernel).uniform_(-1, 1) / math.sqrt(s.conv_kernel))
        self.norm = _param(s.gdn_v_dim, value=1.0)
        self.out = _param(h, s.ssm_inner, std=1.0 / math.sqrt(2 * s.n_layer * s.ssm_inner))
        self.conv_right = nn.Parameter(torch.empty(cd, RIGHT_TAPS).uniform_(-0.5, 0.5) / math.sqrt(s.conv_kernel))
        self.bd_scale = _param(nv, value=2.0 * math.sqrt(s.ssm_state))
        self.bd_hist_bias = _param(nv, value=math.log(16.0))
        self.bd_hist_c = _param(nv, value=0.5)
        self.chunk = CHUNK

    @property
    def ssm_a(self) -> Tensor:
        return -torch.exp(self.a_log)

    def _heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Post-conv rows (..., conv_dim) -> q, k (..., v_heads, k_dim) in value-head order, v."""
        s = self.s
        nk, dk, nv = s.ssm_k_heads, s.ssm_state, s.ssm_v_heads
        x = F.silu(x)
        q = l2_norm(x[..., :nk * dk].unflatten(-1, (nk, dk))) * (1.0 / math.sqrt(dk))
        k = l2_norm(x[..., nk * dk:2 * nk * dk].unflatten(-1, (nk, dk)))
        v = x[..., 2 * nk * dk:].unflatten(-1, (nv, s.gdn_v_dim))
        tile = torch.arange(nv) % nk
        return q[..., tile, :], k[..., tile, :], v

    def _output(self, o: Tensor, z: Tensor) -> Tensor:
        y = rms_norm(o, self.norm, self.s.rms_eps) * F.silu(z)
        return F.linear(y.flatten(-2), self.out)

    def forward(self, h: Tensor, hn: Tensor | None, starts: Tensor | None,
                past: Past | None = None) -> tuple[Tensor, Tensor | None, tuple[Tensor, ...]]:
        """Clean rows h (B, T, H) after `past` (the conv ring and recurrent state after a shared
        prefix, batch 1), block rows hn; returns both outputs and the ring and state after h."""
        s = self.s
        B, T = h.shape[:2]
        K = s.conv_kernel
        P = 0
        u = F.linear(h, self.qkv)
        z = F.linear(h, self.gate).unflatten(-1, (s.ssm_v_heads, s.gdn_v_dim))
        beta = torch.sigmoid(F.linear(h, self.beta))
        g = self.ssm_a * F.softplus(F.linear(h, self.alpha) + self.dt_bias)
        if past is None:
            padded, S_in = F.pad(u, (0, 0, K - 1, 0)), None
        else:
            P, (ring, S_in) = past.rows, past.tensors
            padded = torch.cat([ring.expand(B, *ring.shape[1:]), u], dim=1)
        x = sum(padded[:, j:j + T] * self.conv[:, j] for j in range(K))
        q, k, v = self._heads(x)
        wanted = sorted({T - 1} | (set() if starts is None else {int(t) - 1 - P for t in starts.reshape(-1).tolist()}))
        o, kept = delta_rule(q, k, v, beta, g, wanted, self.chunk, S_in)
        out = self._output(o, z)
        cache = (padded[:, T:], kept[:, wanted.index(T - 1)])
        if hn is None:
            return out, None, cache
        assert starts is not None
        where = torch.tensor([wanted.index(int(t) - 1 - P) for t in starts.reshape(-1).tolist()]).view(starts.shape)
        S0 = kept[torch.arange(B)[:, None], where]  # (B, nb, nv, dk, dv)
        ring_rows = starts[..., None] - P - (K - 1) + torch.arange(K - 1)  # rows of u before each block
        ring = padded[torch.arange(B)[:, None, None], ring_rows + (K - 1)]  # (B, nb, K-1, conv_dim)
        return out, self.block(hn, ring, S0), cache

    def block(self, hn: Tensor, ring: Tensor, S0: Tensor) -> Tensor:
        """The Clover block operator over blocks hn (B, nb, L, H) from conv rings (B, nb, K-1, C) and
        states S0 (B, nb, nv, dk, dv): conv with look-ahead taps, then per value head a softmax
        over the block rows (logit scale·q·k, value v) plus a history slot (value Sᵀq, logit
        hist_bias + hist_c·‖Sᵀq‖). β and g are not used."""
        s = self.s
        L, K = hn.shape[2], s.conv_kernel
        u = F.linear(hn, self.qkv)
        z = F.linear(hn, self.gate).unflatten(-1, (s.ssm_v_heads, s.gdn_v_dim))
        xx = torch.cat([ring, u], dim=2)
        x = sum(xx[:, :, j:j + L] * self.conv[:, j] for j in range(K))
        ahead = F.pad(u, (0, 0, 0, RIGHT_TAPS))
        x = x + sum(ahead[:, :, j:j + L] * self.conv_right[:, j - 1] for j in range(1, RIGHT_TAPS + 1))
        q, k, v = self._heads(x)
        hist = torch.einsum("bnlhk,bnhkv->bnlhv", q, S0)
        logits = torch.einsum("bnlhk,bnmhk->bnhlm", q, k) * self.bd_scale[:, None, None]
        hist_logit = self.bd_hist_bias + self.bd_hist_c * torch.linalg.vector_norm(hist, dim=-1)
        p = torch.softmax(torch.cat([logits, hist_logit.transpose(2, 3)[..., None]], dim=-1), dim=-1)
        o = torch.einsum("bnhlm,bnmhv->bnlhv", p[..., :L], v) + p[..., L].transpose(2, 3)[..., None] * hist
        return self._output(o, z)


class MoE(nn.Module):
    """Softmax router, top-k renormalised, SiLU-gated experts, plus a sigmoid-gated shared expert."""

    def __init__(self, s: SynthSpec) -> None:
        super().__init__()
        self.s = s
        h, e, f, sf = s.hidden, s.n_expert, s.expert_ff, s.shared_ff
        down_std = 1.0 / math.sqrt(2 * s.n_layer * f)
        self.router = _param(e, h)
        self.gate_exps = _param(e, f, h)
        self.up_exps = _param(e, f, h)
        self.down_exps = _param(e, h, f, std=down_std)
        self.gate_inp_shexp = _param(h)
        self.gate_shexp = _param(sf, h)
        self.up_shexp = _param(sf, h)
        self.down_shexp = _param(h, sf, std=1.0 / math.sqrt(2 * s.n_layer * sf))

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Output rows like h, and the switch-style load-balancing loss of this call."""
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        probs = torch.softmax(F.linear(x, self.router), dim=-1)
        top, ids = torch.topk(probs, self.s.n_expert_used, dim=-1)
        weights = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(self.s.n_expert):
            rows, slot = torch.nonzero(ids == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = x[rows]
            act = F.silu(F.linear(xe, self.gate_exps[e])) * F.linear(xe, self.up_exps[e])
            out = out.index_add(0, rows, F.linear(act, self.down_exps[e]) * weights[rows, slot, None])
        shared = F.linear(F.silu(F.linear(x, self.gate_shexp)) * F.linear(x, self.up_shexp), self.down_shexp)
        out = out + shared * torch.sigmoid(x @ self.gate_inp_shexp)[:, None]
        load = torch.zeros(self.s.n_expert).index_add(0, ids.reshape(-1), torch.ones(ids.numel()))
        balance = self.s.n_expert * torch.sum(load / ids.numel() * probs.mean(0))
        return out.reshape(shape), balance


class Layer(nn.Module):
    def __init__(self, s: SynthSpec, index: int) -> None:
        super().__init__()
        self.is_attention = s.is_attention(index)
        self.attn_norm = _param(s.hidden, value=1.0)
        self.post_norm = _param(s.hidden, value=1.0)
        self.mixer: nn.Module = Attention(s) if self.is_attention else GatedDeltaNet(s)
        self.moe = MoE(s)
        self.eps = s.rms_eps

    def forward(self, st: Streams, starts: Tensor | None,
                past: Past | None = None) -> tuple[Streams, Tensor, tuple[Tensor, ...]]:
        hn = None if st.xn is None else rms_norm(st.xn, self.attn_norm, self.eps)
        out, out_n, cache = self.mixer(rms_norm(st.x, self.attn_norm, self.eps), hn, starts, past)
        x = st.x + out
        xn = None if st.xn is None else st.xn + out_n
        n = x.shape[0] * x.shape[1]
        rows = x.reshape(n, -1) if xn is None else torch.cat([x.reshape(n, -1), xn.reshape(-1, x.shape[-1])])
        moe_out, balance = self.moe(rms_norm(rows, self.post_norm, self.eps))
        x = x + moe_out[:n].reshape(x.shape)
        if xn is not None:
            xn = xn + moe_out[n:].reshape(xn.shape)
        return Streams(x, xn), balance, cache


def shared_prefix(ids: Tensor, starts: Tensor | None, least: int = 8) -> int:
    """How many leading tokens every row of the batch shares and no row predicts (0 when fewer
    than `least`): tool dialogues share the ~400-token tool prompt, which then runs once."""
    if ids.shape[0] < 2 or starts is None:
        return 0
    differs = (ids != ids[:1]).any(0).nonzero()
    common = int(differs[0]) if len(differs) else ids.shape[1]
    rows = min(common, int(starts.min()) - 1)
    return rows if rows >= least else 0


class CloverLM(nn.Module):
    """The whole trunk and LM head; `spec.n_vocab` rows of embedding (all of them real tokens)."""

    def __init__(self, spec: SynthSpec) -> None:
        super().__init__()
        if spec.n_vocab is None:
            raise ValueError("the spec must give n_vocab (the trained vocabulary's size)")
        self.spec = spec
        self.embed = _param(spec.n_vocab, spec.hidden)
        self.layers = nn.ModuleList(Layer(spec, i) for i in range(spec.n_layer))
        self.out_norm = _param(spec.hidden, value=1.0)
        self.output = None if spec.tied_output else _param(spec.n_vocab, spec.hidden)

    @property
    def head(self) -> Tensor:
        return self.embed if self.output is None else self.output

    def hidden_states(self, ids: Tensor, blocks: Tensor | None = None,
                      starts: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
        """Final-normed hidden rows of the clean sequence ids (B, T) and of the diffusion blocks
        (B, nb, L) starting at positions starts (B, nb) on it (each start ≥ 1), plus the mean
        load-balancing loss."""
        B = ids.shape[0]
        P = shared_prefix(ids, starts)
        st = Streams(self.embed[ids[:, P:]], None if blocks is None else self.embed[blocks])
        head = Streams(self.embed[ids[:1, :P]], None)
        balance = ids.new_zeros((), dtype=torch.float32)
        for layer in self.layers:
            past = None
            if P:
                head, b_head, cache = layer(head, None)
                past = Past(P, cache)
            st, b, _ = layer(st, starts, past)
            if P:  # the balance term over the batch's rows, with the shared rows counted once
                n = st.x.shape[0] * st.x.shape[1] + (0 if st.xn is None else st.xn[..., 0].numel())
                b = (b * n + b_head * P) / (n + P)
            balance = balance + b / len(self.layers)
        eps = self.spec.rms_eps
        x = torch.cat([head.x.expand(B, P, head.x.shape[-1]), st.x], dim=1) if P else st.x
        xn = None if st.xn is None else rms_norm(st.xn, self.out_norm, eps)
        return rms_norm(x, self.out_norm, eps), xn, balance

    def logits(self, rows: Tensor) -> Tensor:
        return F.linear(rows, self.head)

    def forward(self, ids: Tensor, blocks: Tensor | None = None,
                starts: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Causal logits (B, T, V) and block preview logits (B, nb, L, V) or None."""
        x, xn, _ = self.hidden_states(ids, blocks, starts)
        return self.logits(x), None if xn is None else self.logits(xn)

    # -- export ---------------------------------------------------------------------------------
    def gguf_tensors(self) -> dict[str, np.ndarray]:
        """Every tensor under its GGUF name, float32 in the numpy shape clover's writer plans."""
        t: dict[str, Tensor] = {"token_embd.weight": self.embed, "output_norm.weight": self.out_norm}
        if self.output is not None:
            t["output.weight"] = self.output
        for i, layer in enumerate(self.layers):
            p = f"blk.{i}."
            t[p + "attn_norm.weight"] = layer.attn_norm
            t[p + "post_attention_norm.weight"] = layer.post_norm
            m = layer.mixer
            if isinstance(m, Attention):
                t.update({p + "attn_q.weight": m.q, p + "attn_k.weight": m.k, p + "attn_v.weight": m.v,
                          p + "attn_q_norm.weight": m.q_norm, p + "attn_k_norm.weight": m.k_norm,
                          p + "attn_output.weight": m.o})
            else:
                assert isinstance(m, GatedDeltaNet)
                t.update({p + "attn_qkv.weight": m.qkv, p + "attn_gate.weight": m.gate,
                          p + "ssm_beta.weight": m.beta, p + "ssm_alpha.weight": m.alpha,
                          p + "ssm_dt.bias": m.dt_bias, p + "ssm_a": m.ssm_a, p + "ssm_conv1d.weight": m.conv,
                          p + "ssm_norm.weight": m.norm, p + "ssm_out.weight": m.out,
                          p + "ssm_conv1d_right.weight": m.conv_right, p + "ssm_bd_scale": m.bd_scale,
                          p + "ssm_bd_hist_bias": m.bd_hist_bias, p + "ssm_bd_hist_c": m.bd_hist_c})
            e = layer.moe
            t.update({p + "ffn_gate_inp.weight": e.router, p + "ffn_gate_exps.weight": e.gate_exps,
                      p + "ffn_up_exps.weight": e.up_exps, p + "ffn_down_exps.weight": e.down_exps,
                      p + "ffn_gate_inp_shexp.weight": e.gate_inp_shexp, p + "ffn_gate_shexp.weight": e.gate_shexp,
                      p + "ffn_up_shexp.weight": e.up_shexp, p + "ffn_down_shexp.weight": e.down_shexp})
        with torch.no_grad():
            return {name: value.detach().float().contiguous().numpy().copy() for name, value in t.items()}
