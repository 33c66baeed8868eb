"""`clover run` keeps its prompt state: the REPL prefills only each new message, /save and /load
carry the state, and `--prompt-cache FILE` does the same for one-shot runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
from synth_models import tiny_model_path

STATS = r"\| cached (\d+) \]"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "COLUMNS": "200"}
    env.pop("CLOVER_DEBUG", None)
    return env


def _cached(child: pexpect.spawn) -> int:
    child.expect(STATS)
    n = int(child.match.group(1))
    child.expect(">>> ")
    return n


def test_repl_reuses_state_and_saves_it(tmp_path: Path) -> None:
    model = str(tiny_model_path("Q8_0"))
    other = str(tiny_model_path("F32"))
    saved = tmp_path / "chat.json"
    child = pexpect.spawn(sys.executable, ["-m", "clover_cli", "run", model, "-n", "8", "--no-think", "--decode", "ar"],
                          env=_env(tmp_path), encoding="utf-8", timeout=120, dimensions=(40, 200))
    try:
        child.expect(">>> ")
        child.sendline("Hello " + "and welcome to a long first message " * 8)
        assert _cached(child) == 0
        child.sendline("And a second question?")
        second = _cached(child)
        # the template re-renders the first reply without its (empty) think block, so the state
        # resumes from the checkpoint at that message's <|im_start|>assistant: the user turn is reused
        assert second > 50
        child.sendline(f"/save {saved}")
        child.expect(r"Saved 4 messages and (\d+) tokens of state")
        held = int(child.match.group(1))
        assert held > second
        child.expect(">>> ")
        child.sendline("/clear")
        child.expect("Chat history cleared.")
        child.expect(">>> ")
        child.sendline("Hello")
        assert _cached(child) == 0  # /clear dropped the state too
        child.sendline(f"/load {saved}")
        child.expect(f"Loaded 4 messages and {held} tokens of state.")
        child.expect(">>> ")
        child.sendline("A third question")
        assert _cached(child) >= second  # resumed from the saved state, no prefill of the history
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert json.loads(saved.read_text(encoding="utf-8"))["messages"][0]["content"].startswith("Hello and")
    assert Path(f"{saved}.state").stat().st_size > 0

    child = pexpect.spawn(sys.executable, ["-m", "clover_cli", "run", other, "-n", "4", "--no-think", "--decode", "ar"],
                          env=_env(tmp_path), encoding="utf-8", timeout=120, dimensions=(40, 200))
    try:
        child.expect(">>> ")
        child.sendline(f"/load {saved}")
        child.expect(r"state not loaded \(the next reply prefills it\): .*saved with another model file[^\r\n]*\r\n")
        child.expect("Loaded 4 messages.")
        child.expect(">>> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", "run", *args], input="", capture_output=True,
                          text=True, env=_env(tmp_path), timeout=180)


def test_one_shot_prompt_cache_file(tmp_path: Path) -> None:
    model = str(tiny_model_path("Q8_0"))
    cache = tmp_path / "p.state"
    args = [model, "Summarise the plot of a long novel. " * 8, "-n", "6", "--no-think", "--decode", "ar", "--json",
            "--prompt-cache", str(cache)]
    first = _run(args, tmp_path)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["timings"]["cache_n"] == 0 and cache.exists()
    again = _run(args, tmp_path)
    assert again.returncode == 0, again.stderr
    doc, ref = json.loads(again.stdout), json.loads(first.stdout)
    assert doc["content"] == ref["content"]
    # all but the last prompt token, down to a checkpoint at a multiple of 64 (the cache resumes only there)
    assert doc["timings"]["cache_n"] == (doc["usage"]["prompt_tokens"] - 1) // 64 * 64 > 0
    wrong = _run([str(tiny_model_path("F32")), *args[1:]], tmp_path)
    assert wrong.returncode == 1
    lines = wrong.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"error: .*saved with another model file", lines[0]), wrong.stderr
