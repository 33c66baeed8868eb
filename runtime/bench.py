"""Speed measurements in llama-bench's shape: prefill (ppN), decode (tgN), both (ppN+tgM) and
block-diffusion generation (dgN), each as mean ± std over repetitions after a warm-up.

Timings cover model work only: prompts are synthetic token ids (no tokenization) and decode
steps feed fixed ids (no sampling), as llama-bench does. Diffusion runs the real decoder
(`clover_runtime.decoding.generate`) with greedy picks and no stop tokens so every run generates N
tokens; its time is the decoder's own generation time (the prompt prefill is not counted).
Records carry llama-bench's JSON field names so existing tooling reads them.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CloverError


@dataclass(frozen=True)
class BenchTest:
    """One measured test: `pp512`, `tg128`, `pp512+tg128` or `dg128`, optionally at a depth."""

    n_prompt: int
    n_gen: int
    diffusion: bool = False
    depth: int = 0

    @property
    def name(self) -> str:
        if self.diffusion:
            base = f"dg{self.n_gen}"
        elif self.n_prompt and self.n_gen:
            base = f"pp{self.n_prompt}+tg{self.n_gen}"
        elif self.n_prompt:
            base = f"pp{self.n_prompt}"
        else:
            base = f"tg{self.n_gen}"
        return base + (f" @ d{self.depth}" if self.depth else "")

    @property
    def n_tokens(self) -> int:
        return self.n_gen if self.diffusion else self.n_prompt + self.n_gen


@dataclass(frozen=True)
class BenchConfig:
    """One combination of run parameters (each list-valued flag contributes one value)."""

    threads: int
    backend: str
    block_length: int | None = None
    threshold: float | None = None
    expert_coreset: int | None = None
    reveal_k: int | None = None  # dg: a fixed number of tokens revealed per pass (None: the threshold)
    verify: bool = False  # dg: commits check blocks against greedy AR (off: synthetic prompts)


@dataclass
class BenchResult:
    """Samples of one test; throughput in tokens/s; diffusion extras when it is a dg test."""

    test: BenchTest
    samples_ns: list[int]
    extras: dict[str, float] = field(default_factory=dict)
    test_time: str = ""

    @property
    def samples_ts(self) -> list[float]:
        return [self.test.n_tokens / (ns / 1e9) for ns in self.samples_ns]

    @property
    def avg_ns(self) -> float:
        return statistics.fmean(self.samples_ns) if self.samples_ns else 0.0

    @property
    def stddev_ns(self) -> float:
        return statistics.stdev(self.samples_ns) if len(self.samples_ns) > 1 else 0.0

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts) if self.samples_ns else 0.0

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0


def make_tests(n_prompt: Sequence[int], n_gen: Sequence[int], pg: Sequence[tuple[int, int]],
               n_diffusion: Sequence[int], depths: Sequence[int]) -> list[BenchTest]:
    """Every test llama-bench would run for these lists, plus the dg tests, at every depth."""
    tests = []
    for d in depths:
        tests += [BenchTest(p, 0, depth=d) for p in n_prompt if p > 0]
        tests += [BenchTest(0, n, depth=d) for n in n_gen if n > 0]
        tests += [BenchTest(p, n, depth=d) for p, n in pg if p > 0 or n > 0]
        tests += [BenchTest(0, n, diffusion=True, depth=d) for n in n_diffusion if n > 0]
    return tests


def make_configs(threads: Sequence[int], backends: Sequence[str], block_lengths: Sequence[int | None],
                 thresholds: Sequence[float | None], coresets: Sequence[int | None],
                 reveal_ks: Sequence[int | None] = (), verify: bool = False) -> list[BenchConfig]:
    return [BenchConfig(*combo, verify=verify)
            for combo in itertools.product(threads, backends, block_lengths or [None], thresholds or [None],
                                           coresets or [None], reveal_ks or [None])]


def synthetic_tokens(n: int, n_real: int, seed: int = 1234) -> list[int]:
    """Deterministic ordinary token ids, clear of the byte tokens and specials at the ends."""
    rng = np.random.default_rng(seed)
    lo = min(300, max(0, n_real // 4))
    hi = max(lo + 1, min(n_real - 16, 100_000))
    return rng.integers(lo, hi, size=n).tolist()


def _vocab(model: Any) -> int:
    cfg = model.config
    return int(getattr(cfg, "n_tokens", 0) or getattr(cfg, "n_vocab", 0) or model.n_vocab)


def _prefilled_state(model: Any, n_depth: int, n_ctx: int, vocab: int) -> Any:
    state = model.new_state(n_ctx=n_ctx)
    if n_depth:
        model.forward(synthetic_tokens(n_depth, vocab, seed=7), state=state, last_only=True)
    return state


def _run_causal(model: Any, test: BenchTest, n_ctx: int, vocab: int) -> tuple[int, dict]:
    state = _prefilled_state(model, test.depth, n_ctx, vocab)
    prompt = synthetic_tokens(test.n_prompt, vocab, seed=11)
    gen = synthetic_tokens(test.n_gen, vocab, seed=13)
    start = time.perf_counter_ns()
    if prompt:
        model.forward(prompt, state=state, last_only=True)
    for tok in gen:
        model.forward([tok], state=state, last_only=True)
    return time.perf_counter_ns() - start, {}


DiffusionRunner = Callable[[Any, list[int], int, BenchConfig, Any], dict[str, float]]


def decoder_runner() -> DiffusionRunner:
    """The block-diffusion decoder of `clover_runtime.decoding` as a dg runner (greedy: the same work every run)."""
    from . import decoding

    def run(model: Any, prompt: list[int], n: int, cfg: BenchConfig, state: Any) -> dict[str, float]:
        params = decoding.DecodeParams(decode="diffusion", max_tokens=n, stop_ids=frozenset(),
                                       block_length=cfg.block_length, threshold=cfg.threshold,
                                       expert_coreset=cfg.expert_coreset, reveal_k=cfg.reveal_k, verify=cfg.verify,
                                       sampling=decoding.SamplingParams(temperature=0.0))
        start = time.perf_counter_ns()
        stats: Any = None
        for event in decoding.generate(model, prompt, params, state=state):
            if isinstance(event, decoding.DoneEvent):
                stats = event.stats
        wall = time.perf_counter_ns() - start
        return {**_diffusion_extras(stats, wall), "pass_steps": pass_cost_in_steps(model, cfg.block_length)}

    return run


def pass_cost_in_steps(model: Any, block_length: int | None, reps: int = 3) -> float:
    """One preview pass of a whole block (a logit row per position) in decode steps, on a short
    scratch sequence: the tokens per pass block diffusion must reach to beat AR (`--decode auto`
    decides with the same figure, measured as it decodes). Medians of `reps` timings."""
    mask = model.config.diffusion.mask_token_id
    if mask is None:
        return 0.0
    n = int(block_length or model.config.diffusion.block_length)
    block = [int(mask)] * n
    state = model.new_state(n + 4)
    model.forward([0, 1], state, last_only=True)
    snapshot = state.copy()
    steps, passes = [], []
    for _ in range(reps):
        t = time.perf_counter()
        model.preview(block, state, logit_rows=list(range(n)))
        passes.append(time.perf_counter() - t)
        t = time.perf_counter()
        model.forward([0], state, last_only=True)
        steps.append(time.perf_counter() - t)
        model.restore(state, snapshot)
    step = float(np.median(steps))
    return float(np.median(passes)) / step if step > 0 else 0.0


def _diffusion_extras(stats: Any, wall_ns: int) -> dict[str, float]:
    """The dg figures from the decoder's GenerationStats (its own generation time when it has one)."""
    from .text.reply import Timings

    t = Timings.of(stats)
    return {
        "time_ns": stats.gen_ms * 1e6 if stats.gen_ms > 0 else float(wall_ns),
        "generated": float(stats.generated_tokens),
        "tokens_per_forward": t.tokens_per_forward,
        "passes": float(stats.passes),
        "passes_per_block": stats.passes / max(1, stats.blocks),
        "forwards": float(stats.forwards),
    }


