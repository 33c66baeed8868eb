"""`clover serve` API keys as users give them: a passphrase with spaces stays one key (from
--api-key, CLOVER_API_KEY and through `--detach`), a key file with a BOM or in UTF-16 loses no key, a
key file others can read is warned about, and an empty or blank key is a usage error (exit 2), never
an open server. The real `clover serve` answers real HTTP requests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serve_helpers import ROOT, clover_serve, tiny_model

PHRASE = "correct horse battery staple"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("serve-keys"))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLOVER_")}
    return {**clean, "CLOVER_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8",
            "COLUMNS": "200"}


def _clover(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=120)


def _status(url: str, headers: dict[str, str]) -> int:
    return httpx.get(f"{url}/props", headers=headers, timeout=30).status_code


def _accepts(url: str, key: str) -> bool:
    """The key opens the API, as a Bearer token and as X-Api-Key alike (they must agree)."""
    bearer, x_api = _status(url, {"Authorization": f"Bearer {key}"}), _status(url, {"X-Api-Key": key})
    assert bearer == x_api and bearer in (200, 401), (key, bearer, x_api)
    return bearer == 200


def _key_file(path: Path, text: str, encoding: str, mode: int) -> Path:
    path.write_bytes(text.encode(encoding))
    if os.name != "nt":
        path.chmod(mode)
    return path


def test_a_passphrase_and_a_bom_key_file_on_the_command_line(model: Path, env: dict[str, str], tmp_path: Path):
    keys = _key_file(tmp_path / "keys.txt", "\ufefffirst-after-bom\n\n  spaced key  \r\nlast,with,commas\n",
                     "utf-8", 0o644)
    with clover_serve([str(model), "-c", "256", "--api-key", f"{PHRASE}, other-key ",
                       "--api-key-file", str(keys)], env) as (url, err):
        assert _status(url, {}) == 401
        for good in (PHRASE, "other-key", "first-after-bom", "spaced key", "last,with,commas"):
            assert _accepts(url, good), good
        for bad in ("correct", "horse", "staple", "correct horse", "first", "last", "spaced"):
            assert not _accepts(url, bad), bad
    warnings = [line for line in err if line.startswith("warning: ")]
    if os.name == "nt":
        assert warnings == []
    else:
        assert warnings == [f"warning: --api-key-file {keys} can be read or changed by other users (mode 0644); "
                            f"restrict it with: chmod 600 {keys}\n"]


def test_a_passphrase_from_the_environment_and_a_utf16_key_file(model: Path, env: dict[str, str], tmp_path: Path):
    keys = _key_file(tmp_path / "keys-utf16.txt", "\ufeffwide-first\r\nwide second\r\n", "utf-16-le", 0o600)
    env.update(CLOVER_API_KEY=PHRASE, CLOVER_API_KEY_FILE=str(keys))
    with clover_serve([str(model), "-c", "256"], env) as (url, err):
        for good in (PHRASE, "wide-first", "wide second"):
            assert _accepts(url, good), good
        for bad in ("correct", "battery", "wide"):
            assert not _accepts(url, bad), bad
    assert not [line for line in err if line.startswith("warning: ")]


def test_detach_passes_keys_with_spaces_and_commas_to_the_background_server(model: Path, env: dict[str, str],
                                                                            tmp_path: Path):
    keys = _key_file(tmp_path / "keys.txt", "file,key,with commas\n", "utf-8", 0o600)
    started = _clover(["serve", str(model), "--port", "0", "-c", "256", "--detach", "--api-key", PHRASE,
                       "--api-key-file", str(keys)], env)
    assert started.returncode == 0, started.stderr
    port = int(re.search(r"clover serve is running: http://127\.0\.0\.1:(\d+)", started.stdout).group(1))
    try:
        url = f"http://127.0.0.1:{port}"
        assert _accepts(url, PHRASE) and _accepts(url, "file,key,with commas")
        for bad in ("correct", "staple", "file", "key", "with commas"):
            assert not _accepts(url, bad), bad
    finally:
        assert _clover(["stop", str(port)], env).returncode == 0


@pytest.mark.parametrize(("args", "environ", "file_text", "line"), [
    (["--api-key", ""], {}, None, "--api-key holds an empty API key"),
    (["--api-key", "   "], {}, None, "--api-key holds an empty API key"),
    (["--api-key", "good,,other"], {}, None, "--api-key holds an empty API key"),
    (["--api-key", "tab\there"], {}, None,
     "--api-key holds an API key with a control character (an HTTP header cannot carry it)"),
    ([], {"CLOVER_API_KEY": ""}, None, "CLOVER_API_KEY holds an empty API key"),
    ([], {"CLOVER_API_KEY": "  "}, None, "CLOVER_API_KEY holds an empty API key"),
    ([], {}, "\ufeff\n   \n", "--api-key-file {file} holds no keys"),
], ids=["empty", "blank", "empty-between-commas", "control-character", "empty-env", "blank-env", "blank-file"])
def test_an_empty_or_blank_key_is_a_usage_error(model: Path, env: dict[str, str], tmp_path: Path, args: list[str],
                                                environ: dict[str, str], file_text: str | None, line: str):
    file = tmp_path / "keys.txt"
    if file_text is not None:
        _key_file(file, file_text, "utf-8", 0o600)
        args = [*args, "--api-key-file", str(file)]
    res = _clover(["serve", str(model), "--port", "0", "-c", "256", *args], {**env, **environ})
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "listening" not in res.stdout
    errors = [x for x in res.stderr.splitlines() if x.startswith("error: ")]
    assert errors == ["error: " + line.format(file=file)], res.stderr
