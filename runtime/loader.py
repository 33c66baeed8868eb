"""Opening a model for inference: the one place that joins the file, the engine and the GPU backend.

The engine never imports the torch backend (torch is optional); this module builds the `Model`
and, when `-ngl` puts layers on a device, attaches the backend's `DeviceLayers` bound to the
model's own layer records.
"""

from __future__ import annotations

from pathlib import Path

from .engine.layers import fusable_groups
from .engine.model import Model
from .engine.weights import Weights, host_matrices
from .gguf_file import open_gguf
from .model_config import describe
from .offload import OffloadRequest
from .resident import keep_in_memory


def load_model(path_or_ref: str | Path, *, n_threads: int | None = None, backend: str = "auto",
               cache_bytes: int | None = None, exact_kernels: bool = False,
               offload: OffloadRequest | None = None, in_memory: bool | None = None) -> Model:
    """Open a GGUF model (a path, or a reference already in the local cache) for inference.

    `backend`: "numba" (fused quantized kernels), "numpy" (reference path, dequantizes), or
    "auto" (numba when available). `cache_bytes` bounds the dequantized weights the numpy path
    keeps (default 512 MiB; 0 with numba). `exact_kernels` keeps numba's float kernels for
    quantized weights instead of the integer ones (8-bit activations, llama.cpp's method): slower,
    equal to the numpy path to float32 round-off. `offload` puts weight groups on a GPU through
    the torch backend (`-ngl`, `--cpu-moe`; None: the CPU only). `in_memory`: read the host's
    weight matrices into memory on huge pages (True, `--no-mmap`), use them from the mapped file
    (False, `--mmap`), or decide by `resident.keep_in_memory` (None: `offload.in_memory` when given).
    Raises ModelFileError for unusable files, and HubError for a Hub reference that is not in the
    cache: this never downloads or touches the network.
    """
    from .hub import resolve_model

    file = open_gguf(resolve_model(path_or_ref, download=False))
    try:
        config = describe(file)
        group = None
        if offload is not None and offload.wanted:
            from .torch_backend.group import open_device_group

            group = open_device_group(file, config, offload)
        if in_memory is None and offload is not None:
            in_memory = offload.in_memory
        if in_memory is None:
            in_memory = keep_in_memory(sum(file.tensors[n].n_bytes for n in host_matrices(file, group)))
        weights = Weights(file, backend, cache_bytes, n_threads, exact_kernels, group, in_memory=in_memory,
                          fuse=fusable_groups(config))
        model = Model(file, config, weights)
        if group is not None:
            from .torch_backend.layers import DeviceLayers  # torch: only once a device is in use

            layers = DeviceLayers(weights, config, group, model.layers)
            model.device_layers = layers if layers.layers or layers.head_here else None
    except BaseException:
        file.close()
        raise
    return model
