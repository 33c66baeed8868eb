"""Compiling the kernels before the first reply, so that the first run can say so.

numba compiles each kernel the first time it is called and caches the machine code; the first
run of a new install (or of a new quant type) pauses 10–60 s inside the first forward with no
sign of life. `needs_compile` tells the front ends whether that is about to happen (a marker
written after the kernels for a set of tensor types were compiled, in the kernel cache of this
version), and `compile_kernels` runs the calls a reply makes (a batched prefill, a one-token
decode step, a diffusion preview) on a scratch sequence, so the pause happens under a message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PREFILL_ROWS = 40  # past the per-token GDN loop's limit, so the chunked kernel compiles too


def _marker(model: Any) -> Path | None:
    """The marker file for this model's tensor types and kernel choice; None off the numba backend."""
    weights = model.weights
    if weights.backend != "numba":
        return None
    folder = os.environ.get("NUMBA_CACHE_DIR")
    if not folder:
        return None
    types = sorted({int(t.ggml_type) for t in model.file.tensors.values()})
    kind = "exact" if weights.exact_kernels else "int"
    return Path(folder) / f"compiled-{kind}-{'-'.join(map(str, types))}"


def needs_compile(model: Any) -> bool:
    """True when the first reply would compile kernels (no marker for this model's types yet)."""
    marker = _marker(model)
    return marker is not None and not marker.exists()


def compile_kernels(model: Any) -> None:
    """Run one of each call a reply makes on a scratch sequence, then mark the types compiled."""
    cfg = model.config
    rows = min(PREFILL_ROWS, cfg.context_length - 1)
    state = model.new_state(rows + 1 + max(1, cfg.diffusion.block_length))
    model.forward(list(range(rows)), state, last_only=True)
    model.forward([0], state, last_only=True)
    if cfg.diffusion.mask_token_id is not None:
        block = [cfg.diffusion.mask_token_id] * cfg.diffusion.block_length
        model.preview(block, state, logit_rows=[0])
    marker = _marker(model)
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass  # a read-only cache only means the message shows again next time
