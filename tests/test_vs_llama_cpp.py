"""benchmarks/vs_llama_cpp.py: the measuring order llama-bench uses, the two-depth extrapolation,
and the script end to end on a small file (clover's rows alone where no llama.cpp is installed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.synth_models import small_model_path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "vs_llama_cpp.py"


def _script():
    spec = importlib.util.spec_from_file_location("vs_llama_cpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_test_gets_an_untimed_warm_up_run_first() -> None:
    """As llama-bench: one untimed prompt run before the pp repetitions and one untimed generated
    token before the tg ones, so no repetition pays for loading its kernels."""
    calls: list[str] = []

    def pp() -> float:
        calls.append("pp")
        return 0.5

    def tg() -> float:
        calls.append("tg")
        return 0.25

    out = _script()._measure(pp, tg, lambda: calls.append("tg-warm"), 512, 128, 3)
    assert calls == ["pp"] * 4 + ["tg-warm"] + ["tg"] * 3
    assert out["pp_ts"] == [1024.0] * 3 and out["tg_ts"] == [512.0] * 3


def test_the_full_model_is_extrapolated_from_the_shallowest_and_deepest_files() -> None:
    head, per_layer = 11.0, 1.5
    ms = {d: head + per_layer * d for d in (4, 8, 12)}
    got_layer, got_full = _script().extrapolate(ms, full=40)
    assert got_layer == pytest.approx(per_layer) and got_full == pytest.approx(head + 40 * per_layer)


def test_slopes_are_taken_within_each_round() -> None:
    """Round 1 runs 30 % slower at both depths (a drifting machine): each round's own slope and
    extrapolation come back, not a slope between depths measured in different rounds."""
    def run(round_: int, ms: float) -> dict:
        return {"round": round_, "tg_ts": [1e3 / ms, 1e3 / ms]}

    head, layer = 10.0, 1.5
    by_depth = {d: [run(i, (head + layer * d) * (1.3 if i == 1 else 1.0)) for i in (0, 1)] for d in (4, 8)}
    by_depth[8].append(run(2, 99.0))  # a round that ran one depth only has no slope
    got = _script().paired_rounds(by_depth, "tg_ts", full=40)
    assert sorted(got) == [0, 1]
    for i, f in ((0, 1.0), (1, 1.3)):
        assert got[i][0] == pytest.approx(layer * f) and got[i][1] == pytest.approx((head + 40 * layer) * f)


def test_the_script_reports_clovers_rows_without_llama_cpp(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_BENCH"}
    env["PATH"] = str(tmp_path)  # no llama-bench on it
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", str(small_model_path("Q4_K")), "-p", "16",
                           "-n", "4", "-r", "1", "--rounds", "1", "--threads", "1"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if "skipping it" not in proc.stdout:
        pytest.skip("llama-cpp-python is installed here: the bindings would run too")
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| Q4_K"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2] == "1" and cells[4:6] == ["-", "-"] and cells[7:9] == ["-", "-"], row
    assert float(cells[3]) > 0 and float(cells[6]) > 0, row  # clover's pp16 and tg4, tokens a second