def _run_diffusion(model: Any, test: BenchTest, n_ctx: int, vocab: int, cfg: BenchConfig,
                   runner: DiffusionRunner) -> tuple[int, dict]:
    prompt = synthetic_tokens(max(test.depth, 1), vocab, seed=7)
    state = model.new_state(n_ctx=n_ctx)
    extras = runner(model, prompt, test.n_gen, cfg, state)
    return int(extras.pop("time_ns")), extras


def run_tests(
    model: Any,
    tests: Sequence[BenchTest],
    cfg: BenchConfig,
    *,
    repetitions: int = 5,
    warmup: bool = True,
    diffusion_runner: DiffusionRunner | None = None,
    on_progress: Callable[[BenchTest, int, int], None] | None = None,
    on_result: Callable[[BenchResult], None] | None = None,
) -> list[BenchResult]:
    """Measure every test on one loaded model under one parameter combination; `on_result` hears
    each test's result as soon as it is measured (a table printed row by row)."""
    context = int(model.config.context_length)
    vocab = _vocab(model)
    results = []
    for test in tests:
        slack = max(cfg.block_length or 32, 32) if test.diffusion else 1
        n_ctx = test.depth + test.n_prompt + test.n_gen + slack
        if n_ctx > context:
            raise CloverError(f"{test.name} needs {n_ctx} tokens of context; the model has {context}")
        if test.diffusion and diffusion_runner is None:
            diffusion_runner = decoder_runner()
        runs = (1 if warmup else 0) + repetitions
        samples: list[int] = []
        extras_all: list[dict] = []
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for i in range(runs):
            if on_progress:
                on_progress(test, i, runs)
            if test.diffusion:
                assert diffusion_runner is not None
                ns, extras = _run_diffusion(model, test, n_ctx, vocab, cfg, diffusion_runner)
            else:
                ns, extras = _run_causal(model, test, n_ctx, vocab)
            if i >= runs - repetitions:
                samples.append(max(1, int(ns)))
                extras_all.append(extras)
        if on_progress:
            on_progress(test, runs, runs)
        keys = extras_all[0] if extras_all else {}
        merged = {k: statistics.fmean(e[k] for e in extras_all) for k in keys}
        results.append(BenchResult(test, samples, merged, stamp))
        if on_result:
            on_result(results[-1])
    return results


