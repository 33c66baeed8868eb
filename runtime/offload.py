"""Which weight tensors go to the GPU: llama.cpp's `-ngl`, `--cpu-moe` and `--n-cpu-moe`.

Pure bookkeeping over tensor names and sizes (no torch), so placement and fit are testable with a
simulated device. As in llama.cpp: `-ngl N` puts the last N layers on the device, and a value
above the layer count also puts the LM head there (`-ngl 99`: everything); the token embedding
is read by rows and stays in system memory. `--cpu-moe` keeps every layer's routed experts in
system memory (run by the CPU kernels) and `--n-cpu-moe N` those of the first N layers, while
attention, Gated DeltaNet, the router and the shared expert of an offloaded layer run on the
device. Only weight matrices move; norms and other small tensors stay with the host maths.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .sizes import size_text

_LAYER = re.compile(r"^blk\.(\d+)\.")
AUTO = -1  # n_gpu_layers: as many as fit
DEVICE_RESERVE = 512 << 20  # bytes of device memory left free for decode tiles and the runtime


class SizedTensor(Protocol):
    """What placement reads of a tensor: a header's TensorInfo or the writer's TensorPlan."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def n_bytes(self) -> int: ...


@dataclass(frozen=True)
class Placement:
    """The tensors on the device and the bytes that stay in system memory and go to the device."""

    n_gpu_layers: int
    device_tensors: frozenset[str]
    device_bytes: int
    host_bytes: int
    n_cpu_moe: int = 0  # layers (from the first) whose routed experts stay on the CPU
    state_bytes: int = 0  # the device layers' K/V caches and recurrent states (they live there too)

    @property
    def any(self) -> bool:
        return bool(self.device_tensors)

    @property
    def device_total(self) -> int:
        """Device memory the placement needs: weights plus the device layers' sequence state."""
        return self.device_bytes + self.state_bytes


