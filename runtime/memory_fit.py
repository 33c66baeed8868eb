"""Will a model fit this machine? Byte arithmetic from the header alone, compared with free memory.

Nothing here reads tensor data, so it works on a remote header or a sparse file. The estimate is
per component (weights, KV cache of the full-attention layers, Gated DeltaNet state, compute
buffers) so commands can show a llama.cpp-style breakdown and say what to change when it does not
fit. `-c` (n_ctx) is per sequence; with `-np` parallel sequences every per-sequence part repeats.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from .model_config import ModelConfig
from .offload import DEVICE_RESERVE, fit_experts, fit_layers
from .sizes import GiB, MiB, size_text

DEFAULT_MARGIN = GiB
DEFAULT_UBATCH = 512
DEFAULT_CTX = 16384  # -c when not given: the advertised 131,072 would cost every user its whole KV cache
MIN_AUTO_CTX = 4096  # -c 0 never picks less than this (llama.cpp's --fit-ctx default)
CACHE_TYPES = ("f32", "f16", "q8_0")
# clover's engine keeps K and V in float32 (agreement with the reference and transformers needs
# it), so fit decisions use f32; f16 and q8_0 estimate what llama.cpp would allocate, for comparison.
ENGINE_CACHE_TYPE = "f32"
TABLE_CONTEXTS = (4096, 16384, 32768, 65536, 131072)
CTX_STEP = 256
DEFAULT_CTX_CHECKPOINTS = 8  # prompt-cache checkpoints per sequence (llama-server's --ctx-checkpoints)

FITS = "fits"
PAGING = "fits with paging"
NO_FIT = "does not fit"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one configuration needs; `total` = weights + kv_cache + gdn_state + checkpoints + compute.

    `checkpoints`: the prompt cache's snapshots of the GDN state (one GDN state each, per sequence).
    """

    n_ctx: int
    n_parallel: int
    cache_type: str
    ubatch: int
    weights: int
    kv_cache: int
    gdn_state: int
    compute: int
    kv_per_token: int
    checkpoints: int = 0
    ctx_checkpoints: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.without_weights

    @property
    def without_weights(self) -> int:
        """What must be resident even when mmap'd weights page from disk."""
        return self.kv_cache + self.gdn_state + self.checkpoints + self.compute

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


class GpuMemory(NamedTuple):
    name: str
    total: int
    free: int


@dataclass(frozen=True)
class SystemMemory:
    ram_total: int
    ram_available: int
    gpus: list[GpuMemory] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ram_total": self.ram_total, "ram_available": self.ram_available,
                "gpus": [g._asdict() for g in self.gpus]}


@dataclass(frozen=True)
class GpuFit:
    """What fits one GPU, as placement facts (the CLI words them in llama.cpp's flags):
    `n_gpu_layers` layers on it (`all_layers`: every layer and the head), the routed experts of the
    first `n_cpu_moe` layers kept in RAM, and the bytes that puts on the device and leaves in RAM.
    Without a tensor list only the weight total is compared (`detailed` False, `fits_all`)."""

    index: int
    name: str
    free: int
    total: int
    n_layer: int = 0
    n_gpu_layers: int = 0  # 0: nothing fits
    all_layers: bool = False
    n_cpu_moe: int = 0
    device_bytes: int = 0
    state_bytes: int = 0
    host_bytes: int = 0
    n_ctx: int | None = None
    detailed: bool = True
    fits_all: bool = False


@dataclass(frozen=True)
class FitAdvice:
    """One way to make a setting fit, as data the CLI words in its flags: `kind` is "shorter_context"
    (`n_ctx` fits, fully in RAM or with the weights `paging` from disk), "smaller_quant" (the weights
    alone are `weights` bytes) or "fewer_parallel" (`n_parallel` sequences multiply the KV cache)."""

    kind: str
    n_ctx: int = 0
    paging: bool = False
    weights: int = 0
    n_parallel: int = 0


