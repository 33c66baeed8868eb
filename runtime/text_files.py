"""Text files as Windows tools write them: UTF-8 with or without a BOM, or UTF-16 (PowerShell 5.1's
`>` and `Out-File` default). One decoder for every file a user hands clover (`-f`, `/read`,
`--chat-template-file`, `--api-key-file`) and for piped stdin, so none of them depends on the
platform's ANSI code page.
"""

from __future__ import annotations

from pathlib import Path

_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def detect_encoding(data: bytes) -> str:
    """The encoding its BOM names; without one, UTF-16 when every other byte is NUL (a BOM-less
    UTF-16 file of ASCII text), else UTF-8."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return encoding
    if len(data) >= 2 and len(data) % 2 == 0:
        if data[1::2].count(0) == len(data) // 2 and data[0::2].count(0) == 0:
            return "utf-16-le"
        if data[0::2].count(0) == len(data) // 2 and data[1::2].count(0) == 0:
            return "utf-16-be"
    return "utf-8"


def decode_text(data: bytes) -> str:
    """`data` decoded by `detect_encoding`, the BOM dropped; UnicodeDecodeError when it is not text."""
    return data.decode(detect_encoding(data))


def read_text(path: Path | str) -> str:
    """A user's text file, decoded by `decode_text`: OSError when unreadable, UnicodeDecodeError
    when it is not UTF-8 or UTF-16 text."""
    return decode_text(Path(path).read_bytes())
