"""GGUF files for the inspect / GGUF-layer / memory-fit tests, written with gguf-py's GGUFWriter.

The tensor list is written out by hand from docs/architecture.md §1-2 (not from runtime's specs),
so the file layer is checked against an independent description of the architecture.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES


@dataclass(frozen=True)
class Shape:
    n_layer: int
    interval: int
    hidden: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int
    k_heads: int
    v_heads: int
    state: int
    kernel: int
    n_expert: int
    n_used: int
    expert_ff: int
    shared_ff: int
    n_vocab: int
    ctx: int


TINY = Shape(n_layer=4, interval=4, hidden=64, n_head=4, n_head_kv=2, head_dim=16, rope_dim=8, k_heads=2,
             v_heads=4, state=16, kernel=4, n_expert=8, n_used=2, expert_ff=32, shared_ff=32, n_vocab=320,
             ctx=4096)
REAL = Shape(n_layer=40, interval=4, hidden=2048, n_head=16, n_head_kv=2, head_dim=256, rope_dim=64,
             k_heads=16, v_heads=32, state=128, kernel=4, n_expert=256, n_used=8, expert_ff=512,
             shared_ff=512, n_vocab=248_320, ctx=131_072)


def tensor_list(s: Shape, *, tied: bool = False, clover: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor, written from the doc's table."""
    h, e, f = s.hidden, s.n_expert, s.expert_ff
    conv_dim = 2 * s.k_heads * s.state + s.v_heads * s.state
    inner = s.v_heads * s.state
    out = [("token_embd.weight", (s.n_vocab, h)), ("output_norm.weight", (h,))]
    if not tied:
        out.append(("output.weight", (s.n_vocab, h)))
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (h,)), (p + "post_attention_norm.weight", (h,)),
                (p + "ffn_gate_inp.weight", (e, h)), (p + "ffn_gate_exps.weight", (e, f, h)),
                (p + "ffn_up_exps.weight", (e, f, h)), (p + "ffn_down_exps.weight", (e, h, f)),
                (p + "ffn_gate_inp_shexp.weight", (h,)), (p + "ffn_gate_shexp.weight", (s.shared_ff, h)),
                (p + "ffn_up_shexp.weight", (s.shared_ff, h)),
                (p + "ffn_down_shexp.weight", (h, s.shared_ff))]
        if (i + 1) % s.interval == 0:
            out += [(p + "attn_q.weight", (2 * s.n_head * s.head_dim, h)),
                    (p + "attn_k.weight", (s.n_head_kv * s.head_dim, h)),
                    (p + "attn_v.weight", (s.n_head_kv * s.head_dim, h)),
                    (p + "attn_q_norm.weight", (s.head_dim,)), (p + "attn_k_norm.weight", (s.head_dim,)),
                    (p + "attn_output.weight", (h, s.n_head * s.head_dim))]
        else:
            out += [(p + "attn_qkv.weight", (conv_dim, h)), (p + "attn_gate.weight", (inner, h)),
                    (p + "ssm_beta.weight", (s.v_heads, h)), (p + "ssm_alpha.weight", (s.v_heads, h)),
                    (p + "ssm_dt.bias", (s.v_heads,)), (p + "ssm_a", (s.v_heads,)),
                    (p + "ssm_conv1d.weight", (conv_dim, s.kernel)), (p + "ssm_norm.weight", (s.state,)),
                    (p + "ssm_out.weight", (h, inner))]
            if clover:
                out += [(p + "ssm_conv1d_right.weight", (conv_dim, 3)), (p + "ssm_bd_scale", (s.v_heads,)),
                        (p + "ssm_bd_hist_bias", (s.v_heads,)), (p + "ssm_bd_hist_c", (s.v_heads,))]
    return out


def q4_k_m_type(name: str, shape: tuple[int, ...]) -> int:
    """A Q4_K_M-style mix: Q6_K for attn_v / ffn_down* / output, F32 for vectors, router and conv."""
    if len(shape) == 1 or "ssm_conv1d" in name or name.endswith(("ffn_gate_inp.weight", "ssm_alpha.weight",
                                                                   "ssm_beta.weight")):
        return int(Q.F32)
    if name == "output.weight" or "attn_v." in name or "ffn_down" in name:
        return int(Q.Q6_K)
    return int(Q.Q4_K)


def nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[Q(ggml_type)]
    n = int(np.prod(shape, dtype=np.int64))
    return n // block * size


def byte_level_vocab(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """n byte-level BPE-looking token strings (GPT-2 byte alphabet) and n-1000 merges."""
    alphabet = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 256) if c != 173]
    alphabet += [chr(256 + i) for i in range(256 - len(alphabet))]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, size=n)
    picks = rng.integers(0, len(alphabet), size=int(lengths.sum()))
    tokens, pos = [], 0
    for i, ln in enumerate(lengths):
        word = "".join(alphabet[j] for j in picks[pos:pos + ln])
        pos += ln
        tokens.append(("Ġ" if i % 3 == 0 else "") + word + str(i))
    merges = [f"{tokens[i][:2]} {tokens[i][2:] or 'x'}" for i in range(max(n - 1000, 0))]
    return tokens, merges


TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def write_model(path: Path, s: Shape = TINY, *, arch: str = "clover-moe", types: Callable | None = None,
                drop: tuple[str, ...] = (), reshape: dict | None = None, retype: dict | None = None,
                tied: bool = False, clover: bool = True, diffusion_keys: bool = True, sparse: bool = False,
                split_tensors: int = 0, tokens: list[str] | None = None, merges: list[str] | None = None,
                template: str | None = TEMPLATE, file_type: int | None = None, seed: int = 0,
                name: str = "test-clover") -> Path:
    """Write a Clover-architecture GGUF; with `sparse` only the header is real and data is a hole."""
    types = types or (lambda name, shape: int(Q.F32))
    reshape, retype = reshape or {}, retype or {}
    w = GGUFWriter(path, arch, split_max_tensors=split_tensors)
    w.add_name(name)
    if file_type is not None:
        w.add_file_type(file_type)
    a = arch
    w.add_uint32(f"{a}.block_count", s.n_layer)
    w.add_uint32(f"{a}.context_length", s.ctx)
    w.add_uint32(f"{a}.embedding_length", s.hidden)
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.rope.dimension_count", s.rope_dim)
    w.add_float32(f"{a}.rope.freq_base", 1e7)
    w.add_uint32(f"{a}.full_attention_interval", s.interval)
    w.add_uint32(f"{a}.ssm.group_count", s.k_heads)
    w.add_uint32(f"{a}.ssm.time_step_rank", s.v_heads)
    w.add_uint32(f"{a}.ssm.state_size", s.state)
    w.add_uint32(f"{a}.ssm.inner_size", s.v_heads * s.state)
    w.add_uint32(f"{a}.ssm.conv_kernel", s.kernel)
    w.add_uint32(f"{a}.expert_count", s.n_expert)
    w.add_uint32(f"{a}.expert_used_count", s.n_used)
    w.add_uint32(f"{a}.expert_feed_forward_length", s.expert_ff)
    w.add_uint32(f"{a}.expert_shared_feed_forward_length", s.shared_ff)
    if diffusion_keys:
        w.add_uint32(f"{a}.diffusion.block_length", 32)
        w.add_float32(f"{a}.diffusion.threshold", 0.9)
        w.add_bool(f"{a}.diffusion.shift_logits", True)
    if tokens is None:
        tokens = [f"<t{i}>" for i in range(s.n_vocab)]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [1] * len(tokens))
    if merges:
        w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    if diffusion_keys:
        w.add_uint32("tokenizer.ggml.mask_token_id", len(tokens) - 1)
    if template is not None:
        w.add_string("tokenizer.chat_template", template)
    rng = np.random.default_rng(seed)
    for name, shape in tensor_list(s, tied=tied, clover=clover):
        if name in drop:
            continue
        shape = tuple(reshape.get(name, shape))
        ty = int(retype.get(name, types(name, shape)))
        if sparse:
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes(ty, shape), raw_dtype=Q(ty)
                              if ty != int(Q.F32) else None)
        elif ty == int(Q.F32):
            w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
        else:
            block, size = GGML_QUANT_SIZES[Q(ty)]
            raw = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=Q(ty))
    with contextlib.redirect_stdout(io.StringIO()):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        if sparse:
            w.write_ti_data_to_file()
            assert w.fout is not None
            align = w.data_alignment
            pad = lambda n: -(-n // align) * align  # noqa: E731
            sizes = [pad(fout.tell()) + sum(pad(ti.nbytes) for ti in ts.values())
                     for fout, ts in zip(w.fout, w.tensors, strict=True)]
        else:
            w.write_tensors_to_file()
    w.close()
    if sparse:
        for shard, size in zip(w.format_shard_names(path), sizes, strict=True):
            _extend_sparse(shard, size)
    return path if not split_tensors else sorted(path.parent.glob(f"{path.stem}-0000*-of-*.gguf"))[0]


def _extend_sparse(path: Path, size: int) -> None:
    """Grow a file to `size` bytes without writing them (a hole; NTFS needs the sparse flag first)."""
    if os.name == "nt":
        subprocess.run(["fsutil", "sparse", "setflag", str(path)], capture_output=True, check=False)
    with open(path, "r+b") as fh:
        fh.truncate(size)


def write_real_shape(path: Path, *, vocab: bool = True) -> Path:
    """The real 40-layer / 256-expert shape as a Q4_K_M-style sparse file with a full-size vocabulary."""
    tokens = merges = None
    if vocab:
        tokens, merges = byte_level_vocab(REAL.n_vocab)
    return write_model(path, REAL, types=q4_k_m_type, sparse=True, tokens=tokens, merges=merges, file_type=15)


def real_shape_path(base: Path) -> Path:
    """One real-shape file per test session (several test modules share it)."""
    path = base / "real-shape-q4_k_m.gguf"
    if not path.exists():
        tmp = base / f"real-shape-{os.getpid()}.tmp.gguf"
        write_real_shape(tmp)
        tmp.replace(path)
    return path


def run_clover(args: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    """Run the real `clover` entry point (main() with its error wrapper) in-process."""
    from clover_cli.app import main

    monkeypatch.setattr(sys, "argv", ["clover", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def edit_bytes(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def expected_verdict(estimate: dict, available: int, margin: int = 1 << 30) -> str:
    """The fit verdict by the documented rule (1 GiB kept free): resident when everything fits,
    paging when all but the mapped weights fit, else no fit."""
    if estimate["total"] + margin <= available:
        return "fits"
    without_weights = estimate["total"] - estimate["weights"]
    return "fits with paging" if without_weights + margin <= available else "does not fit"
