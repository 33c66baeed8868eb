"""`clover bench` on a tiny synthetic model: the tests run, and every output format carries
llama-bench's fields (the numbers themselves are not checked: speed is not a test)."""

from __future__ import annotations

import csv
import io
import json
import re
import statistics

import pytest
from bench_helpers import LLAMA_BENCH_FIELDS, run_bench
from clover_runtime.errors import CloverError
from synth_models import tiny_model_path


@pytest.fixture(scope="module")
def model():
    return str(tiny_model_path("Q8_0"))


@pytest.fixture(scope="module")
def json_records(model):
    res = run_bench(model, "-p", "8", "-n", "4", "-pg", "4,2", "-d", "0,3", "-dg", "0", "-r", "2", "-t", "1",
                    "-o", "json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_json_has_llama_bench_fields_for_every_test(json_records, model):
    assert [r["test"] for r in json_records] == ["pp8", "tg4", "pp4+tg2",
                                                 "pp8 @ d3", "tg4 @ d3", "pp4+tg2 @ d3"]
    for r in json_records:
        assert set(LLAMA_BENCH_FIELDS) <= set(r)
        assert r["model_filename"] == model and r["n_threads"] == 1 and r["backends"] == "CPU"
        assert r["model_size"] > 0 and r["model_n_params"] > 0 and r["model_type"].startswith("clover-moe ")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"])
        assert len(r["samples_ns"]) == len(r["samples_ts"]) == 2 and min(r["samples_ns"]) > 0
        n_tokens = r["n_prompt"] + r["n_gen"]
        assert r["samples_ts"] == pytest.approx([n_tokens * 1e9 / ns for ns in r["samples_ns"]])
        assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]))
        assert r["avg_ns"] == round(statistics.fmean(r["samples_ns"]))
    shape = [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in json_records[:3]]
    assert shape == [(8, 0, 0), (0, 4, 0), (4, 2, 0)]
    assert {r["n_depth"] for r in json_records[3:]} == {3}


def test_markdown_table_and_footer(model):
    res = run_bench(model, "-p", "8", "-n", "4", "-dg", "0", "-r", "2", "-t", "1,2", "--backend", "numpy")
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "size", "params", "backend", "threads", "test", "t/s"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:6]]
    assert [(r[4], r[5]) for r in rows] == [("1", "pp8"), ("1", "tg4"), ("2", "pp8"), ("2", "tg4")]
    for r in rows:
        assert r[1].endswith(" GiB") and r[3] == "CPU (numpy)"
        assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", r[6])
    assert re.fullmatch(r"build: clover \S+ \(\S+\)", lines[-2])
    assert lines[-1].startswith("cpu: ")


def test_csv_and_jsonl(model):
    res = run_bench(model, "-p", "8", "-n", "0", "-dg", "0", "-r", "1", "-t", "1", "-o", "csv", "--no-warmup")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert len(rows) == 1 and set(LLAMA_BENCH_FIELDS) <= set(rows[0]) and rows[0]["n_prompt"] == "8"
    res = run_bench(model, "-p", "8,16", "-n", "0", "-dg", "0", "-r", "1", "-t", "1", "-o", "jsonl")
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["n_prompt"] for r in recs] == [8, 16]


def test_user_errors_are_clover_errors(model):
    assert isinstance(run_bench(model, "-o", "xml").exception, CloverError)
    assert isinstance(run_bench(model, "-p", "4-1").exception, CloverError)
    assert isinstance(run_bench("/nonexistent/model.gguf", "-dg", "0").exception, CloverError)
    assert isinstance(run_bench(model, "-p", "0", "-n", "0", "-dg", "0").exception, CloverError)
    too_long = run_bench(model, "-p", "100000", "-n", "0", "-dg", "0", "-r", "1")  # past the context
    assert isinstance(too_long.exception, CloverError)


def test_diffusion_test_reports_tokens_per_forward_and_passes(model):
    res = run_bench(model, "-p", "0", "-n", "0", "-dg", "8", "--block-length", "4", "-r", "1", "-t", "1",
                    "-o", "json")
    assert res.exit_code == 0, res.output
    (rec,) = json.loads(res.stdout)
    assert rec["test"] == "dg8" and rec["n_gen"] == 8 and rec["block_length"] == 4
    assert rec["tokens_per_forward"] > 0 and rec["passes_per_block"] >= 1
    assert rec["avg_steps_per_s"] > 0 and rec["diffusion_steps"] >= 2


def test_reveal_k_fixes_the_tokens_per_pass(model):
    """`--reveal-k K`: exactly K positions of a 32-token block per pass (the last pass takes what is
    left), so passes per block and tokens per pass do not depend on the model's confidence."""
    res = run_bench(model, "-p", "0", "-n", "0", "-dg", "32", "-r", "1", "-t", "1", "--block-length", "32",
                    "--reveal-k", "1,4,8", "-o", "json")
    assert res.exit_code == 0, res.output
    recs = json.loads(res.stdout)
    assert [r["reveal_k"] for r in recs] == [1, 4, 8]
    for r in recs:
        assert r["test"] == "dg32" and r["passes_per_block"] == pytest.approx(32 / r["reveal_k"]), r
    md = run_bench(model, "-p", "0", "-n", "0", "-dg", "8", "-r", "1", "-t", "1", "--reveal-k", "2,4")
    assert md.exit_code == 0 and "reveal k" in md.stdout


@pytest.mark.parametrize("fmt", ["md", "json", "jsonl", "csv"])
def test_each_row_is_written_when_its_test_ends(model, fmt):
    """As llama-bench: a test's row goes out as soon as it is measured, so a run that fails at its
    second test (longer than the context) has already written the first, and the table or JSON
    array it began is closed."""
    res = run_bench(model, "-p", "8,100000", "-n", "0", "-dg", "0", "-r", "1", "-t", "1", "--no-warmup", "-o", fmt)
    assert isinstance(res.exception, CloverError) and "context" in str(res.exception)
    out = res.stdout
    if fmt == "md":
        lines = out.strip().splitlines()
        assert [c.strip() for c in lines[0].strip("|").split("|")][-2:] == ["test", "t/s"]
        assert len(lines) == 6 and "pp8" in lines[2] and lines[-2].startswith("build: clover")
    elif fmt == "json":
        assert [r["test"] for r in json.loads(out)] == ["pp8"]
    elif fmt == "jsonl":
        assert [json.loads(line)["test"] for line in out.splitlines()] == ["pp8"]
    else:
        assert [r["test"] for r in csv.DictReader(io.StringIO(out))] == ["pp8"]


def test_rows_stream_in_test_order_as_they_end():
    """The runtime hands each result over before the next test starts (`run_tests(on_result=)`)."""
    from clover_runtime.bench import BenchConfig, make_tests, run_tests
    from clover_runtime.loader import load_model

    events = []
    with load_model(tiny_model_path("Q8_0"), n_threads=1) as m:
        run_tests(m, make_tests([4], [2], [], [], [0]), BenchConfig(threads=1, backend="numba"), repetitions=1,
                  warmup=False, on_progress=lambda t, i, n: events.append(("run", t.name, i)),
                  on_result=lambda r: events.append(("row", r.test.name, len(r.samples_ns))))
    assert events == [("run", "pp4", 0), ("run", "pp4", 1), ("row", "pp4", 1),
                      ("run", "tg2", 0), ("run", "tg2", 1), ("row", "tg2", 1)]
