"""The weight matrices one model keeps on a torch device, behind numpy-in, numpy-out products.

`Weights` sends a product here when its tensor was placed on the device (`clover_runtime.offload`):
the activations go over, the product runs on the device from the uploaded GGUF blocks, and the
float32 result comes back to the host maths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import NoGpu
from ..gguf_file import GGUFModelFile
from ..memory_fit import estimate, layer_state_bytes
from ..model_config import ModelConfig
from ..offload import AUTO, OffloadRequest, Placement, fit_layers, place
from . import require_torch, torch_available
from .device import DeviceInfo, gpu_likely, resolve_device

if TYPE_CHECKING:
    from .matrix import DeviceMatrix


class DeviceGroup:
    """The tensors `placement` puts on the device, uploaded from `file` in their quantized form."""

    def __init__(self, file: GGUFModelFile, placement: Placement, info: DeviceInfo) -> None:
        import torch

        from .matrix import DeviceMatrix  # torch at its top: imported only once a device is in use

        self.torch = torch
        self.info = info
        self.placement = placement
        self.matrices: dict[str, DeviceMatrix] = {}
        for name in sorted(placement.device_tensors):
            t = file.tensors[name]
            count = t.shape[0] if len(t.shape) == 3 else 1
            self.matrices[name] = DeviceMatrix(file.raw(name), t.ggml_type, t.shape[-2], t.shape[-1], count,
                                               info.device, info.dtype)

    def __contains__(self, name: str) -> bool:
        return name in self.matrices

    def _to_device(self, x: np.ndarray) -> object:
        return self.torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.info.device)

    def _to_host(self, y: object) -> np.ndarray:
        return y.to(self.torch.float32).cpu().numpy()  # type: ignore[attr-defined]

    def matmul(self, name: str, x: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            return self._to_host(self.matrices[name].matmul(self._to_device(x)))

    def moe(self, name: str, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            ids_t = self.torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.info.device)
            return self._to_host(self.matrices[name].moe(self._to_device(x), ids_t))


def request_device(request: OffloadRequest) -> DeviceInfo | None:
    """The device `request` gets, or None when nothing goes to one. `-ngl auto` without a flag
    asking for a device is silent when there is no GPU or no torch (the CPU engine runs); an
    explicit `-ngl N` or `--device` that cannot be met raises one line. `clover serve` calls it
    before it binds its port, so a bad request fails before anything starts."""
    if not request.wanted:
        return None
    if not request.explicit:
        if not (torch_available() and gpu_likely()):
            return None
        return resolve_device(request.device, request.main_gpu)
    require_torch()
    info = resolve_device(request.device, request.main_gpu)
    if info is None:
        from . import CUDA_TORCH_INSTALL, cpu_only_build

        cpu_torch = cpu_only_build() if gpu_likely() else None
        if cpu_torch is not None:
            raise NoGpu(f"-ngl: torch {cpu_torch} is a CPU-only build, so it cannot use the NVIDIA GPU", cpu_torch,
                        f"install the CUDA build: {CUDA_TORCH_INSTALL}")
        raise NoGpu("-ngl: no GPU found (torch sees no CUDA device)")
    return info


def open_device_group(file: GGUFModelFile, config: ModelConfig, request: OffloadRequest) -> DeviceGroup | None:
    """The device group for `request`, or None when nothing goes to a device. An offloaded layer's
    K/V cache and recurrent state live on the device too, so with `request.n_ctx` known, `-ngl
    auto` leaves room for them."""
    info = request_device(request)
    if info is None:
        return None
    n_layer = config.n_layer
    state = None
    if request.n_ctx > 0:
        state = layer_state_bytes(config, estimate(config, file.tensor_bytes, request.n_ctx))
    if request.n_gpu_layers == AUTO:
        free = info.free_bytes
        if free is None:  # torch on the CPU or Apple's unified memory: what the system has free
            import psutil

            free = psutil.virtual_memory().available
        placement = fit_layers(file.tensors, n_layer, free, request.cpu_moe, request.n_cpu_moe, layer_state=state)
    else:
        placement = place(file.tensors, n_layer, request.n_gpu_layers, request.cpu_moe, request.n_cpu_moe, state)
    return DeviceGroup(file, placement, info) if placement.any else None