def layer_of(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def is_routed_expert(name: str) -> bool:
    return name.endswith("_exps.weight")


def head_tensor(tensors: Mapping[str, SizedTensor]) -> str:
    """The LM head's matrix: `output.weight`, or the token embedding when the file ties them."""
    return "output.weight" if "output.weight" in tensors else "token_embd.weight"


def on_device(name: str, n_layer: int, n_gpu_layers: int, cpu_moe: bool, n_cpu_moe: int, head: str) -> bool:
    """Whether weight matrix `name` runs on the device under these settings."""
    layer = layer_of(name)
    if layer is None:
        return name == head and n_gpu_layers > n_layer
    if layer < n_layer - n_gpu_layers:
        return False
    return not (is_routed_expert(name) and (cpu_moe or layer < n_cpu_moe))


def place(tensors: Mapping[str, SizedTensor], n_layer: int, n_gpu_layers: int, cpu_moe: bool = False,
          n_cpu_moe: int = 0, layer_state: Mapping[int, int] | None = None) -> Placement:
    """The placement for a fixed `-ngl` (0: nothing on the device). `layer_state` gives each layer's
    sequence-state bytes (K/V cache or GDN state, `memory_fit.layer_state_bytes`), which go to the
    device with the layer."""
    head = head_tensor(tensors)
    chosen = frozenset(name for name, t in tensors.items() if len(t.shape) in (2, 3)
                       and on_device(name, n_layer, max(0, n_gpu_layers), cpu_moe, n_cpu_moe, head))
    device = sum(tensors[n].n_bytes for n in chosen)
    # a tied head is also read by rows for the embedding, so its host copy stays mapped
    host = sum(t.n_bytes for n, t in tensors.items() if n not in chosen or n == "token_embd.weight")
    kept = n_layer if cpu_moe else min(max(0, n_cpu_moe), n_layer)
    first = n_layer - max(0, n_gpu_layers)
    state = sum(b for i, b in (layer_state or {}).items() if i >= first)
    return Placement(max(0, min(n_gpu_layers, n_layer + 1)), chosen, device, host, kept, state)


def fit_layers(tensors: Mapping[str, SizedTensor], n_layer: int, device_free: int, cpu_moe: bool = False,
               n_cpu_moe: int = 0, reserve: int = DEVICE_RESERVE,
               layer_state: Mapping[int, int] | None = None) -> Placement:
    """`-ngl auto`: the most layers (then the head) whose device bytes fit `device_free - reserve`."""
    budget = device_free - reserve
    best = place(tensors, n_layer, 0)
    for n in range(1, n_layer + 2):
        p = place(tensors, n_layer, n, cpu_moe, n_cpu_moe, layer_state)
        if p.device_total > budget:
            break
        best = p
    return best


def fit_experts(tensors: Mapping[str, SizedTensor], n_layer: int, device_free: int,
                reserve: int = DEVICE_RESERVE, layer_state: Mapping[int, int] | None = None) -> Placement | None:
    """Every layer on the device with the fewest layers' routed experts kept on the CPU
    (`-ngl 99 --n-cpu-moe N`, the smallest N) that fits; None when not even `--cpu-moe` fits."""
    budget = device_free - reserve
    for n in range(n_layer + 1):
        p = place(tensors, n_layer, n_layer + 1, n_cpu_moe=n, layer_state=layer_state)
        if p.device_total <= budget:
            return p
    return None


@dataclass(frozen=True)
class OffloadRequest:
    """What the user asked for: `-ngl` (AUTO: as many as fit when a GPU is present), the expert
    flags, the device (`--device`, `--main-gpu`) and where the host's weights live (`--mmap`)."""

    n_gpu_layers: int = AUTO
    cpu_moe: bool = False
    n_cpu_moe: int = 0
    device: str = "auto"
    main_gpu: int = 0
    n_ctx: int = 0  # the context the sequences will use (0: unknown); `-ngl auto` leaves room for its cache
    in_memory: bool | None = None  # the host's weights read into memory (--no-mmap), mapped (--mmap), or decided

    @property
    def wanted(self) -> bool:
        """False when nothing may go to a device (`-ngl 0`)."""
        return self.n_gpu_layers != 0

    @property
    def explicit(self) -> bool:
        """True when the user asked for a device by flag (a failure must then be reported)."""
        return self.n_gpu_layers > 0 or self.device != "auto"


def planned_placement(tensors: Mapping[str, SizedTensor], n_layer: int, request: OffloadRequest,
                      device_free: int | None) -> Placement | None:
    """The placement `request` will get, for the memory check before loading (no torch needed):
    a fixed `-ngl` as asked, `-ngl auto` by `device_free` (None: no GPU seen, so nothing moves)."""
    if not request.wanted:
        return None
    if request.n_gpu_layers == AUTO:
        if device_free is None:
            return None
        return fit_layers(tensors, n_layer, device_free, request.cpu_moe, request.n_cpu_moe)
    return place(tensors, n_layer, request.n_gpu_layers, request.cpu_moe, request.n_cpu_moe)


def weights_in_ram(tensors: Mapping[str, SizedTensor], n_layer: int, weight_bytes: int, request: OffloadRequest,
                   gpus: Sequence[Any]) -> int:
    """The weight bytes that stay in system memory under `request`, for the RAM check before
    loading: all of them without a GPU request, without torch, or on torch's CPU device (its
    "device" is RAM); else what the placement leaves behind, `-ngl auto` sized by the free memory
    of `gpus` (`memory_fit.GpuMemory`, from nvidia-smi). The caches go with their layers, but the
    RAM check keeps counting them: the safe side."""
    from .torch_backend import torch_available  # finds the module without importing torch

    if not request.wanted or request.device.strip().lower() == "cpu" or not torch_available():
        return weight_bytes
    free = gpus[request.main_gpu].free if 0 <= request.main_gpu < len(gpus) else None
    placement = planned_placement(tensors, n_layer, request, free)
    return weight_bytes if placement is None else placement.host_bytes


def parse_gpu_layers(value: str | int | None) -> int:
    """`-ngl` as llama.cpp takes it: a count, "auto", or "all" (every layer and the head)."""
    if value is None:
        return AUTO
    text = str(value).strip().lower()
    if text == "auto":
        return AUTO
    if text in ("all", "max"):
        return 1 << 30
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"-ngl takes a layer count, auto or all, not '{value}'") from None
    if n < 0:
        return AUTO
    return n


def describe(placement: Placement | None, device_name: str, n_layer: int) -> str:
    """One line for banners and bench: where the weights run."""
    if placement is None or not placement.any:
        return "CPU only"
    layers = min(placement.n_gpu_layers, n_layer)
    head = " and the head" if placement.n_gpu_layers > n_layer else ""
    experts = ""
    if placement.n_cpu_moe:
        kept = "all layers" if placement.n_cpu_moe >= n_layer else f"the first {placement.n_cpu_moe} layers"
        experts = f", routed experts of {kept} on the CPU"
    return (f"{device_name}: {layers}/{n_layer} layers{head}{experts} "
            f"({size_text(placement.device_bytes)} on the device)")