# -- records ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What the table and the JSON say about a model."""

    filename: str
    model_type: str
    size: int
    n_params: int


def model_facts(path: str | Path, model: Any) -> ModelFacts:
    """llama-bench's `model_type` (`<arch> <size> <ftype>`), tensor bytes and parameter count."""
    from .model_summary import summarize

    s = summarize(model.file, filename=Path(path).name)
    size = _size_label(s.n_params, s.n_params_active if s.n_expert else None)
    ftype = _ftype_label(s.file_type) or "?"
    return ModelFacts(str(path), f"{s.architecture} {size} {ftype}", int(s.tensor_bytes), int(s.n_params))


def _count_label(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v >= 10 else f"{v:.1f}{unit}"
    return str(n)


def _size_label(total: int, active: int | None) -> str:
    return _count_label(total) + (f".A{_count_label(active)}" if active else "")


def _ftype_label(name: str | None) -> str | None:
    if not name:
        return None
    for suffix, word in (("_M", "Medium"), ("_S", "Small"), ("_L", "Large"), ("_XS", "Extra Small")):
        if name.endswith(suffix) and name.count("_") >= 2:
            return f"{name[: -len(suffix)]} - {word}"
    return name


@dataclass(frozen=True)
class BuildInfo:
    version: str
    commit: str
    cpu: str
    cpu_detail: str


def build_info(version: str, commit: str) -> BuildInfo:
    """This machine's CPU beside the caller's version and source commit (the CLI knows those)."""
    from . import system_info

    cpu = system_info.cpu_name()
    try:
        info = system_info.probe()
        detail = f"{info.physical_cores} cores, {info.logical_cores} threads"
        if info.cpu_features:
            detail += ", " + " ".join(info.cpu_features)
    except Exception:  # noqa: BLE001 - a report line, never a failure
        detail = ""
    return BuildInfo(version, commit, cpu, detail)


def placement_fields(model: Any) -> dict[str, Any]:
    """llama-bench's device fields for a loaded model: `gpu_info`, `backends`, `n_gpu_layers`,
    `n_cpu_moe`, `devices`, `main_gpu` (empty when nothing is offloaded: the CPU values stand)."""
    group = model.weights.device_group
    if group is None:
        return {}
    device = group.info.device
    kind = {"cuda": "CUDA", "mps": "Metal"}.get(device.type, "torch-CPU")
    return {"gpu_info": group.info.name, "backends": f"{kind},CPU", "n_gpu_layers": group.placement.n_gpu_layers,
            "n_cpu_moe": group.placement.n_cpu_moe, "devices": f"{kind}{device.index or 0}",
            "main_gpu": device.index or 0}


def records(facts: ModelFacts, cfg: BenchConfig, results: Sequence[BenchResult],
            build: BuildInfo, device: dict[str, Any] | None = None) -> list[dict]:
    """One llama-bench-compatible dict per result (plus clover's diffusion fields); `device` holds
    the placement fields of an offloaded model (`placement_fields`)."""
    out = []
    for r in results:
        t = r.test
        rec: dict[str, Any] = {
            "build_commit": build.commit, "build_number": 0, "cpu_info": build.cpu, "gpu_info": "",
            "backends": "CPU", "model_filename": facts.filename, "model_type": facts.model_type,
            "model_size": facts.size, "model_n_params": facts.n_params, "n_batch": 2048, "n_ubatch": 512,
            "n_threads": cfg.threads, "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": "f32",
            "type_v": "f32", "n_gpu_layers": 0, "n_cpu_moe": 0, "split_mode": "none", "main_gpu": 0,
            "no_kv_offload": False, "flash_attn": False, "devices": "", "tensor_split": "0.00",
            "tensor_buft_overrides": "none", "use_mmap": True, "use_direct_io": False, "embeddings": False,
            "no_op_offload": False, "no_host": False, "repack": False, "fit_target": 0, "fit_min_ctx": 0,
            "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.depth, "test_time": r.test_time,
            "avg_ns": int(round(r.avg_ns)), "stddev_ns": int(round(r.stddev_ns)), "avg_ts": r.avg_ts,
            "stddev_ts": r.stddev_ts, "samples_ns": list(r.samples_ns), "samples_ts": r.samples_ts,
            "test": t.name, "clover_version": build.version, "clover_backend": cfg.backend,
            "diffusion": t.diffusion, "block_length": cfg.block_length, "threshold": cfg.threshold,
            "expert_coreset": cfg.expert_coreset, "reveal_k": cfg.reveal_k, "verify": cfg.verify,
        }
        rec.update(device or {})
        if t.diffusion:
            passes = r.extras.get("passes", 0.0)
            secs = r.avg_ns / 1e9
            rec.update({
                "diffusion_steps": passes,
                "avg_steps_per_s": passes / secs if secs > 0 else 0.0,
                "tokens_per_forward": r.extras.get("tokens_per_forward", 0.0),
                "passes_per_block": r.extras.get("passes_per_block", 0.0),
                "pass_steps": r.extras.get("pass_steps", 0.0),
            })
        out.append(rec)
    return out


__all__ = [
    "BenchConfig", "BenchResult", "BenchTest", "BuildInfo", "ModelFacts", "build_info", "decoder_runner",
    "make_configs", "make_tests", "model_facts", "records", "run_tests", "synthetic_tokens",
]
