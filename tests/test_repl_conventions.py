"""The chat of `clover run` as a llama.cpp or Ollama user expects it (issue 17, item 9): line editing
and a history kept across sessions, Ctrl-C that clears the line, /set think|nothink and
--reasoning-budget, /set that checks values, /show params that lists what /set takes, and a --visual
mode that leaves the whole reply on screen. Driven in a pseudo-terminal through the real entry point."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from serve_helpers import fixed_reply_model
from synth_models import tiny_model_path
from terminal_helpers import COLS, screen, spawn_run, terminal_env


@pytest.fixture(scope="module")
def model() -> str:
    return str(tiny_model_path("Q8_0"))


def _prompt(child: pexpect.spawn) -> None:
    child.expect(">>> ")


def test_set_validates_and_show_params_lists_what_set_takes(model: str, tmp_path: Path) -> None:
    child = spawn_run([model, "-n", "8", "--no-think", "--temp", "0"], tmp_path)
    try:
        _prompt(child)
        for line, answer in (("/set threshold 1.5", "bad value for threshold: 1.5 is not a number above 0, at most 1"),
                             ("/set block_length 0", "bad value for block_length: 0 is not a whole number, 1 or more"),
                             ("/set max_tokens 0", "bad value for max_tokens: 0 is not a whole number, 1 or more"),
                             ("/set top_p abc", "bad value for top_p: 'abc' is not a number above 0, at most 1"),
                             ("/set decode fast", "bad value for decode: fast is not auto, diffusion or ar"),
                             ("/set threshold", "/set threshold needs a value"),
                             ("/set frobs 3", "unknown parameter 'frobs'"),
                             ("/set threshold 0.75", "Set parameter 'threshold' to '0.75'"),
                             ("/set parameter num_predict 5", "Set parameter 'max_tokens' to '5'"),
                             ("/set nothink", "Set 'nothink' mode."),
                             ("/[/]x[bold]", "unknown command /[/]x[bold] (/help lists them)")):  # not markup
            child.sendline(line)
            child.expect_exact(answer)
            _prompt(child)
        child.sendline("/show params")
        _prompt(child)
        shown = dict(re.findall(r"^  (\w+)\s+(.+?)\s*$", child.before, re.M))
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    from clover_cli.repl_params import PARAMS

    assert list(shown) == [*PARAMS, "think"]  # every row can be set, and nothing else is listed
    assert shown["threshold"] == "0.75" and shown["max_tokens"] == "5" and shown["think"] == "off"
    assert shown["block_length"] == "from the model file"


def test_ctrl_c_clears_the_line_and_history_outlives_the_session(model: str, tmp_path: Path) -> None:
    child = spawn_run([model, "-n", "4", "--no-think", "--temp", "0"], tmp_path)
    try:
        _prompt(child)
        child.send("half a thought")
        child.expect_exact("half a thought")  # echoed, so the line editor holds the keys before Ctrl-C
        child.sendintr()  # clears the line; does not leave
        try:
            child.expect(">>> ", timeout=60)
        except pexpect.TIMEOUT:  # seen under a loaded parallel run: say what the child's SIGINT state was
            status = Path(f"/proc/{child.pid}/status")
            lines = status.read_text().splitlines() if status.exists() else []
            pytest.fail(f"no prompt after Ctrl-C; {[ln for ln in lines if ln.startswith(('Sig', 'Shd', 'Threads'))]}")
        child.sendintr()  # at an empty prompt: says how to leave
        child.expect_exact("Use Ctrl-D or /bye to exit.")
        _prompt(child)
        child.sendline("/set temperature 0.25")
        child.expect_exact("Set parameter 'temperature' to '0.25'")
        _prompt(child)
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "Use Ctrl-D" not in child.before
    history = tmp_path / "data" / "clover" / "history"
    assert history.read_text(encoding="utf-8").splitlines()[-2:] == ["/set temperature 0.25", "/bye"]

    child = spawn_run([model, "-n", "4", "--no-think", "--temp", "0"], tmp_path)  # a new session
    try:
        _prompt(child)
        child.send("\x1b[A\x1b[A")  # arrow up twice: the line before /bye, from the last session
        child.send("\r")
        child.expect_exact("Set parameter 'temperature' to '0.25'")
        _prompt(child)
        child.send("set temperature 0.3")
        child.send("\x01/")  # Ctrl-A: to the start of the line, to add the slash forgotten there
        child.send("\x055\r")  # Ctrl-E: back to the end, to finish the number
        child.expect_exact("Set parameter 'temperature' to '0.35'")
        _prompt(child)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_reasoning_budget_and_set_think(model: str, tmp_path: Path) -> None:
    """--reasoning-budget 0 is --no-think (llama.cpp's meaning); /set think turns reasoning back on."""
    base = [model, "Hello there", "-n", "6", "--decode", "ar", "--json", "--temp", "0"]
    env = terminal_env(tmp_path)

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "clover_cli", "run", *base, *extra], capture_output=True,
                              text=True, env=env, timeout=180, stdin=subprocess.DEVNULL)

    thinking, budget0, nothink = run(), run("--reasoning-budget", "0"), run("--no-think")
    assert json.loads(thinking.stdout)["reasoning"]  # the premise: this model reasons first
    assert json.loads(budget0.stdout) ["content"] == json.loads(nothink.stdout)["content"]
    assert json.loads(budget0.stdout)["reasoning"] is None
    bad = run("--reasoning-budget", "100")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --reasoning-budget 100: clover takes -1")

    child = spawn_run([model, "-n", "6", "--decode", "ar", "--temp", "0", "--reasoning-budget", "0"], tmp_path)
    try:
        _prompt(child)
        child.sendline("Hello there")
        child.expect("tokens per forward")
        _prompt(child)
        assert "thinking…" not in child.before
        child.sendline("/set think")
        child.expect_exact("Set 'think' mode.")
        _prompt(child)
        _ask_then_leave(child, "Hello there", before_stats="thinking…")
    finally:
        child.close()


