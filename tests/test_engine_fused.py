"""Tensors that multiply the same input read into one matrix at load (`Weights.fuse`): gate and up
of the experts and of the shared expert, a GDN layer's four input projections (or the three that
share a type beside a Q5_K qkv). The products give the bits of the separate ones, each tensor is
read once, and a mapped file fuses nothing (a second copy would cost the RAM the mapping saves).
A fused model's decode rows take the one-call MoE (`kernels.moe_step`), a mapped one's the
step-by-step path: the same bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clover_runtime.loader import load_model
from clover_runtime.resident import read_slices
from synth_models import small_model_path

pytest.importorskip("clover_runtime.kernels")


def _passes(m) -> list[np.ndarray]:
    """Prefill, three decode steps and a preview block: every form of the layers."""
    state = m.new_state(96)
    out = [m.forward([5, 17, 3, 99, 42, 7, 11, 64], state)]
    out += [m.forward([t], state, last_only=True) for t in (8, 250, 31)]
    mask = m.config.diffusion.mask_token_id
    out.append(m.preview([mask] * 8, state).logits)
    return out


@pytest.mark.parametrize("quant", ["Q4_K", "Q4_K_M"])
def test_fused_products_give_the_separate_ones_bits(quant: str) -> None:
    path = small_model_path(quant, arch="qwen35moe")
    with load_model(path, n_threads=1, in_memory=False) as mapped, load_model(path, n_threads=1,
                                                                             in_memory=True) as fused:
        assert mapped.weights.fused_groups == ()
        groups = fused.weights.fused_groups
        cfg = fused.config
        gdn = cfg.gdn_layers[0]
        expected = {f"blk.{gdn}.{s}" for s in ("ffn_gate_exps.weight", "ffn_gate_shexp.weight", "attn_gate.weight")}
        assert expected <= {n for g in groups for n in g}
        L = fused.layers[gdn]
        assert L.moe.gate is None and L.moe.gate_up is not None and L.moe.shared_gate_up is not None
        # a decode row's MoE in one compiled call where gate and up are one matrix, step by step where not
        assert fused.weights.moe_step(L.moe, cfg.n_expert_used) is not None
        assert mapped.weights.moe_step(mapped.layers[gdn].moe, cfg.n_expert_used) is None
        if fused.weights.info(f"blk.{gdn}.attn_qkv.weight").ggml_type == fused.weights.info(
                f"blk.{gdn}.attn_gate.weight").ggml_type:
            assert len(L.inputs) == 1 and L.qkv is None
        else:  # Q4_K_M: qkv is Q5_K, the other three fuse
            assert len(L.inputs) == 2 and L.qkv is L.inputs[0] and L.z is None
        for a, b in zip(_passes(mapped), _passes(fused), strict=True):
            np.testing.assert_array_equal(a, b)


def test_each_tensor_is_read_once() -> None:
    path = small_model_path("Q4_K", arch="qwen35moe")
    with load_model(path, n_threads=1, in_memory=True) as m:
        w = m.weights
        members = [n for g in w.fused_groups for n in g]
        assert len(members) == len(set(members))
        want = sum(w.info(n).n_bytes for n in w.prepared if n != "token_embd.weight" or m.tied_output)
        assert w.resident_bytes == want


def test_read_slices_interleaves_matrix_by_matrix(tmp_path: Path) -> None:
    data = np.arange(40, dtype=np.uint8)
    f = tmp_path / "blob"
    f.write_bytes(data.tobytes())
    got = read_slices([(f, 0, 8), (f, 20, 12)], 2)  # two stacks of 2: 4 and 6 bytes a matrix
    want = np.concatenate([data[0:4], data[20:26], data[4:8], data[26:32]])
    np.testing.assert_array_equal(got, want)
    assert not got.flags.writeable
    with pytest.raises(ValueError, match="equal slices"):
        read_slices([(f, 0, 7)], 2)
