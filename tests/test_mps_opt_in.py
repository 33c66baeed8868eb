"""Apple's MPS is opt-in until a Mac run of the torch backend passes (issue 41): `-ngl auto` and
`--device auto` never pick it, `--device mps` does, and the backend never asks MPS for float64.
A stand-in `torch` module plays a Mac with MPS and no CUDA (torch itself may not be installed)."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest


class _Device:
    def __init__(self, spec: str, index: int | None = None) -> None:
        kind, _, idx = spec.partition(":")
        self.type = kind
        self.index = int(idx) if idx else index


def _mac_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__spec__ = importlib.machinery.ModuleSpec("torch", None)  # importlib.util.find_spec finds it
    torch.__version__ = "2.9.1"
    torch.device = _Device
    torch.float16, torch.float32, torch.bfloat16 = "float16", "float32", "bfloat16"
    torch.version = types.SimpleNamespace(cuda=None, hip=None)
    torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    torch.backends = types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: True))
    return torch


@pytest.fixture()
def mac(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _mac_torch())
    monkeypatch.setattr(sys, "platform", "darwin")


def test_auto_never_picks_mps(mac: None) -> None:
    from clover_runtime.torch_backend.device import gpu_likely, resolve_device

    assert resolve_device("auto") is None
    assert gpu_likely() is False  # -ngl auto does not even import torch on a Mac


def test_device_mps_opts_in(mac: None) -> None:
    from clover_runtime.torch_backend.device import resolve_device

    for spec in ("mps", "MTL0", "metal"):
        info = resolve_device(spec)
        assert info is not None and info.device.type == "mps" and info.name == "Apple MPS"
        assert info.dtype == "float16"


def test_an_explicit_ngl_on_a_mac_points_at_device_mps(mac: None) -> None:
    from clover_runtime.errors import CloverError
    from clover_runtime.offload import OffloadRequest
    from clover_runtime.torch_backend import group

    from clover_cli.advice import hint_for

    with pytest.raises(CloverError) as err:
        group.request_device(OffloadRequest(n_gpu_layers=99))
    assert err.value.message == "-ngl: no GPU found (torch sees no CUDA device)"
    assert err.value.cpu_torch is None and "--device mps opts in" in (hint_for(err.value) or "")  # the CLI's words
    info = group.request_device(OffloadRequest(n_gpu_layers=99, device="mps"))
    assert info is not None and info.device.type == "mps"


def test_the_gated_delta_rule_chunk_sums_in_float32_on_mps() -> None:
    torch = pytest.importorskip("torch")
    from clover_runtime.torch_backend.layers import cumsum_dtype

    assert cumsum_dtype(torch.device("mps")) == torch.float32
    assert cumsum_dtype(torch.device("cpu")) == torch.float64
