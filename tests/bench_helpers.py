"""Shared set-up for the `clover bench` tests: the command on its own Typer app, run in-process."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from clover_cli import bench_cmd

LLAMA_BENCH_FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode", "main_gpu", "no_kv_offload", "flash_attn",
    "devices", "tensor_split", "tensor_buft_overrides", "use_mmap", "use_direct_io", "embeddings",
    "no_op_offload", "no_host", "repack", "fit_target", "fit_min_ctx", "n_prompt", "n_gen", "n_depth",
    "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts",
)


def bench_app() -> typer.Typer:
    app = typer.Typer()
    app.command("bench")(bench_cmd.command)

    @app.callback()
    def _root() -> None:
        """clover (test harness)."""

    return app


def run_bench(*args: str):
    """Invoke `clover bench ARGS` and return the click result (stdout only in .stdout)."""
    return CliRunner().invoke(bench_app(), ["bench", *args])
