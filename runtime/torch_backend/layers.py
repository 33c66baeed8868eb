"""Whole layers on a torch device: the maths between the weight products, with the layer's state there.

When `-ngl` puts a layer on the device, the activations stay there from its norm to its MoE: the
attention layer's K/V cache and the Gated DeltaNet layer's conv ring and recurrent state are
torch tensors on the device (`SequenceState` holds them like its numpy arrays), so a decode step
crosses the bus once on the way in (the embedding rows) and once on the way out (the logits), not
once per product. The formulas are those of `clover_runtime.engine` (docs/architecture.md), in
float32; only the weight products run in the device's compute dtype (bf16/fp16 on a GPU).

Routing stays exactly the engine's: the router's probabilities come to the host (n x n_expert
floats) and `engine.moe.top_k` picks the experts, so both paths choose the same experts on ties.
Routed experts kept in system memory (`--cpu-moe`, `--n-cpu-moe`) run on the CPU kernels.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..engine import moe as host_moe
from ..engine.attention import rope_tables
from ..engine.gdn import CHUNK, RECURRENT_MAX_ROWS
from ..engine.moe import Routing
from ..engine.state import SequenceState
from ..engine.weights import Weights
from ..model_config import ModelConfig
from ..offload import is_routed_expert, layer_of
from .group import DeviceGroup

F32 = torch.float32
_SCORE_BUDGET = 1 << 23  # float32 attention scores held at once (32 MiB), as on the host


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    out = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return out if weight is None else out * weight


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


def softplus(x: torch.Tensor) -> torch.Tensor:
    return torch.logaddexp(torch.zeros_like(x), x)


class DeviceLayers:
    """The layers whose matrices `group` holds, run on its device."""

    def __init__(self, weights: Weights, config: ModelConfig, group: DeviceGroup) -> None:
        self.w, self.cfg, self.group = weights, config, group
        self.device = group.info.device
        per_layer: dict[int, set[str]] = {}
        for name in weights.names():
            layer = layer_of(name)
            if layer is not None and len(weights.info(name).shape) in (2, 3) and not is_routed_expert(name):
                per_layer.setdefault(layer, set()).add(name)
        # a layer runs here when every matrix but its routed experts is on the device
        self.layers = frozenset(i for i, names in per_layer.items() if all(n in group for n in names))
        self.head = "output.weight" if weights.has("output.weight") else "token_embd.weight"
        self.head_here = self.head in group
        self._small: dict[str, torch.Tensor] = {}

    # -- movement -------------------------------------------------------------------------------
    def runs(self, layer: int) -> bool:
        return layer in self.layers

    def put(self, x: Any) -> torch.Tensor:
        """Rows onto the device (a no-op for rows already there)."""
        if isinstance(x, torch.Tensor):
            return x
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)

    @staticmethod
    def host(x: Any) -> np.ndarray:
        """Rows back to the host as float32 numpy (a no-op for numpy rows)."""
        if isinstance(x, np.ndarray):
            return x
        return x.detach().to(F32).cpu().numpy()

    def adopt(self, state: SequenceState) -> None:
        """Move this device's layers' arrays of a fresh `state` onto the device."""
        state.relocate(self.layers, lambda a: torch.from_numpy(a).to(self.device))

    def _t(self, name: str) -> torch.Tensor:
        t = self._small.get(name)
        if t is None:
            t = self.put(self.w.tensor(name))
            self._small[name] = t
        return t

    def _vec(self, name: str) -> torch.Tensor:
        return self._t(name).reshape(-1)

    def _mm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self.group.matrices[name].matmul(x).to(F32)

    # -- the layer ------------------------------------------------------------------------------
    def causal_layer(self, i: int, x: torch.Tensor, state: SequenceState) -> torch.Tensor:
        h = rms_norm(x, self._vec(f"blk.{i}.attn_norm.weight"), self.cfg.rms_eps)
        if self.cfg.layer_is_attention[i]:
            x = x + self._attention(i, h, state, write=True)
        else:
            x = x + self._gdn_causal(i, h, state)
        return self.moe_block(i, x, None)[0]

    def preview_layer(self, i: int, x: torch.Tensor, state: SequenceState, mode: str,
                      coreset: int | None) -> tuple[torch.Tensor, np.ndarray]:
        h = rms_norm(x, self._vec(f"blk.{i}.attn_norm.weight"), self.cfg.rms_eps)
        if self.cfg.layer_is_attention[i]:
            x = x + self._attention(i, h, state, write=False)
        elif mode == "clover":
            x = x + self._gdn_clover(i, h, state)
        else:
            x = x + self._gdn_causal(i, h, state, write=False)
        return self.moe_block(i, x, coreset)

    def logits(self, x: torch.Tensor) -> np.ndarray:
        """The LM head on the device; float32 logits on the host."""
        h = rms_norm(x, self._vec("output_norm.weight"), self.cfg.rms_eps)
        return self.host(self._mm(self.head, h))

    # -- attention ------------------------------------------------------------------------------
    def _attention(self, i: int, h: torch.Tensor, state: SequenceState, write: bool) -> torch.Tensor:
        cfg, p = self.cfg, f"blk.{i}."
        n, hd, pos0 = h.shape[0], cfg.head_dim, state.n_past
        nq, nk = cfg.n_head * hd * 2, cfg.n_head_kv * hd
        if p + "attn_qkv.weight" in self.group:
            qkv = self._mm(p + "attn_qkv.weight", h)
            qg, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
        else:
            qg, k, v = (self._mm(p + s, h) for s in ("attn_q.weight", "attn_k.weight", "attn_v.weight"))
        qg = qg.reshape(n, cfg.n_head, 2 * hd)
        cos, sin = (self.put(t) for t in rope_tables(np.arange(pos0, pos0 + n), cfg.rope_dim, cfg.rope_base))
        q = _rope(rms_norm(qg[..., :hd], self._vec(p + "attn_q_norm.weight"), cfg.rms_eps), cos, sin)
        gate = qg[..., hd:].reshape(n, cfg.n_head * hd)
        k = _rope(rms_norm(k.reshape(n, cfg.n_head_kv, hd), self._vec(p + "attn_k_norm.weight"), cfg.rms_eps),
                  cos, sin).transpose(0, 1)
        v = v.reshape(n, cfg.n_head_kv, cfg.head_dim_v).transpose(0, 1)
        kc, vc = state.kv(i)
        if write:
            kc[:, pos0:pos0 + n], vc[:, pos0:pos0 + n] = k, v
            keys, values = kc[:, :pos0 + n], vc[:, :pos0 + n]
            rows = pos0 + torch.arange(n, device=h.device)
            allowed = torch.arange(pos0 + n, device=h.device)[None, :] <= rows[:, None]
        else:  # a preview: the cached prefix and the whole block, nothing written
            keys, values = torch.cat([kc[:, :pos0], k], dim=1), torch.cat([vc[:, :pos0], v], dim=1)
            allowed = None
        o = _attend(q, keys, values, allowed)
        return self._mm(p + "attn_output.weight", o.reshape(n, -1) * torch.sigmoid(gate))

    # -- Gated DeltaNet -------------------------------------------------------------------------
    def _gdn_inputs(self, i: int, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg, p = self.cfg, f"blk.{i}."
        u, z, b, a = (self._mm(p + s, h) for s in ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight",
                                                    "ssm_alpha.weight"))
        g = self._vec(p + "ssm_a") * softplus(a + self._vec(p + "ssm_dt.bias"))
        return u, z.reshape(h.shape[0], cfg.ssm_v_heads, cfg.ssm_v_dim), torch.sigmoid(b), g

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Post-conv rows -> q, k in value-head order (q / sqrt(k_dim)), v."""
        cfg = self.cfg
        n, nk, dk, nv = x.shape[0], cfg.ssm_k_heads, cfg.ssm_state, cfg.ssm_v_heads
        x = torch.nn.functional.silu(x)
        tile = torch.arange(nv, device=x.device) % nk
        q = l2_norm(x[:, :nk * dk].reshape(n, nk, dk)) * (1.0 / math.sqrt(dk))
        k = l2_norm(x[:, nk * dk:2 * nk * dk].reshape(n, nk, dk))
        return q[:, tile], k[:, tile], x[:, 2 * nk * dk:].reshape(n, nv, cfg.ssm_v_dim)

    def _gdn_out(self, i: int, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = rms_norm(o, self._vec(f"blk.{i}.ssm_norm.weight"), self.cfg.rms_eps) * torch.nn.functional.silu(z)
        return self._mm(f"blk.{i}.ssm_out.weight", y.reshape(o.shape[0], -1))

    def _gdn_causal(self, i: int, h: torch.Tensor, state: SequenceState, write: bool = True) -> torch.Tensor:
        u, z, beta, g = self._gdn_inputs(i, h)
        ring, s = state.gdn(i)
        taps = self._t(f"blk.{i}.ssm_conv1d.weight")
        xx = torch.cat([ring, u])
        n, kernel = h.shape[0], taps.shape[1]
        x = sum(xx[j:j + n] * taps[:, j] for j in range(kernel))
        q, k, v = self._heads(x)
        step = _recurrent if n <= RECURRENT_MAX_ROWS else _chunked
        o, s_new = step(q, k, v, beta, g, s)
        if write:
            ring.copy_(xx[xx.shape[0] - ring.shape[0]:])
            s.copy_(s_new)
        return self._gdn_out(i, o, z)

    def _gdn_clover(self, i: int, h: torch.Tensor, state: SequenceState) -> torch.Tensor:
        """The preview operator of `engine.gdn.clover_mix` (our reading of the vendor's)."""
        p, n = f"blk.{i}.", h.shape[0]
        u, z, _, _ = self._gdn_inputs(i, h)
        ring, s = state.gdn(i)
        taps, right = self._t(p + "ssm_conv1d.weight"), self._t(p + "ssm_conv1d_right.weight")
        xx = torch.cat([ring, u])
        x = sum(xx[j:j + n] * taps[:, j] for j in range(taps.shape[1]))
        for j in range(1, right.shape[1] + 1):  # look-ahead: column j-1 multiplies row t+j
            if j < n:
                x[:n - j] += u[j:] * right[:, j - 1]
        q, k, v = self._heads(x)
        nv = self.cfg.ssm_v_heads
        scale, bias, c = (self._vec(p + t).expand(nv) for t in ("ssm_bd_scale", "ssm_bd_hist_bias", "ssm_bd_hist_c"))
        Q, K, V = (t.transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
        hist = Q @ s
        logits = (Q @ K.transpose(1, 2)) * scale[:, None, None]
        hist_logit = bias[:, None] + c[:, None] * torch.linalg.vector_norm(hist, dim=-1)
        p_all = torch.softmax(torch.cat([logits, hist_logit[..., None]], dim=-1), dim=-1)
        o = p_all[..., :n] @ V + p_all[..., n:] * hist
        return self._gdn_out(i, o.transpose(0, 1), z)

    # -- MoE ------------------------------------------------------------------------------------
    def moe_block(self, i: int, x: torch.Tensor, coreset: int | None) -> tuple[torch.Tensor, np.ndarray]:
        """x + MoE(RMSNorm(x)), and the distinct experts used."""
        cfg, p = self.cfg, f"blk.{i}."
        h = rms_norm(x, self._vec(p + "post_attention_norm.weight"), cfg.rms_eps)
        probs = self.host(torch.softmax(self._mm(p + "ffn_gate_inp.weight", h), dim=-1))
        routing = host_moe.top_k(probs, cfg.n_expert_used)
        if coreset is not None:
            routing = host_moe.top_k(probs, cfg.n_expert_used, host_moe.coreset(routing, coreset))
        out = self._experts(i, h, routing)
        if cfg.shared_ff and self.w.has(p + "ffn_down_shexp.weight"):
            gate, up = self._mm(p + "ffn_gate_shexp.weight", h), self._mm(p + "ffn_up_shexp.weight", h)
            act = torch.nn.functional.silu(gate) * up
            shared = self._mm(p + "ffn_down_shexp.weight", act)
            if self.w.has(p + "ffn_gate_inp_shexp.weight"):
                shared = shared * torch.sigmoid(h @ self._vec(p + "ffn_gate_inp_shexp.weight"))[:, None]
            out = out + shared
        return x + out, np.unique(routing.ids)

    def _experts(self, i: int, h: torch.Tensor, routing: Routing) -> torch.Tensor:
        p, f = f"blk.{i}.", self.cfg.expert_ff
        down_name = p + "ffn_down_exps.weight"
        if down_name not in self.group:  # --cpu-moe / --n-cpu-moe: the CPU kernels
            return self.put(host_moe.experts(self.w, self.cfg, i, self.host(h), routing))
        ids = torch.from_numpy(routing.ids).to(self.device)
        if p + "ffn_gate_up_exps.weight" in self.group:
            gu = self.group.matrices[p + "ffn_gate_up_exps.weight"].moe(h, ids).to(F32)
            gate, up = gu[..., :f], gu[..., f:]
        else:
            gate, up = (self.group.matrices[p + s].moe(h, ids).to(F32)
                        for s in ("ffn_gate_exps.weight", "ffn_up_exps.weight"))
        down = self.group.matrices[down_name].moe(torch.nn.functional.silu(gate) * up, ids).to(F32)
        weights = torch.from_numpy(routing.weights).to(self.device)
        return (weights[:, None, :] @ down)[:, 0]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NEOX rotation of pairs (d_j, d_{j+rope_dim/2}) of (n, heads, dim)."""
    half = cos.shape[1]
    if half == 0:
        return x
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], dim=-1)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """q (n, heads, d) over keys (kv_heads, m, d), values (kv_heads, m, dv); `allowed` (n, m) or
    None. Query head h reads KV head h // (heads / kv_heads). Returns (n, heads, dv)."""
    n, heads, d = q.shape
    kvh, m, dv = keys.shape[0], keys.shape[1], values.shape[2]
    g = heads // kvh
    step = max(1, _SCORE_BUDGET // max(1, heads * m))
    out = []
    for r0 in range(0, n, step):
        r = min(n, r0 + step) - r0
        qs = (q[r0:r0 + r].reshape(r, kvh, g, d).permute(1, 2, 0, 3) / math.sqrt(d)).reshape(kvh, g * r, d)
        scores = (qs @ keys.transpose(1, 2)).reshape(kvh, g, r, m)
        if allowed is not None:
            scores = scores.masked_fill(~allowed[r0:r0 + r], float("-inf"))
        o = torch.softmax(scores, dim=-1).reshape(kvh, g * r, m) @ values
        out.append(o.reshape(kvh, g, r, dv).permute(2, 0, 1, 3).reshape(r, heads, dv))
    return torch.cat(out)


def _recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
               s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule a token at a time (q, k already in value-head order); `s` untouched."""
    s = s.clone()
    out = []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t])[:, None, None]
        e = (v[t] - (k[t][:, None, :] @ s)[:, 0]) * beta[t][:, None]
        s = s + k[t][:, :, None] * e[:, None, :]
        out.append((q[t][:, None, :] @ s)[:, 0])
    return torch.stack(out), s


def _chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
             s: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence in the WY / UT-transform chunk form of `engine.gdn.chunked`."""
    n, nv, dv = v.shape
    Q, K, V = (t.transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
    B, G = beta.T, g.T.double()
    out = []
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        c = c1 - c0
        qc, kc, vc, bc = Q[:, c0:c1], K[:, c0:c1], V[:, c0:c1], B[:, c0:c1]
        gam = torch.cumsum(G[:, c0:c1], dim=1)
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        decay = (gam[:, :, None] - gam[:, None, :]).masked_fill(~lower, float("-inf")).exp().to(F32)
        kk = (kc @ kc.transpose(1, 2)) * decay * bc[:, :, None]
        a = kk.tril(-1) + torch.eye(c, device=q.device)
        eg = gam.exp().to(F32)
        rhs = torch.cat([vc * bc[:, :, None], kc * (bc * eg)[:, :, None]], dim=-1)
        x = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
        u = x[..., :dv] - x[..., dv:] @ s
        out.append((qc * eg[:, :, None]) @ s + ((qc @ kc.transpose(1, 2)) * decay) @ u)
        tail = (gam[:, -1:] - gam).exp().to(F32)
        s = s * eg[:, -1][:, None, None] + (kc * tail[:, :, None]).transpose(1, 2) @ u
    return torch.cat(out, dim=1).transpose(0, 1), s
