"""Text files as PowerShell 5.1 and Windows editors write them (issue 41): UTF-8 with a BOM, UTF-16
LE/BE with a BOM (`>` and `Out-File`), BOM-less UTF-16, read by one decoder for `-f`, piped stdin,
`/read`, `--chat-template-file` and `--api-key-file`; anything else is one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from clover_runtime.errors import TemplateError
from clover_runtime.text.chat_template import ChatTemplate
from clover_runtime.text_files import decode_text, detect_encoding, read_text
from synth_models import tiny_model_path

TEXT = "Grüße, 2 + 2?\r\nZeile zwei: 漢字 ✓\n"
FIXTURES = {  # what each writer puts on disk for TEXT
    "utf-8": TEXT.encode("utf-8"),
    "utf-8 BOM (Out-File -Encoding utf8)": b"\xef\xbb\xbf" + TEXT.encode("utf-8"),
    "UTF-16 LE BOM (PowerShell 5.1 >)": b"\xff\xfe" + TEXT.encode("utf-16-le"),
    "UTF-16 BE BOM (Out-File -Encoding BigEndianUnicode)": b"\xfe\xff" + TEXT.encode("utf-16-be"),
}


@pytest.mark.parametrize("name", list(FIXTURES))
def test_every_windows_encoding_decodes_to_the_same_text(name: str, tmp_path: Path) -> None:
    assert decode_text(FIXTURES[name]) == TEXT
    path = tmp_path / "prompt.txt"
    path.write_bytes(FIXTURES[name])
    assert read_text(path) == TEXT


def test_bom_less_utf16_of_ascii_text_is_recognised() -> None:
    ascii_text = "What is 2 + 2?\r\n"
    assert detect_encoding(ascii_text.encode("utf-16-le")) == "utf-16-le"
    assert decode_text(ascii_text.encode("utf-16-le")) == ascii_text
    assert decode_text(ascii_text.encode("utf-16-be")) == ascii_text
    assert detect_encoding(b"ab") == "utf-8" and detect_encoding(b"") == "utf-8"


def test_bytes_that_are_not_text_raise() -> None:
    with pytest.raises(UnicodeDecodeError):
        decode_text(b"\x80\x81 not text \xff")
    with pytest.raises(UnicodeDecodeError):
        decode_text(b"\xff\xfe\x00\xd8")  # UTF-16 with a lone surrogate


@pytest.mark.parametrize("name", list(FIXTURES))
def test_a_chat_template_file_in_any_encoding(name: str, tmp_path: Path) -> None:
    source = "{% for m in messages %}{{ m.content }}|{% endfor %}"
    path = tmp_path / "template.jinja"
    path.write_bytes(_encode_like(name, source))
    template = ChatTemplate.from_metadata({}, override_path=path)
    assert template.source == source


def test_a_chat_template_file_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "template.jinja"
    path.write_bytes(b"\x80\x81\xfe")
    with pytest.raises(TemplateError, match="it is not UTF-8 or UTF-16 text"):
        ChatTemplate.from_metadata({}, override_path=path)


def _encode_like(name: str, text: str) -> bytes:
    """`text` as the writer of fixture `name` saves it."""
    if name.startswith("UTF-16 LE"):
        return b"\xff\xfe" + text.encode("utf-16-le")
    if name.startswith("UTF-16 BE"):
        return b"\xfe\xff" + text.encode("utf-16-be")
    return (b"\xef\xbb\xbf" if "BOM" in name else b"") + text.encode("utf-8")


def _run(args: list[str], tmp_path: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    for var in ("CLOVER_DEBUG", "CLOVER_HOME"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "clover_cli", "run", str(tiny_model_path("Q8_0")), *args,
                           "-n", "3", "--no-think", "--temp", "0", "--json"],
                          input=stdin if stdin is not None else b"", capture_output=True, env=env, timeout=300)


def _answer(res: subprocess.CompletedProcess) -> tuple[str, int]:
    assert res.returncode == 0, res.stderr.decode("utf-8", "replace")
    data = json.loads(res.stdout)
    return data["content"], data["usage"]["prompt_tokens"]


def test_run_reads_the_prompt_file_and_piped_stdin_in_any_encoding(tmp_path: Path) -> None:
    """The same prompt as an argument, as a UTF-8-BOM or UTF-16 file (-f) and piped as UTF-16 gives
    the same tokens and the same reply."""
    prompt = "Grüße, 2 + 2? 漢字"
    want = _answer(_run([prompt], tmp_path))
    for name in ("utf-8 BOM (Out-File -Encoding utf8)", "UTF-16 LE BOM (PowerShell 5.1 >)"):
        path = tmp_path / f"prompt-{name[:6].strip()}.txt"
        path.write_bytes(_encode_like(name, prompt + "\r\n"))
        assert _answer(_run(["-f", str(path)], tmp_path)) == want, name
    assert _answer(_run([], tmp_path, stdin=b"\xff\xfe" + (prompt + "\n").encode("utf-16-le"))) == want
    assert _answer(_run([], tmp_path, stdin=(prompt + "\n").encode("utf-8"))) == want


def test_run_refuses_a_file_that_is_not_text_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "binary.bin"
    path.write_bytes(b"\x80\x81\x82\xfe")
    res = _run(["-f", str(path)], tmp_path)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [f"error: cannot read {path}: it is not UTF-8 or UTF-16 text"], err


@pytest.mark.skipif(os.name == "nt", reason="pexpect drives a POSIX pseudo-terminal")
def test_repl_read_takes_a_utf16_file_and_refuses_a_binary_one_without_exiting(tmp_path: Path) -> None:
    wide = tmp_path / "wide.txt"
    wide.write_bytes(b"\xff\xfe" + "Grüße aus PowerShell\r\n".encode("utf-16-le"))
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"\x80\x81\x82\xfe")
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "TERM": "xterm"}
    env.pop("CLOVER_HOME", None)
    child = pexpect.spawn(sys.executable, ["-m", "clover_cli", "run", str(tiny_model_path("Q8_0")), "-n", "3",
                                           "--no-think", "--temp", "0"], env=env, encoding="utf-8",
                          codec_errors="replace", timeout=120, dimensions=(40, 100))
    try:
        child.expect(">>> ")
        child.sendline(f"/read {binary}")
        child.expect("it is not UTF-8 or UTF-16 text")
        child.expect(">>> ")
        child.sendline(f"/read {wide}")
        index = child.expect(["cannot read", "internal error", ">>> "])
        assert index == 2, child.before
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