@dataclass(frozen=True)
class FitVerdict:
    """`verdict` is one of "fits", "fits with paging", "does not fit"; `advice` says what would fit."""

    verdict: str
    message: str
    advice: list[FitAdvice]
    needed: int
    available: int
    gpus: list[GpuFit] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.verdict != NO_FIT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _cache_row_bytes(n: int, cache_type: str) -> int:
    if cache_type == "f32":
        return 4 * n
    if cache_type == "f16":
        return 2 * n
    if cache_type == "q8_0":
        return -(-n // 32) * 34  # blocks of 32 values: 32 int8 + one f16 scale
    raise ValueError(f"unknown cache type {cache_type!r} (use one of {', '.join(CACHE_TYPES)})")


def kv_bytes_per_token(cfg: ModelConfig, cache_type: str = ENGINE_CACHE_TYPE) -> int:
    """K and V of every full-attention layer for one token (GDN layers keep no per-token cache).

    One cache row per layer holds all KV heads (as in llama.cpp), so q8_0 blocks span heads.
    """
    per_layer = (_cache_row_bytes(cfg.n_head_kv * cfg.head_dim, cache_type)
                 + _cache_row_bytes(cfg.n_head_kv * cfg.head_dim_v, cache_type))
    return cfg.n_attention_layers * per_layer


def gdn_state_bytes(cfg: ModelConfig) -> int:
    """One sequence's recurrent state (f32 v_heads x k_dim x v_dim per layer) plus its conv ring."""
    state = cfg.ssm_v_heads * cfg.ssm_state * cfg.ssm_v_dim * 4
    ring = max(cfg.ssm_conv_kernel - 1, 0) * cfg.ssm_conv_dim * 4
    return cfg.n_gdn_layers * (state + ring)


def layer_state_bytes(cfg: ModelConfig, est: MemoryEstimate) -> dict[int, int]:
    """Each layer's share of `est`'s sequence state: an attention layer's K/V cache for n_ctx tokens,
    a GDN layer's state and conv ring with the prompt cache's snapshots of them, times the parallel
    sequences. A layer offloaded with `-ngl` keeps this on the GPU."""
    per_token = kv_bytes_per_token(cfg, est.cache_type) // max(1, cfg.n_attention_layers)
    gdn = gdn_state_bytes(cfg) // max(1, cfg.n_gdn_layers) * (1 + est.ctx_checkpoints)
    return {i: (per_token * est.n_ctx if cfg.layer_is_attention[i] else gdn) * est.n_parallel
            for i in range(cfg.n_layer)}


def _activation_bytes(cfg: ModelConfig, rows: int, kv_len: int) -> int:
    """f32 activations alive while one layer processes `rows` tokens against `kv_len` cached ones."""
    h = cfg.n_embd
    residual = 3 * rows * h  # residual stream, normed input, layer output
    attn = rows * (2 * cfg.n_head * cfg.head_dim + cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)
                   + cfg.n_head * cfg.head_dim_v)
    attn += rows * cfg.n_head * kv_len  # attention scores, all heads at once (no flash attention)
    gdn = rows * (2 * cfg.ssm_conv_dim + 2 * cfg.ssm_inner + 2 * cfg.ssm_v_heads)
    moe = rows * (cfg.n_expert + cfg.n_expert_used * (2 * cfg.expert_ff + h) + 2 * cfg.shared_ff)
    return 4 * (residual + max(attn, gdn) + moe)


def _scratch_bytes(cfg: ModelConfig) -> int:
    """One dequantized f32 copy of the largest per-layer matrix (kernels that cannot fuse)."""
    h = cfg.n_embd
    rows_cols = (2 * cfg.n_head * cfg.head_dim * h, cfg.ssm_conv_dim * h, h * cfg.n_head * cfg.head_dim_v,
                 h * cfg.ssm_inner, cfg.expert_ff * h)
    return 4 * max(rows_cols)


