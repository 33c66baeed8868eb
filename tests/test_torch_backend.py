"""The torch backend on torch's CPU device against the numpy engine (the reference path): every
quant type, both layer types, prefill, decode, a diffusion preview and a commit, with every layer
on the device, with part of the layers, and with the routed experts kept on the CPU
(`--cpu-moe`, `--n-cpu-moe`). fp32 on the CPU device, so the two agree to ≤ 1e-4 relative."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from clover_runtime.loader import load_model  # noqa: E402
from clover_runtime.offload import OffloadRequest, is_routed_expert, layer_of  # noqa: E402
from clover_runtime.synth import SynthSpec  # noqa: E402
from clover_runtime.text.vocab import small_vocab  # noqa: E402
from engine_models import assert_logits_close, token_ids  # noqa: E402
from synth_models import model_path  # noqa: E402

QUANTS = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "Q4_K_M"]
ALL = OffloadRequest(n_gpu_layers=99, device="cpu")


def _model(quant: str, **kw: object):  # noqa: ANN202
    return model_path(SynthSpec.small(quant=quant, **kw))


def _compare(path, request: OffloadRequest) -> object:  # noqa: ANN001
    """Prefill, decode, preview and commit on both engines; returns the device model."""
    ref = load_model(path, backend="numpy")
    dev = load_model(path, backend="numpy", offload=request)
    assert dev.weights.device_group is not None
    ids = token_ids(40, ref.config.n_tokens - 64, seed=3)
    s_ref, s_dev = ref.new_state(128), dev.new_state(128)
    assert_logits_close(dev.forward(ids[:24], s_dev), ref.forward(ids[:24], s_ref))  # prefill
    assert_logits_close(dev.forward(ids[24:25], s_dev), ref.forward(ids[24:25], s_ref))  # decode
    mask = small_vocab().special["mask"]
    block = [ids[25], mask, ids[27], mask, mask, ids[30], mask, mask]
    got, want = dev.preview(block, s_dev), ref.preview(block, s_ref)
    assert got.gdn_preview == want.gdn_preview == "clover"
    assert_logits_close(got.logits, want.logits)
    snap_dev, snap_ref = s_dev.copy(), s_ref.copy()
    assert_logits_close(dev.commit(ids[25:33], s_dev), ref.commit(ids[25:33], s_ref))
    assert_logits_close(dev.forward(ids[33:34], s_dev), ref.forward(ids[33:34], s_ref))
    dev.restore(s_dev, snap_dev)  # copy on write of device tensors: the snapshot is intact
    ref.restore(s_ref, snap_ref)
    other = [ids[26], ids[25], ids[28]]
    assert_logits_close(dev.commit(other, s_dev), ref.commit(other, s_ref))
    _state_lives_where_the_layer_runs(dev, s_dev)
    return dev


def _state_lives_where_the_layer_runs(dev, state) -> None:  # noqa: ANN001
    """A layer whose matrices (routed experts aside) are all on the device runs there, and its
    K/V cache or GDN state are torch tensors; the other layers keep numpy arrays."""
    group = dev.weights.device_group
    for i in range(dev.config.n_layer):
        mats = [n for n in dev.file.tensors if layer_of(n) == i and len(dev.file.tensors[n].shape) in (2, 3)
                and not is_routed_expert(n)]
        on_device = all(n in group for n in mats)
        arrays = state.kv(i) if dev.config.layer_is_attention[i] else state.gdn(i)
        assert all(isinstance(a, torch.Tensor) == on_device for a in arrays), i
        assert (dev.device_layers is not None and dev.device_layers.runs(i)) == on_device, i


@pytest.mark.parametrize("quant", QUANTS)
def test_every_layer_on_the_device_matches_the_numpy_engine(quant: str) -> None:
    dev = _compare(_model(quant), ALL)
    group = dev.weights.device_group
    n_layer = dev.config.n_layer
    assert {layer_of(n) for n in group.matrices} == set(range(n_layer)) | {None}
    assert "output.weight" in group and "token_embd.weight" not in group


def test_a_tied_head_goes_to_the_device_and_the_embedding_rows_stay_on_the_host() -> None:
    dev = _compare(_model("Q8_0", tied_output=True), ALL)
    assert "token_embd.weight" in dev.weights.device_group


def test_the_last_layers_only() -> None:
    dev = _compare(_model("Q4_K"), OffloadRequest(n_gpu_layers=2, device="cpu"))
    layers = {layer_of(n) for n in dev.weights.device_group.matrices}
    assert layers == {2, 3}, "-ngl 2 of 4 puts the last two layers on the device, not the head"


@pytest.mark.parametrize("request_", [OffloadRequest(99, cpu_moe=True, device="cpu"),
                                      OffloadRequest(99, n_cpu_moe=2, device="cpu")], ids=["cpu-moe", "n-cpu-moe-2"])
def test_routed_experts_kept_on_the_cpu(request_: OffloadRequest) -> None:
    dev = _compare(_model("Q4_K"), request_)
    group = dev.weights.device_group
    first_on_device = dev.config.n_layer if request_.cpu_moe else request_.n_cpu_moe
    for name in dev.file.tensors:
        layer = layer_of(name)
        if layer is not None and is_routed_expert(name):
            assert (name in group) == (layer >= first_on_device), name
    assert any(n.endswith("ffn_gate_inp.weight") for n in group.matrices), "the router runs on the device"
    assert any(n.endswith("ffn_up_shexp.weight") for n in group.matrices), "so does the shared expert"


def test_prompt_cache_checkpoints_and_saved_states_with_layers_on_the_device(tmp_path) -> None:  # noqa: ANN001
    """Checkpoints (snapshots of device tensors), a restore and a saved state file written from
    device tensors and read back into them all continue exactly like a cold numpy prefill."""
    from clover_runtime import state_file
    from clover_runtime.prompt_cache import PromptCache

    path = _model("Q8_0")
    ref = load_model(path, backend="numpy")
    dev = load_model(path, backend="numpy", offload=OffloadRequest(n_gpu_layers=2, device="cpu"))
    seq = token_ids(100, ref.config.n_tokens - 64, seed=5)
    cache = PromptCache(dev, 256, checkpoint_every=30, boundary_id=None)
    cache.prepare(seq)
    saved = tmp_path / "dev.state"
    state_file.save(cache, saved)
    other = PromptCache(dev, 256, checkpoint_every=30, boundary_id=None)
    state_file.load(other, saved)
    _state_lives_where_the_layer_runs(dev, other.state)
    branch = seq[:70] + token_ids(12, ref.config.n_tokens - 64, seed=6)
    assert other.prepare(branch).cached == 64  # back to a restored checkpoint (multiples of 64), then prefilled
    got = dev.forward(branch[-1:], other.state)
    want = ref.forward(branch)[-1:]
    assert_logits_close(got, want)
