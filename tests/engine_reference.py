"""A slow, independent reference of the Clover trunk, written from docs/architecture.md §4 and
docs/decoding.md §1.

Plain numpy in float64 with per-token and per-head loops; the file is read with gguf-py's
`GGUFReader` and every tensor dequantized with `gguf.quants.dequantize`, so nothing here shares
code with `runtime/`. Layers run layer-major over the whole sequence, which makes the preview
pass (bidirectional attention inside the block) as plain as the causal one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def _rms(v: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    out = v / np.sqrt(np.mean(v * v) + eps)
    return out * w if w is not None else out


def _sigmoid(x):  # noqa: ANN001, ANN202
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x):  # noqa: ANN001, ANN202
    return x * _sigmoid(x)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


class Reference:
    """Logits of a GGUF model computed the slow, obvious way."""

    def __init__(self, path: Path) -> None:
        reader = GGUFReader(str(path))
        meta = {k: f.contents() for k, f in reader.fields.items()}
        self.t = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)
                  for t in reader.tensors}
        a = meta["general.architecture"]
        self.n_layer = meta[f"{a}.block_count"]
        interval = meta[f"{a}.full_attention_interval"]
        self.is_attn = [(i + 1) % interval == 0 for i in range(self.n_layer)]
        self.n_head = meta[f"{a}.attention.head_count"]
        self.n_kv = meta[f"{a}.attention.head_count_kv"]
        self.hd = meta[f"{a}.attention.key_length"]
        self.eps = meta[f"{a}.attention.layer_norm_rms_epsilon"]
        self.n_rot = meta[f"{a}.rope.dimension_count"]
        self.base = meta[f"{a}.rope.freq_base"]
        self.nk = meta[f"{a}.ssm.group_count"]
        self.nv = meta[f"{a}.ssm.time_step_rank"]
        self.dk = meta[f"{a}.ssm.state_size"]
        self.dv = meta[f"{a}.ssm.inner_size"] // self.nv
        self.kernel = meta[f"{a}.ssm.conv_kernel"]
        self.n_used = meta[f"{a}.expert_used_count"]
        self.n_expert = meta[f"{a}.expert_count"]
        self.n_real = len(meta["tokenizer.ggml.tokens"])
        self.head = self.t.get("output.weight", self.t["token_embd.weight"])

    # -- public ---------------------------------------------------------------------------------
    def forward(self, ids: list[int]) -> np.ndarray:
        """Causal logits for every position, from an empty sequence."""
        return self._run(list(ids), [])

    def preview(self, prefix: list[int], block: list[int], *, gdn: str = "causal",
                coreset: int | None = None) -> np.ndarray:
        """Preview logits of the block rows after a committed prefix (docs/decoding.md §1, step 1)."""
        return self._run(list(prefix), list(block), gdn=gdn, coreset=coreset)[len(prefix):]

    # -- the pass -------------------------------------------------------------------------------
    def _run(self, prefix: list[int], block: list[int], gdn: str = "causal",
             coreset: int | None = None) -> np.ndarray:
        ids = prefix + block
        n_pre = len(prefix)
        x = np.array([self.t["token_embd.weight"][i] for i in ids])
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = np.array([_rms(r, self.t[p + "attn_norm.weight"], self.eps) for r in x])
            if self.is_attn[i]:
                x = x + self._attention(p, h, n_pre)
            else:
                x = x + self._gdn(p, h, n_pre, gdn)
            h = np.array([_rms(r, self.t[p + "post_attention_norm.weight"], self.eps) for r in x])
            x = x + self._moe(p, h, n_pre, coreset)
        logits = np.array([self.head @ _rms(r, self.t["output_norm.weight"], self.eps) for r in x])
        logits[:, self.n_real:] = -np.inf
        return logits

    def _rope(self, v: np.ndarray, pos: int) -> np.ndarray:
        out = v.copy()
        half = self.n_rot // 2
        for j in range(half):
            ang = pos * self.base ** (-2.0 * j / self.n_rot)
            c, s = np.cos(ang), np.sin(ang)
            out[j] = v[j] * c - v[j + half] * s
            out[j + half] = v[j + half] * c + v[j] * s
        return out

    def _attention(self, p: str, h: np.ndarray, n_pre: int) -> np.ndarray:
        t, hd = self.t, self.hd
        n = len(h)
        qs, gates, ks, vs = [], [], [], []
        for pos, row in enumerate(h):
            if p + "attn_qkv.weight" in t:
                qkv = t[p + "attn_qkv.weight"] @ row
                nq, nkv = self.n_head * hd * 2, self.n_kv * hd
                qg, k, v = qkv[:nq], qkv[nq:nq + nkv], qkv[nq + nkv:]
            else:
                qg = t[p + "attn_q.weight"] @ row
                k, v = t[p + "attn_k.weight"] @ row, t[p + "attn_v.weight"] @ row
            qg = qg.reshape(self.n_head, 2 * hd)
            qs.append([self._rope(_rms(qg[j, :hd], t[p + "attn_q_norm.weight"], self.eps), pos)
                       for j in range(self.n_head)])
            gates.append(qg[:, hd:].reshape(-1))
            k = k.reshape(self.n_kv, hd)
            ks.append([self._rope(_rms(k[j], t[p + "attn_k_norm.weight"], self.eps), pos)
                       for j in range(self.n_kv)])
            vs.append(v.reshape(self.n_kv, hd))
        group = self.n_head // self.n_kv
        out = np.zeros((n, t[p + "attn_output.weight"].shape[0]))
        for r in range(n):
            visible = range(r + 1) if r < n_pre else range(n)  # block rows see everything
            o = []
            for j in range(self.n_head):
                kv = j // group
                scores = np.array([qs[r][j] @ ks[c][kv] / np.sqrt(hd) for c in visible])
                w = _softmax(scores)
                o.append(sum(wc * vs[c][kv] for wc, c in zip(w, visible, strict=True)))
            o = np.concatenate(o) * _sigmoid(gates[r])
            out[r] = t[p + "attn_output.weight"] @ o
        return out

    def _gdn(self, p: str, h: np.ndarray, n_pre: int, mode: str) -> np.ndarray:
        t = self.t
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        taps = t[p + "ssm_conv1d.weight"]
        conv_dim = taps.shape[0]
        ring = [np.zeros(conv_dim) for _ in range(self.kernel - 1)]
        S = [np.zeros((dk, dv)) for _ in range(nv)]
        u_all = [t[p + "attn_qkv.weight"] @ row for row in h]
        out = np.zeros_like(h)
        clover_rows = mode == "clover" and n_pre < len(h)
        history = ring, [s.copy() for s in S]
        for r, row in enumerate(h):
            if r == n_pre and clover_rows:
                history = [x.copy() for x in ring], [s.copy() for s in S]
                break
            window = ring + [u_all[r]]
            c = sum(taps[:, j] * window[j] for j in range(self.kernel))
            ring = window[1:]
            q, k, v, z, beta, g = self._gdn_inputs(p, row, _silu(c))
            o = []
            for hh in range(nv):
                kh = hh % nk  # tiled value-head order
                S[hh] = np.exp(g[hh]) * S[hh]
                e = v[hh] - S[hh].T @ k[kh]
                S[hh] = S[hh] + np.outer(k[kh], beta[hh] * e)
                o.append(S[hh].T @ q[kh])
            out[r] = self._gdn_out(p, o, z)
        if clover_rows:
            out[n_pre:] = self._clover_block(p, h[n_pre:], u_all[n_pre:], *history)
        return out

    def _gdn_inputs(self, p: str, row: np.ndarray, c: np.ndarray) -> tuple:
        t, nk, nv, dk, dv = self.t, self.nk, self.nv, self.dk, self.dv
        q = [c[j * dk:(j + 1) * dk] for j in range(nk)]
        k = [c[nk * dk + j * dk: nk * dk + (j + 1) * dk] for j in range(nk)]
        v = [c[2 * nk * dk + j * dv: 2 * nk * dk + (j + 1) * dv] for j in range(nv)]
        q = [x / np.sqrt(x @ x + 1e-6) / np.sqrt(dk) for x in q]
        k = [x / np.sqrt(x @ x + 1e-6) for x in k]
        z = (t[p + "attn_gate.weight"] @ row).reshape(nv, dv)
        beta = _sigmoid(t[p + "ssm_beta.weight"] @ row)
        a = t[p + "ssm_alpha.weight"] @ row + t[p + "ssm_dt.bias"].reshape(-1)
        g = t[p + "ssm_a"].reshape(-1) * np.log1p(np.exp(a))
        return q, k, v, z, beta, g

    def _gdn_out(self, p: str, o: list[np.ndarray], z: np.ndarray) -> np.ndarray:
        y = [_rms(o[j], self.t[p + "ssm_norm.weight"], self.eps) * _silu(z[j]) for j in range(self.nv)]
        return self.t[p + "ssm_out.weight"] @ np.concatenate(y)

    def _clover_block(self, p: str, h: np.ndarray, u: list[np.ndarray], ring: list, S: list) -> np.ndarray:
        """The documented reading: conv with three look-ahead taps, then per value head a softmax
        over the block rows (logit scale·q·k, value v) plus a history slot (value Sᵀq, logit
        hist_bias + hist_c·‖Sᵀq‖)."""
        t = self.t
        taps, right = t[p + "ssm_conv1d.weight"], t[p + "ssm_conv1d_right.weight"]
        scale = np.broadcast_to(t[p + "ssm_bd_scale"].reshape(-1), (self.nv,))
        bias = np.broadcast_to(t[p + "ssm_bd_hist_bias"].reshape(-1), (self.nv,))
        cc = np.broadcast_to(t[p + "ssm_bd_hist_c"].reshape(-1), (self.nv,))
        n = len(h)
        rows = ring + list(u)
        inputs = []
        for r in range(n):
            c = sum(taps[:, j] * rows[r + j] for j in range(self.kernel))
            for j in range(1, right.shape[1] + 1):
                if r + j < n:
                    c = c + right[:, j - 1] * u[r + j]
            inputs.append(self._gdn_inputs(p, h[r], _silu(c)))
        out = np.zeros_like(h)
        for r in range(n):
            q, _, _, z, _, _ = inputs[r]
            o = []
            for hh in range(self.nv):
                kh = hh % self.nk
                read = S[hh].T @ q[kh]
                logits = [scale[hh] * (q[kh] @ inputs[s][1][kh]) for s in range(n)]
                logits.append(bias[hh] + cc[hh] * np.linalg.norm(read))
                w = _softmax(np.array(logits))
                o.append(sum(w[s] * inputs[s][2][hh] for s in range(n)) + w[n] * read)
            out[r] = self._gdn_out(p, o, z)
        return out

    def _moe(self, p: str, h: np.ndarray, n_pre: int, coreset: int | None) -> np.ndarray:
        t = self.t
        probs = [_softmax(t[p + "ffn_gate_inp.weight"] @ row) for row in h]
        choices = [self._top(pr, range(self.n_expert)) for pr in probs]
        if coreset is not None and n_pre < len(h):
            total: dict[int, float] = {}
            for ids, ws in choices[n_pre:]:
                for e, w in zip(ids, ws, strict=True):
                    total[e] = total.get(e, 0.0) + w
            ranked = sorted(total, key=lambda e: (-total[e], e))[:coreset]
            for r in range(n_pre, len(h)):
                choices[r] = self._top(probs[r], ranked)
        out = np.zeros_like(h)
        for r, row in enumerate(h):
            for e, w in zip(*choices[r], strict=True):
                out[r] += w * self._expert(p, e, row)
            if p + "ffn_down_shexp.weight" in t:
                act = _silu(t[p + "ffn_gate_shexp.weight"] @ row) * (t[p + "ffn_up_shexp.weight"] @ row)
                gate = _sigmoid(t[p + "ffn_gate_inp_shexp.weight"].reshape(-1) @ row)
                out[r] += gate * (t[p + "ffn_down_shexp.weight"] @ act)
        return out

    def _top(self, probs: np.ndarray, allowed) -> tuple[list[int], list[float]]:  # noqa: ANN001
        ids = sorted(allowed, key=lambda e: (-probs[e], e))[:self.n_used]
        z = sum(probs[e] for e in ids)
        return ids, [probs[e] / z for e in ids]

    def _expert(self, p: str, e: int, row: np.ndarray) -> np.ndarray:
        t = self.t
        if p + "ffn_gate_up_exps.weight" in t:
            gu = t[p + "ffn_gate_up_exps.weight"][e] @ row
            gate, up = np.split(gu, 2)
        else:
            gate, up = t[p + "ffn_gate_exps.weight"][e] @ row, t[p + "ffn_up_exps.weight"][e] @ row
        return t[p + "ffn_down_exps.weight"][e] @ (_silu(gate) * up)