def compute_bytes(cfg: ModelConfig, n_ctx: int, n_parallel: int = 1, ubatch: int = DEFAULT_UBATCH) -> int:
    """Largest of a prefill chunk and a diffusion block (one per sequence), each with its logits.

    A prefill chunk keeps logits for its last row per sequence; a diffusion block scores every row.
    """
    block = cfg.diffusion.block_length
    prefill_rows = max(1, min(ubatch, n_ctx * n_parallel))
    prefill = _activation_bytes(cfg, prefill_rows, n_ctx) + n_parallel * cfg.n_vocab * 4
    block_rows = block * n_parallel
    diffusion = _activation_bytes(cfg, block_rows, n_ctx) + block_rows * cfg.n_vocab * 4
    return max(prefill, diffusion) + _scratch_bytes(cfg)


def estimate(cfg: ModelConfig, weight_bytes: int, n_ctx: int, n_parallel: int = 1, cache_type: str = ENGINE_CACHE_TYPE,
             ubatch: int = DEFAULT_UBATCH, *, ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS) -> MemoryEstimate:
    """Bytes needed to run `cfg` with `n_parallel` sequences of `n_ctx` tokens each, each sequence
    keeping up to `ctx_checkpoints` prompt-cache checkpoints."""
    if n_ctx < 1 or n_parallel < 1:
        raise ValueError("n_ctx and n_parallel must be positive")
    per_token = kv_bytes_per_token(cfg, cache_type)
    return MemoryEstimate(
        n_ctx=n_ctx, n_parallel=n_parallel, cache_type=cache_type, ubatch=ubatch,
        weights=int(weight_bytes),
        kv_cache=per_token * n_ctx * n_parallel,
        gdn_state=gdn_state_bytes(cfg) * n_parallel,
        compute=compute_bytes(cfg, n_ctx, n_parallel, ubatch),
        kv_per_token=per_token,
        checkpoints=gdn_state_bytes(cfg) * ctx_checkpoints * n_parallel,
        ctx_checkpoints=ctx_checkpoints,
    )


def parse_nvidia_smi(text: str) -> list[GpuMemory]:
    """Rows of `nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            gpus.append(GpuMemory(parts[0], int(parts[1]) * MiB, int(parts[2]) * MiB))
    return gpus


def nvidia_gpus(timeout: float = 3.0) -> list[GpuMemory]:
    """Visible NVIDIA GPUs; an empty list when nvidia-smi is missing, slow or failing."""
    from .processes import creation_kwargs, nvidia_smi

    exe = nvidia_smi()
    if not exe:
        return []
    try:
        res = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout, **creation_kwargs(),
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(res.stdout) if res.returncode == 0 else []


def probe_system(*, gpus: bool = True) -> SystemMemory:
    """RAM from psutil and, where nvidia-smi exists, each GPU's free memory."""
    import psutil

    vm = psutil.virtual_memory()
    return SystemMemory(int(vm.total), int(vm.available), nvidia_gpus() if gpus else [])


def gpu_fit(index: int, gpu: GpuMemory, tensors: Mapping[str, Any], n_layer: int,
            layer_state: Mapping[int, int] | None = None, n_ctx: int | None = None) -> GpuFit:
    """What fits one GPU: every layer, else every layer with the fewest layers' routed experts in
    RAM, else the most layers. An offloaded layer's K/V cache and recurrent state live on the GPU
    with it, so `layer_state` (`layer_state_bytes`, for the context `n_ctx`) counts there too.
    `tensors` maps names to TensorInfo-like objects (`shape`, `n_bytes`)."""
    card = {"index": index, "name": gpu.name, "free": gpu.free, "total": gpu.total, "n_layer": n_layer,
            "n_ctx": n_ctx}
    split = fit_experts(tensors, n_layer, gpu.free, layer_state=layer_state)
    if split is not None:
        return GpuFit(**card, n_gpu_layers=n_layer, all_layers=True, n_cpu_moe=split.n_cpu_moe,
                      device_bytes=split.device_bytes, state_bytes=split.state_bytes, host_bytes=split.host_bytes)
    part = fit_layers(tensors, n_layer, gpu.free, layer_state=layer_state)
    if part.any:
        return GpuFit(**card, n_gpu_layers=part.n_gpu_layers, device_bytes=part.device_bytes,
                      state_bytes=part.state_bytes)
    return GpuFit(**card)


