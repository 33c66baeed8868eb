"""The API keys `clover serve` requires: `--api-key` and CLOVER_API_KEY (comma-separated), and
`--api-key-file` (one key per line). A key may hold spaces (a passphrase), so only commas and line ends
separate keys. An empty or blank key is refused rather than read as "no key": that would start an
open server without a word.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from clover_runtime.errors import CloverError
from clover_runtime.text_files import decode_text

ENV = "CLOVER_API_KEY"
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class KeyUsageError(CloverError):
    """A key given in a way that cannot be meant: a usage error, exit code 2 as click gives them."""

    exit_code = 2


def _checked(key: str, where: str) -> str:
    key = key.strip()
    if not key:
        raise KeyUsageError(f"{where} holds an empty API key", "give a non-empty key, or leave the option out "
                                                              "for a server without keys")
    if _CONTROL_RE.search(key):
        raise KeyUsageError(f"{where} holds an API key with a control character (an HTTP header cannot carry it)")
    return key


def split_keys(value: str, where: str) -> list[str]:
    """The keys of one comma-separated value; surrounding spaces go, inner spaces stay."""
    return [_checked(part, where) for part in value.split(",")]


def env_keys(raw: str) -> list[str]:
    """CLOVER_API_KEY: comma-separated, or one key per line when it has line ends (how a detached
    server receives its keys, so a key with a comma from a key file stays one key)."""
    if "\n" not in raw:
        return split_keys(raw, ENV)
    keys = [_checked(line, ENV) for line in raw.splitlines() if line.strip()]
    if not keys:
        raise KeyUsageError(f"{ENV} holds no API key")
    return keys


def to_env(keys: Sequence[str]) -> str:
    """The CLOVER_API_KEY value that `env_keys` reads back as exactly `keys`."""
    return "".join(f"{key}\n" for key in keys)


def _decode(data: bytes, path: Path) -> str:
    """UTF-8 (a BOM is dropped), or UTF-16, as Windows editors save it (`text_files.decode_text`)."""
    try:
        return decode_text(data)
    except UnicodeDecodeError:
        raise CloverError(f"cannot read --api-key-file {path}: it is not UTF-8 or UTF-16 text") from None


def open_to_others(path: Path) -> int | None:
    """The file's permission bits when users other than its owner may read or change it (POSIX only:
    Windows grants access with ACLs, which the mode bits do not show), else None."""
    if os.name == "nt":
        return None
    mode = stat.S_IMODE(path.stat().st_mode)
    return mode if mode & 0o066 else None


def file_keys(path: Path) -> list[str]:
    """One key per line; blank lines and the spaces around a key are ignored."""
    try:
        text = _decode(path.read_bytes(), path)
    except OSError as exc:
        raise CloverError(f"cannot read --api-key-file {path}: {exc.strerror}") from None
    keys = [_checked(line, f"--api-key-file {path}") for line in text.splitlines() if line.strip()]
    if not keys:
        raise KeyUsageError(f"--api-key-file {path} holds no keys")
    return keys


def collect(cli_values: Sequence[str] | None, key_file: Path | None, *, from_env: bool) -> tuple[str, ...]:
    """Every key, each once. `from_env`: the values came from CLOVER_API_KEY, which is read again here
    as written (click would split it on spaces and skip an empty one)."""
    from . import console

    keys: list[str] = []
    if from_env or cli_values is None:
        raw = os.environ.get(ENV)
        if raw is not None:
            keys += env_keys(raw)
    else:
        keys += [k for value in cli_values for k in split_keys(value, "--api-key")]
    if key_file is not None:
        keys += file_keys(key_file)
        mode = open_to_others(key_file)
        if mode is not None:
            console.warn(f"--api-key-file {key_file} can be read or changed by other users (mode {mode:04o}); "
                         f"restrict it with: chmod 600 {key_file}")
    return tuple(dict.fromkeys(keys))
