"""Seeded random weights with the structure the converter leaves in a real Clover GGUF.

Norms are stored as 1 + w (values near 1), `ssm_a` = -exp(A_log) is negative, `ssm_dt.bias` is the
inverse softplus of a small time step, convolutions are small uniform taps, and every matrix is
scaled by 1/sqrt(fan-in) (output projections also by 1/sqrt(2 * layers)) so activations stay
O(1) through any depth.

Values are produced in chunks (one expert, or a group of rows) from an RNG stream keyed by
(seed, logical tensor name, chunk), so the same spec gives the same bytes whatever the write
order, and a fused tensor (`attn_qkv`, `ffn_gate_up_exps`) holds exactly the values of the split
tensors it replaces. Very large tensors (the real-shape embedding and experts) are assembled from
a seeded pool of quantized 256-weight units: quantization works block by block, so gathering
encoded units is byte-identical to encoding the gathered floats, and a 4-layer real-shape file
is written in seconds instead of minutes.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..quants import block_size, quantize, row_bytes, type_name
from ..quants.formats import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from .spec import REAL_VOCAB_ROWS, SynthSpec

POOL_UNIT = 256  # weights per pooled unit: a multiple of every block size
POOL_UNITS = 1 << 12  # distinct units per pooled tensor (1M weights)
POOL_MIN_ELEMENTS = 1 << 22  # tensors larger than this (4M weights) are pooled
CHUNK_ELEMENTS = 1 << 20  # rows per chunk of a 2-D tensor: about this many weights

_WHOLE_FILE_TYPES = {
    "F32": F32, "F16": F16, "BF16": BF16, "Q8_0": Q8_0, "Q4_0": Q4_0, "Q4_1": Q4_1, "Q5_0": Q5_0,
    "Q5_1": Q5_1, "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K,
}
# llama.cpp's fallback when a row is not a multiple of 256 (llama-quant.cpp); then F16 if needed.
_K_FALLBACK = {Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0}
_ALWAYS_F32_SUFFIXES = (
    "ssm_conv1d.weight", "ssm_conv1d_right.weight", "ffn_gate_inp.weight", "ssm_a", "ssm_dt.bias",
)
_OUTPUT_PROJECTIONS = (
    "attn_output.weight", "ssm_out.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight",
)


@dataclass(frozen=True)
class Source:
    """One logical (split) tensor: what its values look like and which RNG stream makes them."""

    name: str
    shape: tuple[int, ...]
    kind: str  # normal | norm | ssm_a | dt_bias | uniform | bd_scale | bd_bias | bd_c
    scale: float


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the file: name, numpy shape, storage type and where its values come from.

    `sources` has one entry, or the split parts of a fused tensor, concatenated along axis -2
    (the rows: q, k, v for `attn_qkv`; gate, up for `ffn_gate_up_exps`).
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    wanted_type: int  # what the quant mix asked for; differs when the row length forced a fallback
    sources: tuple[Source, ...]

    @property
    def fell_back(self) -> bool:
        return self.ggml_type != self.wanted_type

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_bytes(self) -> int:
        return math.prod(self.shape[:-1]) * row_bytes(self.ggml_type, self.shape[-1])


def _suffix(name: str) -> str:
    """'blk.3.attn_v.weight' -> 'attn_v.weight'; global names unchanged."""
    if name.startswith("blk."):
        return name.split(".", 2)[2]
    return name


def wanted_type(quant: str, name: str, shape: tuple[int, ...]) -> int:
    """The ggml type the file type asks for this tensor (llama.cpp's choices, simplified)."""
    suffix = _suffix(name)
    if len(shape) == 1 or suffix.endswith("_norm.weight") or suffix in _ALWAYS_F32_SUFFIXES \
            or suffix.startswith("ssm_bd_"):
        return F32
    if quant != "Q4_K_M":
        return _WHOLE_FILE_TYPES[quant]
    if suffix in ("output.weight", "attn_v.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight"):
        return Q6_K
    if suffix == "attn_qkv.weight":
        return Q5_K
    return Q4_K


def storage_type(wanted: int, n_cols: int) -> int:
    """The type actually stored: K-quants fall back like llama.cpp when rows are not 256-multiples."""
    t = wanted
    if n_cols % block_size(t):
        t = _K_FALLBACK.get(t, t)
    if n_cols % block_size(t):
        t = F16
    return t


def resolve_n_vocab(spec: SynthSpec, n_tokens: int) -> int:
    """Embedding rows: the spec's value, else the real model's padding (qwen36 vocabulary) or the token
    count rounded up to a multiple of 64 (so the padded rows past the tokens are exercised)."""
    if spec.n_vocab is None and spec.vocab == "qwen36":
        return max(REAL_VOCAB_ROWS, n_tokens)
    if spec.n_vocab is not None:
        if spec.n_vocab < n_tokens:
            from ..errors import CloverError

            raise CloverError(f"n_vocab {spec.n_vocab} is smaller than the vocabulary ({n_tokens} tokens)")
        return spec.n_vocab
    return -(-n_tokens // 64) * 64


def _source(spec: SynthSpec, name: str, shape: tuple[int, ...]) -> Source:
    suffix = _suffix(name)
    fan_in = shape[-1]
    if suffix.endswith("norm.weight"):
        return Source(name, shape, "norm", 0.05)
    if suffix == "ssm_a":
        return Source(name, shape, "ssm_a", 1.0)
    if suffix == "ssm_dt.bias":
        return Source(name, shape, "dt_bias", 1.0)
    if suffix == "ssm_conv1d.weight":
        return Source(name, shape, "uniform", 1.0 / math.sqrt(spec.conv_kernel))
    if suffix == "ssm_conv1d_right.weight":
        return Source(name, shape, "uniform", 0.5 / math.sqrt(spec.conv_kernel))
    if suffix == "ssm_bd_scale":
        return Source(name, shape, "bd_scale", 0.1)
    if suffix == "ssm_bd_hist_bias":
        return Source(name, shape, "bd_bias", 0.5)
    if suffix == "ssm_bd_hist_c":
        return Source(name, shape, "bd_c", 1.0)
    if name in ("token_embd.weight", "output.weight"):
        return Source(name, shape, "normal", 3.0 / math.sqrt(spec.hidden))
    if suffix == "ffn_gate_inp_shexp.weight":
        return Source(name, shape, "normal", 1.0 / math.sqrt(spec.hidden))
    scale = 1.0 / math.sqrt(fan_in)
    if suffix in _OUTPUT_PROJECTIONS:
        scale /= math.sqrt(2 * spec.n_layer)
    return Source(name, shape, "normal", scale)


def _logical_tensors(spec: SynthSpec, n_vocab: int) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
    """(file name, numpy shape, split source names) for every tensor, in file order."""
    h = spec.hidden
    out: list[tuple[str, tuple[int, ...], tuple[str, ...]]] = []

    def add(name: str, shape: tuple[int, ...], parts: tuple[str, ...] = ()) -> None:
        out.append((name, shape, parts or (name,)))

    add("token_embd.weight", (n_vocab, h))
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (h,))
        if spec.is_attention(i):
            q = spec.n_head * spec.head_dim * 2
            k = spec.n_head_kv * spec.head_dim
            v = spec.n_head_kv * spec.v_head_dim
            names = (p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight")
            if spec.fused_qkv:
                add(p + "attn_qkv.weight", (q + k + v, h), names)
            else:
                for n, rows in zip(names, (q, k, v), strict=True):
                    add(n, (rows, h))
            add(p + "attn_q_norm.weight", (spec.head_dim,))
            add(p + "attn_k_norm.weight", (spec.head_dim,))
            add(p + "attn_output.weight", (h, spec.n_head * spec.v_head_dim))
        else:
            nv = spec.ssm_v_heads
            add(p + "attn_qkv.weight", (spec.conv_dim, h))
            add(p + "attn_gate.weight", (spec.ssm_inner, h))
            add(p + "ssm_beta.weight", (nv, h))
            add(p + "ssm_alpha.weight", (nv, h))
            add(p + "ssm_dt.bias", (nv,))
            add(p + "ssm_a", (nv,))
            add(p + "ssm_conv1d.weight", (spec.conv_dim, spec.conv_kernel))
            add(p + "ssm_norm.weight", (spec.gdn_v_dim,))
            add(p + "ssm_out.weight", (h, spec.ssm_inner))
            if spec.clover_tensors:
                add(p + "ssm_conv1d_right.weight", (spec.conv_dim, 3))
                add(p + "ssm_bd_scale", (nv,))
                add(p + "ssm_bd_hist_bias", (nv,))
                add(p + "ssm_bd_hist_c", (nv,))
        add(p + "post_attention_norm.weight", (h,))
        e, f = spec.n_expert, spec.expert_ff
        add(p + "ffn_gate_inp.weight", (e, h))
        if spec.fused_gate_up:
            split = (p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight")
            add(p + "ffn_gate_up_exps.weight", (e, 2 * f, h), split)
        else:
            add(p + "ffn_gate_exps.weight", (e, f, h))
            add(p + "ffn_up_exps.weight", (e, f, h))
        add(p + "ffn_down_exps.weight", (e, h, f))
        if spec.shared_ff:
            s = spec.shared_ff
            add(p + "ffn_gate_inp_shexp.weight", (h,))
            add(p + "ffn_gate_shexp.weight", (s, h))
            add(p + "ffn_up_shexp.weight", (s, h))
            add(p + "ffn_down_shexp.weight", (h, s))
    add("output_norm.weight", (h,))
    if not spec.tied_output:
        add("output.weight", (n_vocab, h))
    return out


def plan_tensors(spec: SynthSpec, n_vocab: int) -> list[TensorPlan]:
    """Every tensor of the file, in write order, with its storage type and value sources."""
    plans = []
    for name, shape, parts in _logical_tensors(spec, n_vocab):
        if len(parts) == 1:
            sources: tuple[Source, ...] = (_source(spec, name, shape),)
        else:
            rows = _split_rows(spec, name, shape)
            sources = tuple(
                _source(spec, n, (*shape[:-2], r, shape[-1])) for n, r in zip(parts, rows, strict=True)
            )
        want = wanted_type(spec.quant, name, shape)
        plans.append(TensorPlan(name, shape, storage_type(want, shape[-1]), want, sources))
    return plans


def _split_rows(spec: SynthSpec, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if name.endswith("attn_qkv.weight"):
        return (spec.n_head * spec.head_dim * 2, spec.n_head_kv * spec.head_dim,
                spec.n_head_kv * spec.v_head_dim)
    return (spec.expert_ff, spec.expert_ff)


def _stream_seed(seed: int, name: str, *extra: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8")), *extra])


def _chunk_rows(shape: tuple[int, ...]) -> int:
    """Rows per chunk of a 2-D tensor (a function of the shape only, so streams are stable)."""
    return max(1, CHUNK_ELEMENTS // shape[-1])


def _draw(rng: np.random.Generator, kind: str, scale: float, shape: tuple[int, ...]) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    if kind == "norm":
        return 1.0 + rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    if kind == "uniform":
        return rng.uniform(-scale, scale, shape).astype(np.float32)
    if kind == "ssm_a":  # A_log = log(U(1, 16)), as Mamba-2 initialises it; stored as -exp(A_log)
        return (-rng.uniform(1.0, 16.0, shape)).astype(np.float32)
    if kind == "dt_bias":  # inverse softplus of a time step log-uniform in [1e-3, 1e-1]
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), shape))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    if kind == "bd_scale":
        return np.exp(rng.standard_normal(shape) * scale).astype(np.float32)
    if kind == "bd_bias":
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    if kind == "bd_c":
        return rng.uniform(0.25, 0.75, shape).astype(np.float32)
    raise ValueError(f"unknown weight kind {kind!r}")


def _pooled(src: Source, pool_min: int) -> bool:
    return math.prod(src.shape) > pool_min and src.shape[-1] % POOL_UNIT == 0 and src.kind == "normal"


@dataclass
class WeightStream:
    """Generates the values (or encoded bytes) of planned tensors chunk by chunk.

    `pool_min` is the element count above which a tensor is pooled (tests lower it to exercise
    the pooled path on small tensors). Pools are cached per (source, type) until `forget`.
    """

    spec: SynthSpec
    pool_min: int = POOL_MIN_ELEMENTS
    _pools: dict[tuple[str, int], tuple[np.ndarray, np.ndarray | None]] = field(default_factory=dict)

    def _pool(self, src: Source, ggml_type: int | None) -> tuple[np.ndarray, np.ndarray | None]:
        key = (src.name, -1 if ggml_type is None else ggml_type)
        if key not in self._pools:
            base = (src.name, -1)
            if base not in self._pools:
                rng = _stream_seed(self.spec.seed, src.name, 1 << 30)
                self._pools[base] = (_draw(rng, src.kind, src.scale, (POOL_UNITS, POOL_UNIT)), None)
            floats = self._pools[base][0]
            if ggml_type is not None:
                self._pools[key] = (floats, quantize(floats, ggml_type))
        return self._pools[key]

    def _chunks(self, src: Source) -> list[tuple[int, tuple[int, ...]]]:
        """(chunk index, chunk shape) of a source: one expert, a group of rows, or everything."""
        shape = src.shape
        if len(shape) == 3:
            return [(e, shape[1:]) for e in range(shape[0])]
        if len(shape) == 2:
            step = _chunk_rows(shape)
            return [(c, (min(step, shape[0] - c * step), shape[1])) for c in range(-(-shape[0] // step))]
        return [(0, shape)]

    def _unit_index(self, src: Source, chunk: int, shape: tuple[int, ...]) -> np.ndarray:
        rng = _stream_seed(self.spec.seed, src.name, chunk, 1)
        return rng.integers(0, POOL_UNITS, math.prod(shape) // POOL_UNIT)

    def source_chunk(self, src: Source, chunk: int, shape: tuple[int, ...]) -> np.ndarray:
        """Float32 values of one chunk of a source."""
        if _pooled(src, self.pool_min):
            floats, _ = self._pool(src, None)
            return floats[self._unit_index(src, chunk, shape)].reshape(shape)
        rng = _stream_seed(self.spec.seed, src.name, chunk)
        return _draw(rng, src.kind, src.scale, shape)

    def _encoded_chunk(self, src: Source, chunk: int, shape: tuple[int, ...], ggml_type: int) -> np.ndarray:
        if _pooled(src, self.pool_min):
            _, encoded = self._pool(src, ggml_type)
            assert encoded is not None
            return encoded[self._unit_index(src, chunk, shape)]
        return quantize(self.source_chunk(src, chunk, shape), ggml_type)

    def _order(self, plan: TensorPlan) -> Iterator[tuple[Source, int, tuple[int, ...]]]:
        """Chunks in file order: per expert the parts' rows in turn, else each part in turn."""
        if len(plan.shape) == 3:
            per_source = [self._chunks(s) for s in plan.sources]
            for e in range(plan.shape[0]):
                for src, chunks in zip(plan.sources, per_source, strict=True):
                    yield src, *chunks[e]
        else:
            for src in plan.sources:
                for c, shape in self._chunks(src):
                    yield src, c, shape

    def float_chunks(self, plan: TensorPlan) -> Iterator[np.ndarray]:
        """The intended float32 values of a tensor, chunk by chunk in file order."""
        for src, c, shape in self._order(plan):
            yield self.source_chunk(src, c, shape)

    def encoded_chunks(self, plan: TensorPlan, override: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """The stored bytes of a tensor, chunk by chunk in file order."""
        if override is not None:
            yield from _override_chunks(override, plan.ggml_type)
            return
        for src, c, shape in self._order(plan):
            yield self._encoded_chunk(src, c, shape, plan.ggml_type)

    def forget(self) -> None:
        """Drop cached pools (the writer calls this after each tensor, so memory stays flat)."""
        self._pools.clear()

    def intended(self, plan: TensorPlan) -> np.ndarray:
        """The whole float32 tensor the generator means (before quantization)."""
        return np.concatenate([c.reshape(-1) for c in self.float_chunks(plan)]).reshape(plan.shape)


def _override_chunks(x: np.ndarray, ggml_type: int) -> Iterator[np.ndarray]:
    rows = x.reshape(-1, x.shape[-1])
    step = _chunk_rows(x.shape) if x.ndim > 1 else 1
    for start in range(0, rows.shape[0], step):
        yield quantize(rows[start:start + step], ggml_type)


def check_overrides(plans: list[TensorPlan], overrides: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate `tensors_override` against the plan: known names, right shapes, finite values."""
    by_name = {p.name: p for p in plans}
    checked: dict[str, np.ndarray] = {}
    for name, value in overrides.items():
        plan = by_name.get(name)
        if plan is None:
            raise ValueError(f"tensors_override: this model has no tensor '{name}'")
        arr = np.ascontiguousarray(value, dtype=np.float32)
        if arr.shape != plan.shape:
            raise ValueError(
                f"tensors_override: '{name}' has shape {arr.shape}, the model needs {plan.shape}"
            )
        if not np.isfinite(arr).all():
            raise ValueError(f"tensors_override: '{name}' holds non-finite values")
        checked[name] = arr
    return checked


def describe_plan(plans: list[TensorPlan]) -> dict[str, int]:
    """Tensor count per stored type name (for summaries)."""
    counts: dict[str, int] = {}
    for p in plans:
        counts[type_name(p.ggml_type)] = counts.get(type_name(p.ggml_type), 0) + 1
    return counts
