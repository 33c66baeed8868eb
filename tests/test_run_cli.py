"""`clover run`: one-shot answers for scripts and the interactive chat driven in a pseudo-terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from decoding_models import successor_model_path
from synth_models import tiny_model_path


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "COLUMNS": "120"}
    env.pop("CLOVER_DEBUG", None)
    return env


def _run(args: list[str], tmp_path: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", "run", *args], input=stdin if stdin is not None else "",
                          capture_output=True, text=True, env=_env(tmp_path), timeout=180)


@pytest.fixture(scope="module")
def model() -> str:
    return str(tiny_model_path("Q8_0"))


def test_one_shot_argument_prints_only_the_answer(model: str, tmp_path: Path) -> None:
    res = _run([model, "Hello there", "-n", "12", "--decode", "ar", "--no-think"], tmp_path)
    assert res.returncode == 0, res.stderr
    ref = _run([model, "Hello there", "-n", "12", "--decode", "ar", "--no-think"], tmp_path)
    assert res.stdout == ref.stdout and res.stdout.strip()
    assert "clover ·" not in res.stdout and "t/s" not in res.stdout


def test_one_shot_from_file_and_pipe_agree(model: str, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Tell me a story", encoding="utf-8")
    via_file = _run([model, "-f", str(prompt), "-n", "10", "--no-think"], tmp_path)
    via_pipe = _run([model, "-n", "10", "--no-think"], tmp_path, stdin="Tell me a story\n")
    via_arg = _run([model, "-p", "Tell me a story", "-n", "10", "--no-think"], tmp_path)
    assert via_file.returncode == via_pipe.returncode == via_arg.returncode == 0, via_pipe.stderr
    assert via_file.stdout == via_pipe.stdout == via_arg.stdout


def test_json_output_has_answer_and_stats(tmp_path: Path) -> None:
    path, _ = successor_model_path()
    res = _run([str(path), "hi", "-n", "40", "--json", "--decode", "diffusion"], tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["decode"] == "diffusion" and doc["usage"]["completion_tokens"] > 0
    assert doc["timings"]["tokens_per_forward"] > 0 and doc["timings"]["passes"] >= 1


def test_no_prompt_without_a_terminal_is_a_clear_error(model: str, tmp_path: Path) -> None:
    res = _run([model], tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: no prompt")  # a usage error


def test_missing_model_is_one_line(tmp_path: Path) -> None:
    res = _run([str(tmp_path / "nope.gguf"), "hi"], tmp_path)
    assert res.returncode == 1 and res.stderr.strip() == f"error: model file not found: {tmp_path / 'nope.gguf'}"


def test_repl_session_in_a_pseudo_terminal(model: str, tmp_path: Path) -> None:
    # The exact kernels: the interrupt below needs this random model's long greedy reply, which is
    # the float kernels' (the integer kernels' rounding ends it after ~20 tokens).
    env = {**_env(tmp_path), "CLOVER_EXACT_KERNELS": "1"}
    child = pexpect.spawn(sys.executable, ["-m", "clover_cli", "run", model, "-n", "300", "--no-think",
                                             "--no-verify"],  # random weights: checked blocks are cut
                          env=env, encoding="utf-8", timeout=120, dimensions=(40, 120))
    try:
        child.expect("clover ·")
        child.expect(">>> ")
        child.sendline("Hello")
        child.expect(r"\[ prompt .* t/s \| generation .* t/s \| tokens per forward")
        child.expect(">>> ")
        child.sendline("/set temperature 0.7")
        child.expect("Set parameter 'temperature' to '0.7'")
        child.expect(">>> ")
        child.sendline("And a second question?")
        child.expect("tokens per forward")
        child.expect(">>> ")
        saved = tmp_path / "chat.json"
        child.sendline(f"/save {saved}")
        child.expect("Saved 4 messages")
        child.expect(">>> ")
        child.sendline("/clear")
        child.expect("Chat history cleared.")
        child.expect(">>> ")
        child.sendline(f"/load {saved}")
        child.expect("Loaded 4 messages.")
        child.expect(">>> ")
        child.sendline("/load")
        child.expect("usage: /load FILE")
        child.expect(">>> ")
        child.sendline("/clear")
        child.expect(">>> ")
        child.sendline("/set temperature 0")  # greedy again: a long, reproducible reply to interrupt
        child.expect(">>> ")
        child.sendline("Write a long answer")
        child.expect("Write a long answer\r\n")
        child.expect(r"\S")  # the reply has started
        child.sendintr()
        child.expect(r"\[interrupted\]")
        child.expect(">>> ")
        child.sendline("Another question")
        child.expect("tokens per forward")
        child.expect(">>> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    doc = json.loads(saved.read_text(encoding="utf-8"))
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "user", "assistant"]
    assert doc["messages"][0]["content"] == "Hello"
    assert child.exitstatus == 0


def test_a_reply_that_is_all_reasoning_says_so(model: str, tmp_path: Path) -> None:
    """Thinking on (the template's default) and a budget spent inside <think>: stdout has no answer,
    so stderr says why instead of leaving the user with an empty line."""
    res = _run([model, "Hello there", "-n", "6", "--decode", "ar", "--json"], tmp_path)
    reply = json.loads(res.stdout)
    assert reply["reasoning"] and not reply["content"]  # the premise: six tokens of reasoning only
    res = _run([model, "Hello there", "-n", "6", "--decode", "ar"], tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == ""
    assert "the reply was all reasoning and never reached an answer" in res.stderr


def test_visual_mode_shows_the_block_resolving(model: str, tmp_path: Path) -> None:
    """--visual draws the current block (pass number, masked count) while passes resolve it."""
    import re

    child = pexpect.spawn(sys.executable, ["-m", "clover_cli", "run", model, "--visual", "-n", "64", "--no-think",
                                           "--decode", "diffusion", "--no-verify"],  # random weights
                          env=_env(tmp_path), encoding="utf-8", codec_errors="replace", timeout=120,
                          dimensions=(40, 120))
    try:
        child.expect(">>> ")
        child.sendline("Hello")
        child.expect("tokens per forward")
        frames = re.findall(r"block (\d+)\s+pass (\d+)\s+masked (\d+)", re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "",
                                                                              child.before))
        child.expect(">>> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert frames, "no live block was drawn"
    assert all(0 <= int(masked) < 32 for _, _, masked in frames)
