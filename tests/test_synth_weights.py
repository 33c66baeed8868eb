"""Synthetic weights have the structure of a converted Clover GGUF and keep activations sane.

The forward pass here is a slow per-token reference written from docs/architecture.md §4 (not the
engine), used only to watch activation magnitudes through a deep tiny model.
"""

from __future__ import annotations

import numpy as np
from clover_runtime.gguf_file import open_gguf
from clover_runtime.model_config import describe
from clover_runtime.synth import SynthSpec
from synth_models import model_path, tiny_model_path


def _f32(f, name):
    t = f.tensors[name]
    return f.raw(name).view(np.float32).reshape(t.shape)


def test_weights_have_the_converted_structure():
    f = open_gguf(tiny_model_path())
    cfg = describe(f)
    for name in f.tensors:
        if name.endswith("norm.weight"):
            w = _f32(f, name)
            assert 0.7 < w.min() and w.max() < 1.3, name  # stored as 1 + w
            assert w.std() > 1e-3, name  # not a constant
    for i in cfg.gdn_layers:
        p = f"blk.{i}."
        a = _f32(f, p + "ssm_a")
        assert (a < 0).all() and (a >= -16).all() and a.std() > 0  # -exp(A_log)
        dt = np.log1p(np.exp(_f32(f, p + "ssm_dt.bias").astype(np.float64)))  # softplus
        assert (dt > 0.9e-3).all() and (dt < 0.11).all()
        conv = _f32(f, p + "ssm_conv1d.weight")
        assert conv.shape == (cfg.ssm_conv_dim, cfg.ssm_conv_kernel) and np.abs(conv).max() <= 0.5
        for suffix in ("ssm_bd_scale", "ssm_bd_hist_bias", "ssm_bd_hist_c"):
            assert f.tensors[p + suffix].shape == (cfg.ssm_v_heads,)
        assert (_f32(f, p + "ssm_bd_scale") > 0).all()
    router = _f32(f, "blk.0.ffn_gate_inp.weight")
    assert abs(router.std() * np.sqrt(cfg.n_embd) - 1) < 0.15
    for name, fan_in in (("blk.0.ffn_gate_exps.weight", 64), ("blk.0.attn_qkv.weight", 64)):
        assert abs(_f32(f, name).std() * np.sqrt(fan_in) - 1) < 0.1, name
    down = _f32(f, "blk.0.ffn_down_exps.weight")
    assert abs(down.std() * np.sqrt(32) * np.sqrt(2 * cfg.n_layer) - 1) < 0.1  # residual scaling
    assert not np.array_equal(down[0], down[1])


def _rms(v, w, eps=1e-6):
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * w


def _silu(v):
    return v / (1 + np.exp(-v))


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