def _ask_then_leave(child: pexpect.spawn, line: str, *, before_stats: str | None = None) -> None:
    """Send one message, wait for its stats line (and `before_stats` ahead of it), then /bye."""
    child.sendline(line)
    if before_stats is not None:
        child.expect_exact(before_stats)
    child.expect("tokens per forward")
    _prompt(child)
    child.sendline("/bye")
    child.expect(pexpect.EOF)


def test_visual_mode_leaves_the_whole_reply_on_screen(tmp_path: Path) -> None:
    """A reply of several blocks and several lines: once it is done, the terminal (emulated with
    pyte) shows all of it, as the same reply without --visual does, not only the last block."""
    model = str(fixed_reply_model("tick tock, ", endless=True))
    args = [model, "-n", "120", "--no-think", "--decode", "diffusion", "--temp", "0"]
    answer = subprocess.run([sys.executable, "-m", "clover_cli", "run", *args, "Count the time", "--json"],
                            capture_output=True, text=True, env=terminal_env(tmp_path), timeout=180)
    reply = json.loads(answer.stdout)["content"]
    assert len(reply) > 2 * COLS, reply  # the premise: it wraps over several lines

    child = spawn_run([*args, "--visual"], tmp_path)
    log = io.StringIO()
    child.logfile_read = log
    try:
        _prompt(child)
        _ask_then_leave(child, "Count the time")
    finally:
        child.close()
    raw = log.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", raw)
    assert len(re.findall(r"block \d+\s+pass \d+\s+masked \d+", plain)) > 3, "no live block was drawn"
    text = "".join(screen(raw))
    start = text.index("Count the time") + len("Count the time")
    shown = text[start:text.index("[ prompt")]
    assert " ".join(shown.split()) == " ".join(reply.split())
