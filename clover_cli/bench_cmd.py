"""`clover bench`: llama-bench's tests and output formats, plus block-diffusion generation (dgN).

Module top imports only typer and the standard library; the runtime is imported inside the command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from .completion import complete_model
from .options import (
    DIFFUSION,
    MODEL,
    OUTPUT,
    PLACEMENT,
    TESTS,
    cpu_moe_option,
    device_option,
    main_gpu_option,
    mmap_option,
    n_cpu_moe_option,
    ngl_option,
)

_L = list[str] | None


def command(
    models: Annotated[_L, typer.Argument(metavar="MODEL", autocompletion=complete_model,
                                         help="demo, model files or Hub references (also -m, repeatable).")] = None,
    model_opt: Annotated[_L, typer.Option("-m", "--model", metavar="MODEL", rich_help_panel=MODEL,
                                          help="Model to measure (repeatable).")] = None,
    offline: Annotated[bool, typer.Option("--offline", rich_help_panel=MODEL,
                                          help="Use only models already on disk.")] = False,
    n_prompt: Annotated[_L, typer.Option("-p", "--n-prompt", metavar="N", rich_help_panel=TESTS,
                                         help="Prompt tokens for ppN tests (default 512; lists: 128,512 or "
                                              "128-1024*2; 0 skips).")] = None,
    n_gen: Annotated[_L, typer.Option("-n", "--n-gen", metavar="N", rich_help_panel=TESTS,
                                      help="Generated tokens for tgN tests (default 128; 0 skips).")] = None,
    pg: Annotated[_L, typer.Option("-pg", metavar="PP,TG", rich_help_panel=TESTS,
                                   help="Prompt then generation (repeatable).")] = None,
    n_diffusion: Annotated[_L, typer.Option("-dg", "--n-diffusion", metavar="N", rich_help_panel=TESTS,
                                            help="Tokens for diffusion dgN tests (default 128; 0 skips).")] = None,
    depth: Annotated[_L, typer.Option("-d", "--n-depth", metavar="N", rich_help_panel=TESTS,
                                      help="Tokens already in context.")] = None,
    repetitions: Annotated[int, typer.Option("-r", "--repetitions", min=1, rich_help_panel=TESTS,
                                             help="Runs per test.")] = 5,
    no_warmup: Annotated[bool, typer.Option("--no-warmup", rich_help_panel=TESTS, help="No warm-up run.")] = False,
    block_length: Annotated[_L, typer.Option("--block-length", metavar="N", rich_help_panel=DIFFUSION,
                                             help="Diffusion block length.")] = None,
    threshold: Annotated[_L, typer.Option("--threshold", metavar="N", rich_help_panel=DIFFUSION,
                                          help="Diffusion reveal threshold.")] = None,
    expert_coreset: Annotated[_L, typer.Option("--expert-coreset", metavar="K", rich_help_panel=DIFFUSION,
                                               help="Experts shared by a diffusion block.")] = None,
    reveal_k: Annotated[_L, typer.Option("--reveal-k", metavar="K", rich_help_panel=DIFFUSION,
                                         help="dg: reveal exactly K tokens per pass instead of by threshold "
                                              "(e.g. 1,2,4,8; speed at a known tokens per pass).")] = None,
    verify: Annotated[bool, typer.Option(
        "--verify/--no-verify", rich_help_panel=DIFFUSION,
        help="dg: check each block against greedy AR at its commit (synthetic prompts: mostly cut).")] = False,
    output: Annotated[str, typer.Option("-o", "--output", metavar="md|csv|json|jsonl", rich_help_panel=OUTPUT,
                                        help="Output format.")] = "md",
    threads: Annotated[_L, typer.Option("-t", "--threads", metavar="N", rich_help_panel=PLACEMENT,
                                        help="Threads (default: physical cores).")] = None,
    backend: Annotated[_L, typer.Option("--backend", metavar="numba|numpy", rich_help_panel=PLACEMENT,
                                        help="CPU kernels (default: numba).")] = None,
    exact_kernels: Annotated[bool, typer.Option(
        "--exact-kernels", rich_help_panel=PLACEMENT,
        help="numba: float kernels for quantized weights (no 8-bit activations).")] = False,
    n_gpu_layers: Annotated[str | None, ngl_option(annotated=True)] = None,
    cpu_moe: Annotated[bool, cpu_moe_option(annotated=True)] = False,
    n_cpu_moe: Annotated[int, n_cpu_moe_option(annotated=True)] = 0,
    mmap: Annotated[bool | None, mmap_option(annotated=True)] = None,
    device: Annotated[str, device_option(annotated=True)] = "auto",
    main_gpu: Annotated[int, main_gpu_option(annotated=True)] = 0,
) -> None:
    """Measure prefill (ppN), decode (tgN) and block-diffusion (dgN) speed, like llama-bench.

    Each test runs once to warm up, then -r times; the table shows mean ± std tokens/s. Timing
    excludes tokenization (prompts are synthetic token ids).

    Example:

        clover bench demo -p 64 -n 64 -dg 64 -t 1,2 -o md
    """
    from clover_runtime.bench import build_info, make_configs, make_tests

    from .bench_args import parse_float_list, parse_int_list, parse_pairs
    from .bench_table import OUTPUT_FORMATS, TablePrinter
    from .options import offload_request
    from .usage import UsageError, choice

    choice("-o", output, tuple(OUTPUT_FORMATS))
    names = list(models or []) + list(model_opt or [])
    if not names:
        raise UsageError("no model given", "try the model that ships with clover: clover bench demo")
    offload = offload_request(n_gpu_layers, cpu_moe, n_cpu_moe, device, main_gpu, mmap)
    backends = [b.strip() for v in (backend or ["numba"]) for b in v.split(",") if b.strip()]
    for b in backends:
        choice("--backend", b, ("numba", "numpy"))
    tests = make_tests(parse_int_list(n_prompt or ["512"]), parse_int_list(n_gen or ["128"]),
                       parse_pairs(pg or []), parse_int_list(n_diffusion or ["128"]),
                       parse_int_list(depth or ["0"]) or [0])
    if not tests:
        raise UsageError("no tests to run (every count is 0)")
    if threads:
        thread_list = parse_int_list(threads)
    else:
        from clover_runtime.kernels.jit import default_threads

        thread_list = [default_threads()]
    if any(t < 1 for t in thread_list):
        raise UsageError("-t: threads must be at least 1")
    configs = make_configs(thread_list, backends, parse_int_list(block_length or []),
                           parse_float_list(threshold or []), parse_int_list(expert_coreset or []),
                           parse_int_list(reveal_k or []), verify)
    from . import __version__
    from .app import git_commit

    build = build_info(__version__, git_commit())
    settings = [{"block_length": c.block_length, "reveal_k": c.reveal_k, "threshold": c.threshold,
                 "expert_coreset": c.expert_coreset} for c in configs]
    printer = TablePrinter(output, build, sys.stdout, settings, any(t.diffusion for t in tests))
    try:
        for name in names:
            path = _resolve(name, offline)
            for cfg in configs:
                _measure(path, cfg, tests, repetitions, not no_warmup, build, exact_kernels, offload, printer.add)
    except BaseException:
        if printer.count:  # an interrupted or failed run still closes the table it began
            printer.end()
        raise
    printer.end()


def _resolve(name: str, offline: bool) -> str:
    """A local path for `name`, resolved as run and serve resolve theirs."""
    from .model_setup import resolve

    return str(resolve(name, offline=offline))


def _measure(path: str, cfg, tests, repetitions: int, warmup: bool, build, exact_kernels: bool,  # noqa: ANN001
             offload, emit: Callable[[list[dict]], None]) -> None:  # noqa: ANN001
    """Measure `tests` on the model at `path` under `cfg`, handing each test's record to `emit`
    as soon as it is measured."""
    from clover_runtime.bench import model_facts, placement_fields, records, run_tests
    from clover_runtime.loader import load_model

    from .model_setup import compile_first_run

    model = load_model(path, n_threads=cfg.threads, backend=cfg.backend, exact_kernels=exact_kernels,
                       offload=offload)
    compile_first_run(model)
    facts = model_facts(path, model)
    placement = placement_fields(model)
    shown = cfg
    if exact_kernels and cfg.backend == "numba":  # say so in the backend column
        import dataclasses

        shown = dataclasses.replace(cfg, backend="numba exact")
    with _progress(len(tests) * (repetitions + int(warmup))) as tick:
        run_tests(model, tests, cfg, repetitions=repetitions, warmup=warmup,
                  on_progress=lambda test, i, n: tick(f"{facts.model_type}: {test.name}", i, n),
                  on_result=lambda result: tick.show(lambda: emit(records(facts, shown, [result], build, placement))))


class _progress:
    """A rich progress bar on an interactive stderr; nothing otherwise."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self._bar = total, 0, None

    def __enter__(self):
        if sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            from .console import err

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                 console=err(), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("bench", total=self.total)
        return self

    def __call__(self, description: str, i: int, n: int) -> None:
        if self._bar is not None and i > 0:
            self.done += 1
            self._bar.update(self._task, completed=min(self.done, self.total), description=description)
        elif self._bar is not None:
            self._bar.update(self._task, description=description)

    def show(self, write: Callable[[], None]) -> None:
        """Run `write` (a table row to stdout) with the bar off the screen, then bring it back:
        a row written under a live bar on the same terminal would be drawn over."""
        if self._bar is None:
            write()
            return
        self._bar.stop()
        try:
            write()
        finally:
            self._bar.start()

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
