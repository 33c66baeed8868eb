"""Conventions a llama.cpp or Ollama user expects of the `clover` command line (issue 17, items 8-11):
llama.cpp flags clover lacks, global flags after the subcommand, one-line usage errors, help texts,
the guide, one meaning of -c, and the smaller fixes. Every test runs the real `clover` entry point."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from synth_models import tiny_model_path


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "COLUMNS": "120",
           "HF_HUB_CACHE": str(home / "hub"), "XDG_DATA_HOME": str(home / "data")}
    for var in ("CLOVER_DEBUG", "CLOVER_HOME", "CLOVER_CACHE", "HF_HOME"):
        env.pop(var, None)
    env.update(extra)
    return env


def _clover(*args: str, home: Path, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], capture_output=True, text=True,
                          encoding="utf-8", env=_env(home, **extra), timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def model() -> str:
    return str(tiny_model_path("Q8_0"))


# -- item 10: flags ---------------------------------------------------------------------------------

@pytest.mark.parametrize("command,args,flag", [
    ("run", ["-ts", "3,1", "hello"], "-ts"),
    ("run", ["-i"], "-i"),
    ("run", ["-ctk", "q8_0"], "-ctk"),
    ("run", ["--no-jinja", "-p", "hi"], "--no-jinja"),
    ("serve", ["-ot", "exps=CPU", "-c", "4096"], "-ot"),
    ("serve", ["--chat-template", "chatml"], "--chat-template"),
    ("inspect", ["--jinja"], "--jinja"),
    ("serve", ["--override-tensor=exps=CPU"], "--override-tensor"),
    ("inspect", ["-ngl", "99"], "-ngl"),
    ("bench", ["-sm", "row"], "-sm"),
])
def test_llama_cpp_flags_clover_lacks_get_one_line(command: str, args: list[str], flag: str, tmp_path: Path) -> None:
    res = _clover(command, *args, home=tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: clover {command} has no {flag} yet: "), res.stderr
    assert len(lines) == 2 and lines[1] == f"hint: clover {command} --help lists its options"
    assert "Invalid value" not in res.stderr and res.stdout == ""


def test_a_flag_the_command_has_is_not_refused(model: str, tmp_path: Path) -> None:
    """inspect has -ctk (to estimate llama.cpp's cache sizes): only flags a command lacks are refused."""
    res = _clover("inspect", model, "-ctk", "q8_0", "--json", home=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["memory"]["cache_type"] == "q8_0"


@pytest.mark.parametrize("args,expect", [
    (["run", "-n", "gl"], "error: invalid value for '-n'"),
    (["run", "--bogus"], "error: no such option: --bogus"),
    (["serve", "-c", "-5"], "error: invalid value for '-c'"),
    (["run", "--threshold", "1.5"], "error: invalid value for '--threshold'"),
    (["run", "--block-length", "0"], "error: invalid value for '--block-length'"),
    (["inspect"], "error: missing argument 'MODEL'"),
    (["frobnicate"], "error: no such command 'frobnicate'"),
])
def test_usage_errors_are_one_line(args: list[str], expect: str, tmp_path: Path) -> None:
    res = _clover(*args, home=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith(expect), res.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: clover") and lines[1].endswith("--help lists the options")
    assert "Usage:" not in res.stderr and "╭" not in res.stderr


def test_verbose_works_after_the_subcommand(model: str, tmp_path: Path) -> None:
    """-v before or after `run` shows the banner (on stderr) in a one-shot answer; without it, none."""
    base = ["-n", "2", "--decode", "ar", "--no-think", "--temp", "0"]
    after = _clover("run", model, "hi", *base, "-v", home=tmp_path)
    before = _clover("-v", "run", model, "hi", *base, home=tmp_path)
    quiet = _clover("run", model, "hi", *base, home=tmp_path)
    assert after.returncode == before.returncode == quiet.returncode == 0, after.stderr
    assert "clover ·" in after.stderr and "clover ·" in before.stderr and "clover ·" not in quiet.stderr
    assert after.stdout == before.stdout == quiet.stdout


def test_a_prompt_given_twice_is_an_error(model: str, tmp_path: Path) -> None:
    res = _clover("run", model, "hello", "-p", "there", home=tmp_path)
    assert res.returncode == 2  # a usage error, as click's own
    assert res.stderr.splitlines()[0] == "error: the prompt is given twice (argument and -p)"
    res = _clover("run", "-m", model, "extra.gguf", "hello", home=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: the model is given twice")


def test_help_texts_say_what_the_commands_take(tmp_path: Path) -> None:
    serve = _clover("serve", "--help", home=tmp_path).stdout
    inspect = _clover("inspect", "--help", home=tmp_path).stdout
    flat = " ".join(serve.split())
    assert "hf://" not in flat and "hf.co/owner/repo[:QUANT]" in flat
    flat = " ".join(inspect.split())
    assert "Path to a .gguf file" not in flat and "owner/repo[:QUANT]" in flat


def test_the_guide_lists_every_command(tmp_path: Path) -> None:
    from typer.main import get_command

    from clover_cli.app import app

    res = _clover(home=tmp_path)
    assert res.returncode == 0
    for name in get_command(app).commands:  # type: ignore[attr-defined]
        assert re.search(rf"^  clover {re.escape(name)}\b", res.stdout, re.M), f"the guide lacks clover {name}"


# -- item 11: the smaller fixes ------------------------------------------------------------------------

def test_doctor_with_c_0_checks_the_largest_context_that_fits(tmp_path: Path) -> None:
    res = _clover("doctor", "-c", "0", "--json", home=tmp_path)
    assert res.returncode == 0, res.stderr
    fit = json.loads(res.stdout)["fit"]
    assert fit["n_ctx"] == max(fit["largest_context"], 4096)  # as `clover run -c 0` would choose
    text = _clover("doctor", "-c", "0", home=tmp_path)  # free RAM moves between runs: compare within one
    assert text.returncode == 0 and "internal error" not in text.stderr, text.stderr
    checked = int(re.search(r"at -c (\d+)", text.stdout)[1])
    found = re.search(r"largest context\s+(?:([\d,]+) tokens|none)", text.stdout)
    largest = int(found[1].replace(",", "")) if found[1] else 0
    assert checked == max(largest, 4096)


def test_the_verdict_names_its_margin(model: str) -> None:
    from clover_runtime.gguf_file import open_gguf
    from clover_runtime.memory_fit import GiB, SystemMemory, assess, estimate
    from clover_runtime.model_config import describe_tensors

    with open_gguf(model) as f:
        cfg = describe_tensors(f.metadata, f.tensors)
    est = estimate(cfg, 10 * GiB, 4096)
    just_short = assess(est, SystemMemory(64 * GiB, est.total + GiB // 2))  # more than it needs, less the margin
    assert just_short.verdict == "fits with paging"
    assert "+ 1.0 GiB margin but" in just_short.message
    roomy = assess(est, SystemMemory(64 * GiB, est.total + 2 * GiB), margin=512 << 20)
    assert roomy.verdict == "fits" and "+ 512.0 MiB margin of" in roomy.message


def test_sizes_keep_a_digit_before_the_point(model: str, tmp_path: Path) -> None:
    from clover_runtime.sizes import size_text

    assert [size_text(n) for n in (512, 1536, 3 << 20, 22.3 * (1 << 30))] == [
        "512 bytes", "1.5 KiB", "3.0 MiB", "22.3 GiB"]
    res = _clover("inspect", model, home=tmp_path)
    assert res.returncode == 0, res.stderr
    verdict = next(line for line in res.stdout.splitlines() if "fits: needs" in line)
    assert not re.search(r"(?<![\d.])0\.0 GiB", verdict), verdict
    assert re.search(r"needs \d+\.\d (KiB|MiB) \+ 1\.0 GiB margin", verdict), verdict


def test_pull_from_a_hub_that_never_answers_says_so_and_gives_up(tmp_path: Path) -> None:
    """A loopback server that accepts connections and never answers: `clover pull` says it is
    connecting at once, gives up after HF_HUB_ETAG_TIMEOUT (not 2 × 15 s), and says how to wait longer."""
    from hub_helpers import run_clover

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        started = time.monotonic()
        res = run_clover(endpoint, tmp_path / "cache", "pull", "acme/Slow-GGUF:Q8_0",
                         extra={"HF_HUB_ETAG_TIMEOUT": "2"}, timeout=60)
        took = time.monotonic() - started
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()
    assert accepted, "the client never connected"
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and lines[0] == f"connecting to {endpoint}…"
    assert lines[1] == (f"error: cannot reach the Hub at {endpoint} (no answer within 2 s); "
                        "no cached copy of acme/Slow-GGUF:Q8_0 exists")
    assert "HF_HUB_ETAG_TIMEOUT=60" in lines[2]
    assert took < 15, f"took {took:.1f} s"  # one 2 s wait plus start-up, not two 15 s ones


# -- item 8: one meaning of -c --------------------------------------------------------------------------

def test_every_command_takes_the_same_c() -> None:
    from clover_runtime import memory_fit
    from typer.main import get_command

    from clover_cli.app import app
    from clover_cli.options import DEFAULT_CTX

    assert DEFAULT_CTX == memory_fit.DEFAULT_CTX
    commands = get_command(app).commands  # type: ignore[attr-defined]
    seen = set()
    for name in ("run", "serve", "inspect", "doctor", "pull"):
        option = next(p for p in commands[name].params if "-c" in getattr(p, "opts", ()))
        seen.add((option.default, option.envvar, option.help.split(")")[0]))
    assert len(seen) == 1, seen


@pytest.fixture(scope="module")
def long_model() -> str:
    return str(tiny_model_path("Q8_0", context_length=65536))


def test_the_default_c_is_the_same_in_inspect_doctor_and_run(long_model: str, tmp_path: Path) -> None:
    inspect = _clover("inspect", long_model, "--json", home=tmp_path)
    assert json.loads(inspect.stdout)["memory"]["n_ctx"] == 16384
    doctor = _clover("doctor", "--json", home=tmp_path)
    assert json.loads(doctor.stdout)["fit"]["n_ctx"] == 16384
    run = _clover("run", long_model, "hi", "-v", "-n", "1", "--decode", "ar", "--no-think", home=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "context 16384 ·" in run.stderr


def _start_serve(args: list[str], home: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "clover_cli", "serve", *args, "--port", "0"],
                            env=_env(home), text=True, encoding="utf-8", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise AssertionError(proc.communicate(timeout=30)[1])
    return proc, line.split()[2]


def test_serve_c_is_per_sequence_and_the_banner_says_the_total(long_model: str, tmp_path: Path) -> None:
    import httpx

    proc, url = _start_serve([long_model, "-c", "8192", "-np", "2"], tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            props = client.get("/props").json()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert props["n_ctx_slot"] == 8192 and props["n_ctx"] == 16384 and props["total_slots"] == 2
    assert "context: 8192 tokens per sequence × 2 parallel sequences = 16384 tokens in all (-c × -np)" in err


def test_inspect_fit_checks_what_serve_runs(tmp_path: Path) -> None:
    """The real shape at -c 131072 -np 64: inspect --fit and serve refuse with the same need,
    which is 64 sequences of 131,072 tokens each (not 131,072 shared by 64)."""
    from synth_models import real_shape_sparse_path

    big = str(real_shape_sparse_path(n_layer=4))
    inspect = _clover("inspect", big, "-c", "131072", "-np", "64", "--fit", "--json", home=tmp_path)
    serve = _clover("serve", big, "-c", "131072", "-np", "64", home=tmp_path)
    assert inspect.returncode == 1 and serve.returncode == 1, serve.stderr
    memory = json.loads(inspect.stdout)["memory"]
    assert memory["n_ctx"] == 131072 and memory["n_parallel"] == 64
    assert memory["estimate"]["kv_cache"] == 64 * 131072 * memory["estimate"]["kv_per_token"]
    need = re.compile(r"alone need (\S+ \S+) \+")
    refused = need.search(serve.stderr)
    assert refused and refused.group(1) == need.search(memory["verdict"]["message"]).group(1)


def test_the_fit_counts_the_checkpoints_serve_is_told_to_keep(tmp_path: Path) -> None:
    """--ctx-checkpoints reaches the memory fit (issue 12): serve's refusal table counts the
    checkpoints it was told to keep, not the default."""
    from synth_models import real_shape_sparse_path

    big = str(real_shape_sparse_path(n_layer=4))
    for n in ("3", "0"):
        res = _clover("serve", big, "-np", "64", "-c", "131072", "--ctx-checkpoints", n, home=tmp_path)
        assert res.returncode == 1, res.stderr
        assert ("prompt cache 3 checkpoints/sequence" in res.stderr) == (n == "3"), res.stderr
        assert "prompt cache 8 checkpoints" not in res.stderr


# -- item 11: one default sampling for the CLI and the web page ------------------------------------------

def test_recommended_sampling_reads_the_file_and_falls_back_to_llama_cpp() -> None:
    from clover_runtime.decoding import recommended_sampling

    plain = recommended_sampling({})
    assert (plain.temperature, plain.top_k, plain.top_p, plain.min_p, plain.repetition_penalty) == (
        0.8, 40, 0.95, 0.05, 1.0)  # llama.cpp's defaults (common/common.h)
    given = recommended_sampling({"general.sampling.temp": 0.6, "general.sampling.top_k": 20,
                                  "general.sampling.penalty_repeat": 1.05, "general.sampling.top_p": "x"})
    assert (given.temperature, given.top_k, given.top_p, given.min_p, given.repetition_penalty) == (
        0.6, 20, 0.95, 0.05, 1.05)


def _repl_params(model: str, home: Path) -> dict[str, str]:
    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "clover_cli", "run", model], env=_env(home), encoding="utf-8",
                          timeout=120, dimensions=(40, 120))
    try:
        child.expect(">>> ")
        child.sendline("/show params")
        child.expect(">>> ")
        shown = dict(re.findall(r"^  (\w+)\s+(.+?)\s*$", child.before, re.M))
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    return shown


@pytest.mark.parametrize("sampling,expect", [
    (None, {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}),
    ((("temp", 0.5), ("top_k", 20)), {"temperature": 0.5, "top_k": 20, "top_p": 0.95, "min_p": 0.05}),
])
def test_run_and_the_server_start_from_the_same_sampling(sampling, expect, tmp_path: Path) -> None:
    """`clover run` (its /show params) and the server (/props, what a request without sampling
    fields gets, which the web page now sends by default) agree: the file's values, else llama.cpp's."""
    import httpx

    model = str(tiny_model_path("Q8_0", sampling=sampling))
    shown = _repl_params(model, tmp_path)
    assert {k: float(shown[k]) for k in expect} == expect
    proc, url = _start_serve([model], tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            for _ in range(100):
                props = client.get("/props").json()
                if props["loaded"]:
                    break
                time.sleep(0.3)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    params = props["default_generation_settings"]["params"]
    assert {k: params[k] for k in expect} == expect
