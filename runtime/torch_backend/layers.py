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
from ..engine.gdn import CHUNK
from ..engine.layers import AttentionLayer, DeltaNetLayer, Layer, MoE, bind_head, bind_layers
from ..engine.moe import Routing
from ..engine.state import SequenceState
from ..engine.weights import Weights
from ..model_config import ModelConfig
from ..offload import is_routed_expert, layer_of
from .group import DeviceGroup

DEVICE_RECURRENT_MAX_ROWS = 8  # a device runs a block's rows in the chunked form (a Python step per row is slow there)

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

    def __init__(self, weights: Weights, config: ModelConfig, group: DeviceGroup,
                 host_layers: dict[int, Layer]) -> None:
        self.w, self.cfg, self.group = weights, config, group
        self.device = group.info.device
        per_layer: dict[int, set[str]] = {}
        for name in weights.names():
            layer = layer_of(name)
            if layer is not None and len(weights.info(name).shape) in (2, 3) and not is_routed_expert(name):
                per_layer.setdefault(layer, set()).add(name)
        # a layer runs here when every matrix but its routed experts is on the device
        self.layers = frozenset(i for i, names in per_layer.items() if all(n in group for n in names))
        head = "output.weight" if weights.has("output.weight") else "token_embd.weight"
        self.head_here = head in group
        self.host_layers = host_layers  # routed experts kept in system memory run on these
        binder = _DeviceBinder(self)
        self.records = bind_layers(binder, config, self.layers)
        self.head = bind_head(binder) if self.head_here else None

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

    # -- the layer's ops (engine.steps runs the layer) ---------------------------------------------
    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.cfg.rms_eps)

    def attention(self, L: AttentionLayer, h: torch.Tensor, state: SequenceState, write: bool) -> torch.Tensor:
        return self._attention(L, h, state, write)

    def deltanet(self, L: DeltaNetLayer, h: torch.Tensor, state: SequenceState, preview: str | None) -> torch.Tensor:
        if preview == "clover":
            return self._gdn_clover(L, h, state)
        return self._gdn_causal(L, h, state, write=preview is None)

    def logits(self, x: torch.Tensor) -> np.ndarray:
        """The LM head on the device; float32 logits on the host."""
        h = rms_norm(x, self.head.norm, self.cfg.rms_eps)
        return self.host(_mm(self.head.matrix, h))

    # -- attention ------------------------------------------------------------------------------
    def _attention(self, L: AttentionLayer, h: torch.Tensor, state: SequenceState, write: bool) -> torch.Tensor:
        cfg = self.cfg
        n, hd, pos0 = h.shape[0], cfg.head_dim, state.n_past
        nq, nk = cfg.n_head * hd * 2, cfg.n_head_kv * hd
        if L.qkv is not None:
            qkv = _mm(L.qkv, h)
            qg, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
        else:
            qg, k, v = (_mm(m, h) for m in (L.q, L.k, L.v))
        qg = qg.reshape(n, cfg.n_head, 2 * hd)
        cos, sin = (self.put(t) for t in rope_tables(np.arange(pos0, pos0 + n), cfg.rope_dim, cfg.rope_base))
        q = _rope(rms_norm(qg[..., :hd], L.q_norm, cfg.rms_eps), cos, sin)
        gate = qg[..., hd:].reshape(n, cfg.n_head * hd)
        k = _rope(rms_norm(k.reshape(n, cfg.n_head_kv, hd), L.k_norm, cfg.rms_eps), cos, sin).transpose(0, 1)
        v = v.reshape(n, cfg.n_head_kv, cfg.head_dim_v).transpose(0, 1)
        kc, vc = state.kv(L.index)
        if write:
            kc[:, pos0:pos0 + n], vc[:, pos0:pos0 + n] = k, v
            keys, values = kc[:, :pos0 + n], vc[:, :pos0 + n]
            rows = pos0 + torch.arange(n, device=h.device)
            allowed = torch.arange(pos0 + n, device=h.device)[None, :] <= rows[:, None]
        else:  # a preview: the cached prefix and the whole block, nothing written
            keys, values = torch.cat([kc[:, :pos0], k], dim=1), torch.cat([vc[:, :pos0], v], dim=1)
            allowed = None
        o = _attend(q, keys, values, allowed)
        return _mm(L.output, o.reshape(n, -1) * torch.sigmoid(gate))

    # -- Gated DeltaNet -------------------------------------------------------------------------
    def _gdn_inputs(self, L: DeltaNetLayer, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg = self.cfg
        u, z, b, a = (_mm(m, h) for m in (L.qkv, L.z, L.beta, L.alpha))
        g = L.a * softplus(a + L.dt_bias)
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

    def _gdn_out(self, L: DeltaNetLayer, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = rms_norm(o, L.ssm_norm, self.cfg.rms_eps) * torch.nn.functional.silu(z)
        return _mm(L.out, y.reshape(o.shape[0], -1))

    def _gdn_causal(self, L: DeltaNetLayer, h: torch.Tensor, state: SequenceState, write: bool = True) -> torch.Tensor:
        u, z, beta, g = self._gdn_inputs(L, h)
        ring, s = state.gdn(L.index)
        taps = L.conv
        xx = torch.cat([ring, u])
        n, kernel = h.shape[0], taps.shape[1]
        x = sum(xx[j:j + n] * taps[:, j] for j in range(kernel))
        q, k, v = self._heads(x)
        step = _recurrent if n <= DEVICE_RECURRENT_MAX_ROWS else _chunked
        o, s_new = step(q, k, v, beta, g, s)
        if write:
            ring.copy_(xx[xx.shape[0] - ring.shape[0]:])
            s.copy_(s_new)
        return self._gdn_out(L, o, z)

    def _gdn_clover(self, L: DeltaNetLayer, h: torch.Tensor, state: SequenceState) -> torch.Tensor:
        """The preview operator of `engine.gdn.clover_mix` (our reading of the vendor's)."""
        n, c = h.shape[0], L.clover
        u, z, _, _ = self._gdn_inputs(L, h)
        ring, s = state.gdn(L.index)
        taps, right = L.conv, c.conv_right
        xx = torch.cat([ring, u])
        x = sum(xx[j:j + n] * taps[:, j] for j in range(taps.shape[1]))
        for j in range(1, right.shape[1] + 1):  # look-ahead: column j-1 multiplies row t+j
            if j < n:
                x[:n - j] += u[j:] * right[:, j - 1]
        q, k, v = self._heads(x)
        Q, K, V = (t.transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
        hist = Q @ s
        logits = (Q @ K.transpose(1, 2)) * c.scale[:, None, None]
        hist_logit = c.hist_bias[:, None] + c.hist_c[:, None] * torch.linalg.vector_norm(hist, dim=-1)
        p_all = torch.softmax(torch.cat([logits, hist_logit[..., None]], dim=-1), dim=-1)
        o = p_all[..., :n] @ V + p_all[..., n:] * hist
        return self._gdn_out(L, o.transpose(0, 1), z)

    # -- MoE ------------------------------------------------------------------------------------
    def moe(self, m: MoE, h: torch.Tensor, coreset: int | None) -> tuple[torch.Tensor, np.ndarray]:
        """MoE(h) and the distinct experts used."""
        cfg = self.cfg
        probs = self.host(torch.softmax(_mm(m.router, h), dim=-1))
        routing = host_moe.top_k(probs, cfg.n_expert_used)
        if coreset is not None:
            routing = host_moe.top_k(probs, cfg.n_expert_used, host_moe.coreset(routing, coreset))
        out = self._experts(m, h, routing)
        if m.shared_down is not None:
            act = torch.nn.functional.silu(_mm(m.shared_gate, h)) * _mm(m.shared_up, h)
            shared = _mm(m.shared_down, act)
            if m.shared_gate_inp is not None:
                shared = shared * torch.sigmoid(h @ m.shared_gate_inp)[:, None]
            out = out + shared
        return out, np.unique(routing.ids)

    def _experts(self, m: MoE, h: torch.Tensor, routing: Routing) -> torch.Tensor:
        f = self.cfg.expert_ff
        if m.down is None:  # --cpu-moe / --n-cpu-moe: the CPU kernels
            down = host_moe.experts(self.w, self.cfg, self.host_layers[m.index].moe, self.host(h), routing)
            return self.put(host_moe.weighted_sum(routing.weights, down))
        ids = torch.from_numpy(routing.ids).to(self.device)
        if m.gate_up is not None:
            gu = m.gate_up.moe(h, ids).to(F32)
            gate, up = gu[..., :f], gu[..., f:]
        else:
            gate, up = (mat.moe(h, ids).to(F32) for mat in (m.gate, m.up))
        down = m.down.moe(torch.nn.functional.silu(gate) * up, ids).to(F32)
        weights = torch.from_numpy(routing.weights).to(self.device)
        return (weights[:, None, :] @ down)[:, 0]


class _DeviceBinder:
    """Binds the engine's layer records (`engine.layers`) with this device's tensors: the matrices
    the group holds (None for one left in system memory) and small tensors copied once."""

    def __init__(self, layers: DeviceLayers) -> None:
        self.layers = layers

    def has(self, name: str) -> bool:
        return self.layers.w.has(name)

    def matrix(self, name: str) -> Any:
        return self.layers.group.matrices.get(name)

    def fused(self, names: tuple[str, ...]) -> None:
        """Nothing is fused on a device: each matrix is its own product there."""
        return None

    def vector(self, name: str) -> torch.Tensor:
        return self.layers.put(self.layers.w.vector(name))

    def table(self, name: str) -> torch.Tensor:
        return self.layers.put(self.layers.w.table(name))

    def per_head(self, name: str, n_heads: int) -> torch.Tensor:
        return self.layers.put(self.layers.w.per_head(name, n_heads))


def _mm(m: Any, x: torch.Tensor) -> torch.Tensor:
    return m.matmul(x).to(F32)


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


def cumsum_dtype(device: torch.device) -> torch.dtype:
    """float64 for the gates' running sum (a chunk's decays are differences of it), except on MPS,
    which has no float64: float32 there, whose error over a 64-token chunk stays far below bf16's."""
    return F32 if device.type == "mps" else torch.float64


def _chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
             s: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence in the WY / UT-transform chunk form of `engine.gdn.chunked`."""
    n, nv, dv = v.shape
    Q, K, V = (t.transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
    B, G = beta.T, g.T.to(cumsum_dtype(q.device))
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
