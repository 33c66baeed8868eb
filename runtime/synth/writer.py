"""Write a synthetic Clover GGUF: header through `gguf.GGUFWriter`, tensor data streamed in chunks.

The header (metadata, vocabulary, tensor table) goes through GGUFWriter; the data section is
then written chunk by chunk straight to the file (or left as a sparse hole), so no more than one
chunk of one tensor is ever held in memory. The file appears under its name only when complete.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType

from ..errors import CloverError
from ..text.vocab import VocabArrays
from .spec import SynthSpec
from .weights import TensorPlan, WeightStream, check_overrides, plan_tensors, resolve_n_vocab

QUANTIZATION_VERSION = 2
DESCRIPTION = "synthetic Clover model with seeded random weights (clover make-model)"
FILE_TYPES = {
    "F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16, "BF16": LlamaFileType.MOSTLY_BF16,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0, "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q4_1": LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": LlamaFileType.MOSTLY_Q5_0, "Q5_1": LlamaFileType.MOSTLY_Q5_1, "Q4_K": LlamaFileType.MOSTLY_Q4_K_S,
    "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M, "Q5_K": LlamaFileType.MOSTLY_Q5_K_S,
    "Q6_K": LlamaFileType.MOSTLY_Q6_K,
}


def _add_hparams(w: GGUFWriter, spec: SynthSpec, description: str) -> None:
    a = spec.arch
    w.add_string("general.name", spec.name)
    w.add_string("general.description", description)
    w.add_uint32("general.file_type", int(FILE_TYPES[spec.quant]))
    w.add_uint32("general.quantization_version", QUANTIZATION_VERSION)
    for key, value in spec.sampling or ():
        if key in ("top_k", "penalty_last_n", "mirostat"):
            w.add_uint32(f"general.sampling.{key}", int(value))
        else:
            w.add_float32(f"general.sampling.{key}", float(value))
    w.add_uint32(f"{a}.block_count", spec.n_layer)
    w.add_uint32(f"{a}.full_attention_interval", spec.full_attention_interval)
    w.add_uint32(f"{a}.context_length", spec.context_length)
    w.add_uint32(f"{a}.embedding_length", spec.hidden)
    w.add_uint32(f"{a}.attention.head_count", spec.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    w.add_uint32(f"{a}.attention.value_length", spec.v_head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.rms_eps)
    w.add_uint32(f"{a}.rope.dimension_count", spec.rope_dim)
    w.add_float32(f"{a}.rope.freq_base", spec.rope_base)
    w.add_uint32(f"{a}.ssm.group_count", spec.ssm_k_heads)
    w.add_uint32(f"{a}.ssm.time_step_rank", spec.ssm_v_heads)
    w.add_uint32(f"{a}.ssm.state_size", spec.ssm_state)
    w.add_uint32(f"{a}.ssm.inner_size", spec.ssm_inner)
    w.add_uint32(f"{a}.ssm.conv_kernel", spec.conv_kernel)
    w.add_uint32(f"{a}.expert_count", spec.n_expert)
    w.add_uint32(f"{a}.expert_used_count", spec.n_expert_used)
    w.add_uint32(f"{a}.expert_feed_forward_length", spec.expert_ff)
    w.add_uint32(f"{a}.expert_shared_feed_forward_length", spec.shared_ff)
    if spec.diffusion_keys:
        w.add_uint32(f"{a}.diffusion.block_length", spec.block_length)
        w.add_float32(f"{a}.diffusion.threshold", spec.threshold)
        w.add_bool(f"{a}.diffusion.shift_logits", spec.shift_logits)


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def plan_model(spec: SynthSpec, vocab: VocabArrays | None = None) -> list[TensorPlan]:
    """The tensors `write_model` would write for `spec` (resolving the vocabulary size)."""
    from .vocab_source import token_count

    n_tokens = token_count(spec) if vocab is None else len(vocab.tokens)
    return plan_tensors(spec, resolve_n_vocab(spec, n_tokens))


def is_synthetic(path: str | Path) -> bool:
    """True when `path` is a GGUF this generator wrote (safe to overwrite without asking)."""
    from ..gguf_file import open_gguf

    try:
        with open_gguf(path) as f:
            return f.metadata.get("general.description") == DESCRIPTION
    except CloverError:
        return False


def write_model(
    path: str | Path,
    spec: SynthSpec,
    *,
    sparse: bool = False,
    tensors_override: Mapping[str, np.ndarray] | None = None,
    vocab: VocabArrays | None = None,
    description: str = DESCRIPTION,
) -> Path:
    """Write `spec` as a GGUF at `path` and return the path.

    `sparse=True` writes the header and leaves the tensor data as a hole of the right size (a
    real-shape file then costs no disk on file systems with sparse files; zeros elsewhere).
    `tensors_override` gives exact float32 values (numpy shapes) for named tensors; they are
    stored in the tensor's planned type. `vocab` replaces the spec's vocabulary (a trained model
    brings its own; the Qwen3.6 chat template still follows `spec.chat_template`), and
    `description` the synthetic-model marker, so `is_synthetic` is false for such a file.
    """
    from .vocab_source import add_vocabulary

    path = Path(path)
    plans = plan_model(spec, vocab)
    overrides = check_overrides(plans, tensors_override or {})
    tmp = path.with_name(path.name + ".partial")
    writer = GGUFWriter(tmp, spec.arch)
    try:
        _add_hparams(writer, spec, description)
        add_vocabulary(writer, spec, vocab)
        for p in plans:
            writer.add_tensor_info(p.name, p.shape, np.dtype(np.float32), p.n_bytes,
                                   raw_dtype=GGMLQuantizationType(p.ggml_type))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        fout = writer.fout[0]
        writer.write_padding(fout, fout.tell())
        alignment = writer.data_alignment
        if sparse:
            fout.flush()
            _mark_sparse(fout)
            fout.truncate(fout.tell() + sum(_pad(p.n_bytes, alignment) for p in plans))
        else:
            _write_data(fout, spec, plans, overrides, alignment)
        writer.close()
        os.replace(tmp, path)
    except OSError as exc:
        raise CloverError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        writer.close()
        if tmp.exists():
            tmp.unlink()
    return path


def _mark_sparse(fout: Any) -> None:
    """On Windows a file must be flagged sparse before extending it, or NTFS allocates the hole."""
    if os.name != "nt":
        return  # Linux and macOS file systems leave an extension by truncate unallocated
    import ctypes
    import msvcrt
    from ctypes import wintypes

    fsctl_set_sparse = 0x000900C4
    returned = wintypes.DWORD()
    handle = wintypes.HANDLE(msvcrt.get_osfhandle(fout.fileno()))
    ctypes.windll.kernel32.DeviceIoControl(  # type: ignore[attr-defined]
        handle, fsctl_set_sparse, None, 0, None, 0, ctypes.byref(returned), None
    )  # best effort: without the flag the file is still valid, only not sparse


def _write_data(fout: Any, spec: SynthSpec, plans: list[TensorPlan], overrides: Mapping[str, np.ndarray],
                alignment: int) -> None:
    stream = WeightStream(spec)
    for p in plans:
        written = 0
        for chunk in stream.encoded_chunks(p, overrides.get(p.name)):
            fout.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
            written += chunk.nbytes
        if written != p.n_bytes:
            raise AssertionError(f"{p.name}: wrote {written} bytes, planned {p.n_bytes}")
        fout.write(b"\0" * (_pad(written, alignment) - written))
        stream.forget()