def assess(est: MemoryEstimate, system: SystemMemory, margin: int = DEFAULT_MARGIN,
           tensors: Mapping[str, Any] | None = None, n_layer: int = 0,
           layer_state: Mapping[int, int] | None = None) -> FitVerdict:
    """Compare an estimate with available RAM: resident, paging weights through mmap, or not at all.

    Every message names the margin kept free, so "needs 22.3 GiB + 1.0 GiB margin" next to "22.4 GiB
    available" reads as the shortfall it is."""
    avail = system.ram_available
    keep = f"{size_text(margin)} margin"
    if est.total + margin <= avail:
        verdict, needed = FITS, est.total
        message = f"fits: needs {size_text(est.total)} + {keep} of {size_text(avail)} available RAM"
    elif est.without_weights + margin <= avail:
        verdict, needed = PAGING, est.total
        message = (f"fits with paging: needs {size_text(est.total)} + {keep} but {size_text(avail)} RAM is "
                   f"available; weights ({size_text(est.weights)}) page from disk through mmap, so generation "
                   "is slow")
    else:
        verdict, needed = NO_FIT, est.without_weights
        message = (f"does not fit: KV cache, state and compute alone need {size_text(est.without_weights)} "
                   f"+ {keep} but {size_text(avail)} RAM is available")
    advice: list[FitAdvice] = []
    if verdict != FITS:
        if est.weights >= est.without_weights:
            advice.append(FitAdvice("smaller_quant", weights=est.weights))
        if est.n_parallel > 1:
            advice.append(FitAdvice("fewer_parallel", n_parallel=est.n_parallel))
    gpus = []
    for i, g in enumerate(system.gpus):
        if tensors is not None and n_layer > 0:
            gpus.append(gpu_fit(i, g, tensors, n_layer, layer_state, est.n_ctx))
        else:
            gpus.append(GpuFit(i, g.name, g.free, g.total, detailed=False,
                               fits_all=est.weights + DEVICE_RESERVE <= g.free))
    return FitVerdict(verdict, message, advice, needed, avail, gpus)


def _fits(cfg: ModelConfig, weight_bytes: int, system: SystemMemory, n_ctx: int, n_parallel: int,
          cache_type: str, ubatch: int, margin: int, paging: bool) -> bool:
    est = estimate(cfg, weight_bytes, n_ctx, n_parallel, cache_type, ubatch)
    need = est.without_weights if paging else est.total
    return need + margin <= system.ram_available


def largest_context(cfg: ModelConfig, weight_bytes: int, system: SystemMemory, n_parallel: int = 1,
                    cache_type: str = ENGINE_CACHE_TYPE, *, ubatch: int = DEFAULT_UBATCH, margin: int = DEFAULT_MARGIN,
                    paging: bool = False) -> int:
    """Largest n_ctx (a multiple of 256, at most the model's context) that fits; 0 when none does.

    With `paging`, the weights may page from disk and only the rest must be resident.
    """
    cap = cfg.context_length
    top = cap // CTX_STEP
    if top == 0:
        ok = _fits(cfg, weight_bytes, system, cap, n_parallel, cache_type, ubatch, margin, paging)
        return cap if ok else 0
    lo, hi = 0, top  # invariant: lo steps fit (0 trivially), steps above hi do not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(cfg, weight_bytes, system, mid * CTX_STEP, n_parallel, cache_type, ubatch, margin, paging):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_STEP


