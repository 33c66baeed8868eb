"""The first ten minutes on the command line (issue 39): pasted llama.cpp command lines run, usage
errors exit 2, `demo` is named wherever a newcomer looks, and the smaller fixes of item 7. Every test
runs the real `clover` entry point in a subprocess against a real synthetic model or the demo."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import serve_process
from synth_models import tiny_model_path


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOVER_", "HF_"))}
    env.update(HOME=str(home), NO_COLOR="1", PYTHONIOENCODING="utf-8", COLUMNS="120",
               HF_HUB_CACHE=str(home / "hub"), XDG_DATA_HOME=str(home / "data"))
    env.update(extra)
    return env


def _clover(*args: str, home: Path, stdin: str | None = None, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], capture_output=True, text=True,
                          encoding="utf-8", env=_env(home, **extra), timeout=300, input=stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None)


@pytest.fixture(scope="module")
def model() -> str:
    return str(tiny_model_path("Q8_0"))


# -- item 5: llama.cpp command lines run -----------------------------------------------------------------

PASTED = ["--jinja", "-fa", "on", "-b", "512", "-ub", "128", "--mlock", "--no-mmap", "-cnv"]  # --no-mmap: a real flag


def test_a_pasted_llama_cli_line_warns_once_per_flag_and_answers_the_same(model: str, tmp_path: Path) -> None:
    base = ["run", model, "hello", "-n", "3", "--decode", "ar", "--no-think", "--temp", "0"]
    plain = _clover(*base, home=tmp_path)
    pasted = _clover(*base, *PASTED, home=tmp_path)
    assert plain.returncode == pasted.returncode == 0, pasted.stderr
    assert pasted.stdout == plain.stdout and plain.stdout.strip()
    warnings = [line for line in pasted.stderr.splitlines() if line.startswith("warning: clover run ignores ")]
    assert [w.split(":")[1].removeprefix(" clover run ignores ") for w in warnings] == [
        "--jinja", "-fa on", "-b 512", "-ub 128", "--mlock", "-cnv"]
    assert "Traceback" not in pasted.stderr


def test_a_pasted_llama_server_line_serves(model: str, tmp_path: Path) -> None:
    args = ["--jinja", "--flash-attn", "auto", "-cb", "--metrics", "--batch-size", "2048", "-c", "512"]
    with serve_process(Path(model), *args, home=tmp_path) as (_proc, port):
        res = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                         json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] > 0
    log = (tmp_path / "serve.log").read_text(encoding="utf-8")
    for shown in ("--jinja", "--flash-attn auto", "-cb", "--metrics", "--batch-size 2048"):
        assert f"warning: clover serve ignores {shown}: " in log, log


def test_a_flag_that_would_change_something_still_stops(model: str, tmp_path: Path) -> None:
    """Only flags that change nothing are passed over: --no-jinja asks for something clover lacks."""
    res = _clover("run", model, "hi", "--no-jinja", home=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: clover run has no --no-jinja yet: ")


@pytest.mark.parametrize("args,first", [
    (["run", "{model}", "hi", "--decode", "foo"], "error: --decode must be auto, diffusion or ar, not 'foo'"),
    (["bench", "{model}", "-o", "sql"], "error: -o must be md, csv, json or jsonl, not 'sql'"),
    (["run", "{model}", "hi", "-p", "there"], "error: the prompt is given twice (argument and -p)"),
    (["run", "{model}", "hi", "-t", "0"], "error: invalid value for '-t'"),
    (["run", "{model}", "hi", "-t", "-3"], "error: invalid value for '-t'"),
    (["serve", "{model}", "-t", "0"], "error: invalid value for '-t'"),
    (["bench", "{model}", "-t", "0"], "error: -t: threads must be at least 1"),
    (["bench", "{model}", "-p", "1-x"], "error: invalid number or range '1-x'"),
    (["serve", "{model}", "--decode", "fast"], "error: --decode must be auto, diffusion or ar"),
    (["inspect", "{model}", "-ctk", "q3"], "error: unknown --cache-type 'q3'"),
])
def test_every_usage_error_exits_2(args: list[str], first: str, model: str, tmp_path: Path) -> None:
    res = _clover(*(a.format(model=model) for a in args), home=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[0].startswith(first), res.stderr
    assert "Traceback" not in res.stderr and "compiling" not in res.stderr  # refused before loading


# -- item 3: demo everywhere a newcomer looks ----------------------------------------------------------

def test_the_guide_starts_with_demo(tmp_path: Path) -> None:
    res = _clover(home=tmp_path)
    assert res.returncode == 0
    first = [line.strip() for line in res.stdout.splitlines() if line.startswith("  clover ")][0]
    assert first.startswith("clover run demo ")


@pytest.mark.parametrize("prompt", ["What is 2 + 2?", "hello", 'say "hi"'])
def test_a_prompt_given_as_the_model_says_what_was_meant(prompt: str, tmp_path: Path) -> None:
    res = _clover("run", prompt, home=tmp_path)
    assert res.returncode == 2
    shown = '"' + prompt.replace('"', '\\"') + '"'
    assert res.stderr.splitlines() == [f"error: {shown} is not a model; did you mean: clover run demo {shown}"]


def test_a_model_name_is_not_taken_for_a_prompt(model: str, tmp_path: Path) -> None:
    """demo, a file and owner/repo are models: only the network or the cache can refuse them."""
    res = _clover("run", "acme/Nothing-GGUF", "hi", home=tmp_path, HF_HUB_OFFLINE="1")
    assert res.returncode == 1 and "is not a model" not in res.stderr
    res = _clover("run", model, "hi", "-n", "1", "--no-think", home=tmp_path)
    assert res.returncode == 0, res.stderr


def test_offline_without_the_model_points_to_demo(tmp_path: Path) -> None:
    offline = _clover("run", "-p", "hi", home=tmp_path, HF_HUB_OFFLINE="1")
    assert offline.returncode == 1
    assert offline.stderr.startswith("error: required file is not available in cache (offline mode)")
    assert offline.stderr.splitlines()[-1].endswith('or try the model that ships with clover: '
                                                    'clover run demo "What is 48 + 36?"')
    with socket.socket() as sock:  # a loopback port nobody listens on: the Hub is unreachable
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cut = _clover("run", "-p", "hi", home=tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert cut.returncode == 1 and cut.stderr.startswith("error: cannot reach the Hub")
    assert "clover run demo" in cut.stderr.splitlines()[-1]


def test_list_rm_doctor_and_bench_name_demo(tmp_path: Path) -> None:
    from clover_runtime.demo import demo_path

    from clover_cli.fit_table import human_bytes

    listing = _clover("list", home=tmp_path)
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[-1].split() == ["demo", "(built", "in)",
                                                         *human_bytes(demo_path().stat().st_size).split(),
                                                         str(demo_path())]
    assert json.loads(_clover("list", "--json", home=tmp_path).stdout) == []  # scripts see the cache only
    rm = _clover("rm", "demo", "-y", home=tmp_path)
    assert rm.returncode == 1 and demo_path().exists()
    assert rm.stderr.splitlines()[0] == "error: demo is built in (it ships with clover) and cannot be removed"
    doctor = _clover("doctor", home=tmp_path)
    assert doctor.returncode == 0 and 'clover run demo "What is 48 + 36?"' in doctor.stdout
    bench = _clover("bench", home=tmp_path)
    assert bench.returncode == 2 and bench.stderr.splitlines() == [
        "error: no model given", "hint: try the model that ships with clover: clover bench demo"]


# -- item 7: the smaller fixes -------------------------------------------------------------------------

def test_inspect_fit_past_the_context_prints_only_the_error(model: str, tmp_path: Path) -> None:
    res = _clover("inspect", model, "-c", "8192", "--fit", home=tmp_path)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines() == [f"error: {Path(model).name}: -c 8192 is larger than the model's "
                                       "context length 4096"]


def test_inspect_template_prints_only_the_template(tmp_path: Path) -> None:
    from clover_runtime.demo import demo_path
    from clover_runtime.gguf_file import open_gguf

    with open_gguf(demo_path()) as f:
        template = f.metadata["tokenizer.chat_template"]
    res = _clover("inspect", "demo", "--template", home=tmp_path)
    assert res.returncode == 0 and res.stdout == template + "\n" and res.stderr == ""


def _repl(model: str, home: Path) -> Any:
    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "clover_cli", "run", model, "-n", "4", "--no-think", "-c", "512",
                                           "-sys", "You are terse."],
                          env={**_env(home), "TERM": "xterm"}, encoding="utf-8", codec_errors="replace",
                          timeout=180, dimensions=(40, 120))
    child.expect(">>> ")
    return child


def test_repl_show_info_and_system_print_what_they_name(model: str, tmp_path: Path) -> None:
    child = _repl(model, tmp_path)
    try:
        child.sendline("/show info")
        child.expect(">>> ")
        info = child.before
        child.sendline("/show system")
        child.expect(">>> ")
        system = child.before
        child.sendline("/bye")
    finally:
        child.close()
    assert "clover ·" not in info and "decode" not in info  # not the banner
    assert "architecture" in info and "clover-moe" in info and "512 tokens of context" in info
    assert system.splitlines()[1:] == ["You are terse."], system


def test_repl_load_of_a_model_file_is_one_clear_line(model: str, tmp_path: Path) -> None:
    child = _repl(model, tmp_path)
    try:
        child.sendline(f"/load {model}")
        child.expect(">>> ")
        binary = child.before
        child.sendline(f"/load {tmp_path / 'missing.json'}")
        child.expect(">>> ")
        missing = child.before
        child.sendline("/show system")  # the chat goes on
        child.expect(">>> ")
        after = child.before
        child.sendline("/bye")
    finally:
        child.close()
    assert binary.splitlines()[1:] == [f"cannot load {model}: it is not a conversation saved with /save (to chat "
                                       "with another model, start clover run with it)"], binary
    assert "codec" not in binary and "utf-8" not in binary
    assert missing.splitlines()[1:] == [f"cannot load {tmp_path / 'missing.json'}: No such file or directory"]
    assert "You are terse." in after


def test_the_compile_message_shows_once_per_process_with_its_seconds(monkeypatch, capsys, tmp_path: Path) -> None:
    """A terminal sees a spinner with the seconds spent; a second quant type in the same process
    (bench over two files) compiles its few new kernels without saying so again."""
    from clover_runtime.kernel_warmup import needs_compile
    from clover_runtime.loader import load_model

    from clover_cli import model_setup

    # the "compiled" markers in a folder of this test's own, so both models need a compile here whatever
    # other tests did (kernels this process already compiled stay in memory; new ones may cache there)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws the spinner as on a terminal
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    monkeypatch.setitem(model_setup._compiled_here, "said", False)
    with load_model(tiny_model_path("Q8_0"), backend="numba") as first, \
            load_model(tiny_model_path("Q4_K"), backend="numba") as second:
        assert needs_compile(first) and needs_compile(second)
        model_setup.compile_first_run(first)
        err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", capsys.readouterr().err)  # the terminal's cursor moves
        assert re.search(r"compiling kernels \(first run only\)… +\d+ s", err), err
        model_setup.compile_first_run(second)
        assert capsys.readouterr().err == "" and not needs_compile(second)