def _attention(f, cfg, p, h):
    n, hd, kv = h.shape[0], cfg.head_dim, cfg.n_head_kv
    qg = (h @ _f32(f, p + "attn_q.weight").T).reshape(n, cfg.n_head, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    k = (h @ _f32(f, p + "attn_k.weight").T).reshape(n, kv, hd)
    v = (h @ _f32(f, p + "attn_v.weight").T).reshape(n, kv, hd)
    q, k = _rms(q, _f32(f, p + "attn_q_norm.weight")), _rms(k, _f32(f, p + "attn_k_norm.weight"))
    half = cfg.rope_dim // 2
    ang = np.arange(n)[:, None] * cfg.rope_base ** (-2 * np.arange(half) / cfg.rope_dim)
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    for t in (q, k):
        a, b = t[..., :half].copy(), t[..., half:cfg.rope_dim].copy()
        t[..., :half], t[..., half:cfg.rope_dim] = a * cos - b * sin, b * cos + a * sin
    o = np.empty((n, cfg.n_head, hd))
    for hh in range(cfg.n_head):
        kvh = hh // (cfg.n_head // kv)
        s = q[:, hh] @ k[:, kvh].T / np.sqrt(hd) + np.triu(np.full((n, n), -np.inf), 1)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        o[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kvh]
    return (o * _sigmoid(gate)).reshape(n, -1) @ _f32(f, p + "attn_output.weight").T


def _gdn(f, cfg, p, h):
    n, kh, vh, dk, dv = h.shape[0], cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_state, cfg.ssm_v_dim
    u = h @ _f32(f, p + "attn_qkv.weight").T
    z = (h @ _f32(f, p + "attn_gate.weight").T).reshape(n, vh, dv)
    beta = _sigmoid(h @ _f32(f, p + "ssm_beta.weight").T)
    a = h @ _f32(f, p + "ssm_alpha.weight").T
    g = _f32(f, p + "ssm_a") * np.log1p(np.exp(a + _f32(f, p + "ssm_dt.bias")))
    conv = _f32(f, p + "ssm_conv1d.weight")
    kern = conv.shape[1]
    padded = np.concatenate([np.zeros((kern - 1, u.shape[1])), u])
    c = _silu(sum(padded[j:j + n] * conv[:, j] for j in range(kern)))
    q = c[:, :kh * dk].reshape(n, kh, dk)
    k = c[:, kh * dk:2 * kh * dk].reshape(n, kh, dk)
    v = c[:, 2 * kh * dk:].reshape(n, vh, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    state = np.zeros((vh, dk, dv))
    o = np.empty((n, vh, dv))
    for t in range(n):
        for hh in range(vh):
            kk = hh % kh
            state[hh] *= np.exp(g[t, hh])
            e = v[t, hh] - state[hh].T @ k[t, kk]
            state[hh] += np.outer(k[t, kk], beta[t, hh] * e)
            o[t, hh] = state[hh].T @ q[t, kk]
    y = _rms(o, _f32(f, p + "ssm_norm.weight")) * _silu(z)
    return y.reshape(n, -1) @ _f32(f, p + "ssm_out.weight").T


def _moe(f, cfg, p, h):
    logits = h @ _f32(f, p + "ffn_gate_inp.weight").T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    top = np.argsort(-prob, axis=-1)[:, :cfg.n_expert_used]
    gate, up, down = (_f32(f, p + f"ffn_{x}_exps.weight") for x in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        w = prob[t, top[t]] / prob[t, top[t]].sum()
        for e, we in zip(top[t], w, strict=True):
            out[t] += we * (down[e] @ (_silu(gate[e] @ h[t]) * (up[e] @ h[t])))
    shared = (_silu(h @ _f32(f, p + "ffn_gate_shexp.weight").T) * (h @ _f32(f, p + "ffn_up_shexp.weight").T))
    out += _sigmoid(h @ _f32(f, p + "ffn_gate_inp_shexp.weight"))[:, None] * (
        shared @ _f32(f, p + "ffn_down_shexp.weight").T)
    return out, {tuple(sorted(r)) for r in top}


def test_activations_stay_sane_through_a_deep_model():
    f = open_gguf(model_path(SynthSpec.tiny(n_layer=16, seed=3)))
    cfg = describe(f)
    ids = np.array([5, 17, 99, 200, 3, 3, 42, 250])
    x = _f32(f, "token_embd.weight")[ids].astype(np.float64)
    norms, routes = [], set()
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        h = _rms(x, _f32(f, p + "attn_norm.weight"))
        mix = _attention(f, cfg, p, h) if cfg.layer_is_attention[i] else _gdn(f, cfg, p, h)
        assert 0.05 < np.sqrt(np.mean(mix ** 2)) < 5, f"layer {i} mixer output"
        x = x + mix
        moe, chosen = _moe(f, cfg, p, _rms(x, _f32(f, p + "post_attention_norm.weight")))
        routes |= chosen
        x = x + moe
        norms.append(float(np.sqrt(np.mean(x ** 2))))
    logits = _rms(x, _f32(f, "output_norm.weight")) @ _f32(f, "output.weight").T
    assert np.isfinite(logits).all()
    assert all(0.1 < r < 5 for r in norms), norms
    assert norms[-1] < 4 * norms[1]
    assert 1 < logits.std() < 6
    assert len(routes) > 4  # the router spreads tokens over many expert pairs
    assert len(set(logits.argmax(-1).tolist())) > 2  # different tokens predict different things
