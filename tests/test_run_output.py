"""What `clover run` prints is only text (issue 39, item 2): tool-call markup the terminal never
offered becomes a one-line note, on screen, in the REPL and in `--json`; end-of-text never shows in
the `--visual` block; one-shot reasoning and the stats line go to stderr on lines of their own."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pexpect
from serve_helpers import fixed_reply_model
from terminal_helpers import screen, spawn_run, terminal_env

CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
        "</tool_call>")
NOTE = 'the model tried to call get_weather(city="Oslo"); no tools were given'
TAGS = re.compile(r"<tool_call>|</tool_call>|<function=|</function>|<parameter=|</parameter>|<\|")


def _run(args: list[str], home: Path) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "clover_cli", "run", *args], input="", capture_output=True,
                         text=True, encoding="utf-8", env=terminal_env(home), timeout=300)
    assert res.returncode == 0, res.stderr
    return res


def test_a_tool_call_without_tools_is_a_note_on_stdout_and_in_json(tmp_path: Path) -> None:
    """The demo model made to write a whole get_weather call (a grammar forces it): no tools were
    given, so stdout is the note, and `--json` has the note as content and the call's own text aside."""
    args = ["demo", "What is the weather in Oslo?", "--no-think", "--decode", "ar", "--grammar",
            "root ::= " + json.dumps(CALL)]
    assert _run(args, tmp_path).stdout == NOTE + "\n"
    doc = json.loads(_run([*args, "--json"], tmp_path).stdout)
    assert doc["content"] == NOTE and doc["tool_calls"] == []
    assert doc["tool_markup"] == [{"name": "get_weather", "arguments": {"city": "Oslo"}, "text": CALL}]


def test_the_demo_asked_for_the_weather_without_tools_prints_no_markup(tmp_path: Path) -> None:
    """What the demo writes for this question with no tools offered (a call, or pieces of one), shown
    as text: no tag reaches stdout or `--json` content, and what it wrote is kept in `tool_markup`."""
    args = ["demo", "What is the weather in Paris?", "--no-think", "--temp", "0"]
    doc = json.loads(_run([*args, "--json"], tmp_path).stdout)
    assert doc["tool_markup"], doc  # the premise: the shipped model writes tool-call markup here
    assert TAGS.search(doc["content"]) is None, doc["content"]
    shown = _run(args, tmp_path).stdout
    assert shown == doc["content"] + "\n"


def test_the_repl_shows_the_note_and_the_visual_block_no_end_of_text(tmp_path: Path) -> None:
    """In the chat, --visual, block diffusion: the call is the note, and the live block (which shows
    the tokens as they resolve, markup included, until it is erased) shows the end-of-text at its
    last positions as blank."""
    model = str(fixed_reply_model(CALL))
    child = spawn_run([model, "--visual", "--no-think", "--temp", "0", "--decode", "diffusion", "--no-verify",
                       "-n", "64"], tmp_path, timeout=180)
    log = io.StringIO()
    child.logfile_read = log
    try:
        child.expect(">>> ")
        child.sendline("Weather in Oslo?")
        child.expect("tokens per forward")
        child.expect(">>> ")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", log.getvalue())
    assert re.search(r"block \d+\s+pass \d+\s+masked \d+", plain), "no live block was drawn"
    assert "<|" not in plain, plain  # no special token, not even in the live block
    shown = [line.rstrip() for line in screen(log.getvalue())]
    assert NOTE in shown and TAGS.search("\n".join(shown)) is None, shown  # the block is gone, the note stays


def test_one_shot_reasoning_and_stats_end_their_lines(tmp_path: Path) -> None:
    """Thinking on, in a terminal: the dim reasoning, the answer and the stats line each start a line
    of their own; piped, stdout is the answer alone."""
    model = str(fixed_reply_model("Ones: 8 + 6 = 14.", reasoning="Add digit by digit."))
    args = [model, "What is 48 + 36?", "--temp", "0", "--decode", "ar"]
    doc = json.loads(_run([*args, "--json"], tmp_path).stdout)
    assert doc["reasoning"] == "Add digit by digit." and doc["content"] == "Ones: 8 + 6 = 14."  # the premise
    piped = _run(args, tmp_path)
    assert piped.stdout == "Ones: 8 + 6 = 14.\n" and "Add digit" not in piped.stderr
    child = spawn_run(args, tmp_path, timeout=180)
    log = io.StringIO()
    child.logfile_read = log
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close()
    lines = [line for line in (row.rstrip() for row in screen(log.getvalue())) if line]
    at = lines.index("Add digit by digit.")
    assert lines[at + 1] == "Ones: 8 + 6 = 14.", lines
    assert lines[at + 2].startswith("[ prompt "), lines