def context_for(requested: int | None, cfg: ModelConfig, weight_bytes: int, n_parallel: int = 1,
                system: SystemMemory | None = None) -> int:
    """What `-c` means in every command, per sequence: None is DEFAULT_CTX (capped at the model's
    context), 0 is the largest that fits this machine (at least MIN_AUTO_CTX, at most the model's),
    anything else is taken as given (callers refuse or warn when it exceeds the model's)."""
    if requested is None:
        return min(DEFAULT_CTX, cfg.context_length)
    if requested > 0:
        return requested
    system = system if system is not None else probe_system()
    fit_ctx = largest_context(cfg, weight_bytes, system, n_parallel)
    return min(cfg.context_length, max(fit_ctx, MIN_AUTO_CTX))


@dataclass(frozen=True)
class FitRow:
    n_ctx: int
    estimate: MemoryEstimate
    verdict: str
    chosen: bool


@dataclass(frozen=True)
class FitReport:
    """Everything a command shows about fit: the chosen setting, a table of contexts, the limits."""

    estimate: MemoryEstimate
    verdict: FitVerdict
    rows: list[FitRow]
    largest_context: int
    largest_context_paging: int
    system: SystemMemory
    context_length: int
    margin: int

    def to_json(self) -> dict[str, Any]:
        return {
            "n_ctx": self.estimate.n_ctx, "n_parallel": self.estimate.n_parallel,
            "cache_type": self.estimate.cache_type, "ubatch": self.estimate.ubatch,
            "estimate": self.estimate.to_json(), "verdict": self.verdict.to_json(),
            "largest_context": self.largest_context, "largest_context_paging": self.largest_context_paging,
            "margin": self.margin, "system": self.system.to_json(),
            "table": [{"n_ctx": r.n_ctx, "chosen": r.chosen, "verdict": r.verdict, **r.estimate.to_json()}
                      for r in self.rows],
        }


def table_contexts(context_length: int, chosen: int) -> list[int]:
    """4K/16K/32K/64K/128K up to the model's context (and the context itself), plus the chosen one."""
    ctxs = {c for c in TABLE_CONTEXTS if c <= context_length}
    if context_length < TABLE_CONTEXTS[-1]:
        ctxs.add(context_length)
    ctxs.add(chosen)
    return sorted(ctxs)


def fit_report(cfg: ModelConfig, weight_bytes: int, n_ctx: int, n_parallel: int = 1,
               cache_type: str = ENGINE_CACHE_TYPE, *, ubatch: int = DEFAULT_UBATCH, system: SystemMemory | None = None,
               margin: int = DEFAULT_MARGIN, tensors: Mapping[str, Any] | None = None) -> FitReport:
    """Estimate, verdict, table and largest contexts for one model on this (or the given) machine;
    with `tensors` (name -> info with shape and n_bytes) each GPU's note says what -ngl fits it."""
    system = system if system is not None else probe_system()
    est = estimate(cfg, weight_bytes, n_ctx, n_parallel, cache_type, ubatch)
    verdict = assess(est, system, margin, tensors, cfg.n_layer, layer_state_bytes(cfg, est))
    rows = []
    for c in table_contexts(cfg.context_length, n_ctx):
        e = est if c == n_ctx else estimate(cfg, weight_bytes, c, n_parallel, cache_type, ubatch)
        rows.append(FitRow(c, e, assess(e, system, margin).verdict, c == n_ctx))
    best = largest_context(cfg, weight_bytes, system, n_parallel, cache_type, ubatch=ubatch, margin=margin)
    best_paging = largest_context(cfg, weight_bytes, system, n_parallel, cache_type, ubatch=ubatch,
                                  margin=margin, paging=True)
    advice = list(verdict.advice)
    if verdict.verdict != FITS:
        if 0 < best < n_ctx:
            advice.insert(0, FitAdvice("shorter_context", n_ctx=best))
        elif verdict.verdict == NO_FIT and 0 < best_paging < n_ctx:
            advice.insert(0, FitAdvice("shorter_context", n_ctx=best_paging, paging=True))
    verdict = FitVerdict(verdict.verdict, verdict.message, advice, verdict.needed, verdict.available,
                         verdict.gpus)
    return FitReport(est, verdict, rows, best, best_paging, system, cfg.context_length, margin)
