"""The per-file start cache: a parsed header stored under CLOVER_HOME and reused only for the
same version of the same file; a damaged, stale or unwritable cache only means parsing again."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clover_runtime import file_cache, gguf_file, header_cache
from clover_runtime.errors import ModelFileError
from clover_runtime.gguf_file import open_gguf
from clover_runtime.gguf_header import GGUFHeader, parse_header
from clover_runtime.model_config import check_tokenizer_metadata, describe_tensors
from clover_runtime.text.tokenizer import Tokenizer
from synth_models import real_vocab_model_path

TEXTS = ["Hello, world!", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n", "你好，世界。今日は",
         "한국어 텍스트", "👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️", "naïve café", "def f(x):\n    return x ** 2\n",
         "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>", "<|mask|><|endoftext|>", "   \t\n\r\n"]


@pytest.fixture(scope="module")
def source() -> Path:
    return real_vocab_model_path()


@pytest.fixture(scope="module")
def reference(source: Path) -> GGUFHeader:
    data = source.read_bytes()
    return parse_header(data, file_size=len(data), name=source.name)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLOVER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def model(source: Path, tmp_path: Path, home: Path) -> Path:
    """A private copy of the real-vocabulary model (tests change its bytes and times)."""
    return Path(shutil.copy(source, tmp_path / "model.gguf"))


def _fresh_open(path: Path) -> GGUFHeader:
    """The header as a new process opens it: without this process's in-memory copy."""
    gguf_file._HEADER_CACHE.clear()
    with open_gguf(path) as f:
        return f.headers[0]


def _cached(path: Path) -> GGUFHeader | None:
    return header_cache.load(path, path.read_bytes())


def _entries() -> list[Path]:
    root = file_cache.cache_root()
    return sorted(root.iterdir()) if root.is_dir() else []


def _assert_same(a: GGUFHeader, b: GGUFHeader) -> None:
    assert (a.version, a.alignment, a.data_offset, a.header_size) == (b.version, b.alignment, b.data_offset,
                                                                      b.header_size)
    assert a.tensors == b.tensors and a.value_types == b.value_types
    assert list(a.metadata) == list(b.metadata)
    for key, va in a.metadata.items():
        vb = b.metadata[key]
        assert type(va) is type(vb), key
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and np.array_equal(va, vb) and vb.flags.writeable, key
        else:
            assert va == vb, key


def test_miss_then_hit_gives_the_same_header_config_and_tokenizer(model: Path, reference: GGUFHeader) -> None:
    assert _cached(model) is None and _entries() == []
    _assert_same(_fresh_open(model), reference)  # the miss parses and stores
    assert len(_entries()) == 1
    hit = _cached(model)
    assert hit is not None
    _assert_same(hit, reference)
    _assert_same(_fresh_open(model), reference)
    tensors = {t.name: t for t in reference.tensors}
    assert describe_tensors(hit.metadata, tensors) == describe_tensors(reference.metadata, tensors)
    fresh, cached = Tokenizer.from_metadata(reference.metadata), Tokenizer.from_metadata(hit.metadata)
    for text in TEXTS:
        ids = fresh.encode(text)
        assert cached.encode(text) == ids and cached.decode(ids) == fresh.decode(ids) == text
        assert cached.encode(text, parse_special=False) == fresh.encode(text, parse_special=False)
        assert cached.decode(ids, skip_special=True) == fresh.decode(ids, skip_special=True)
    assert cached.stop_ids == fresh.stop_ids and cached.mask_id == fresh.mask_id is not None


def test_a_new_process_reads_the_entry(model: Path, home: Path) -> None:
    _fresh_open(model)
    (entry,) = _entries()
    os.utime(entry, (1_000_000_000, 1_000_000_000))
    inode = entry.stat().st_ino
    env = {**os.environ, "CLOVER_HOME": str(home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    res = subprocess.run([sys.executable, "-m", "clover_cli", "inspect", str(model)], capture_output=True,
                         text=True, encoding="utf-8", env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "248320" in res.stdout.replace(",", "")
    st = entry.stat()
    assert st.st_ino == inode and st.st_mtime > 1_000_000_000  # read (and marked used), not rewritten


def _set_mtime_ns(path: Path, mtime_ns: int) -> None:
    os.utime(path, ns=(path.stat().st_atime_ns, mtime_ns))


def test_touching_resizing_or_replacing_the_file_invalidates(model: Path) -> None:
    _fresh_open(model)
    assert _cached(model) is not None
    mtime = model.stat().st_mtime_ns
    _set_mtime_ns(model, mtime + 1_000_000_000)
    assert _cached(model) is None
    _fresh_open(model)
    assert _cached(model) is not None and len(_entries()) == 1  # the entry of the path is replaced

    with model.open("ab") as fh:
        fh.write(b"\0" * 64)
    assert _cached(model) is None
    _fresh_open(model)
    assert _cached(model) is not None

    # Another file with the same size and time (a different model name): the header bytes differ.
    data = bytearray(model.read_bytes())
    at = data.index(b"general.name") + len(b"general.name")
    assert struct.unpack_from("<I", data, at)[0] == 8  # a string value follows
    mtime = model.stat().st_mtime_ns
    name_at = at + 4 + 8
    data[name_at] = ord("X") if data[name_at] != ord("X") else ord("Y")
    model.write_bytes(bytes(data))
    _set_mtime_ns(model, mtime)
    assert _cached(model) is None
    assert _fresh_open(model).metadata["general.name"][0] in "XY"


def _damage(entry: Path, how: str) -> None:
    data = entry.read_bytes()
    if how == "truncated":
        entry.write_bytes(data[:len(data) // 2])
    elif how == "flipped":
        data = bytearray(data)
        data[len(data) // 2] ^= 0xFF
        entry.write_bytes(bytes(data))
    elif how == "garbage":
        entry.write_bytes(os.urandom(4096))
    elif how == "empty":
        entry.write_bytes(b"")
    elif how == "directory":
        entry.unlink()
        entry.mkdir()


@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage", "empty", "directory"])
def test_a_damaged_entry_is_ignored_and_rewritten(model: Path, reference: GGUFHeader, how: str) -> None:
    _fresh_open(model)
    (entry,) = _entries()
    _damage(entry, how)
    assert _cached(model) is None
    _assert_same(_fresh_open(model), reference)
    if how == "directory":  # nothing can be written over it: the cache is simply not used
        assert entry.is_dir() and _cached(model) is None
    else:
        rewritten = _cached(model)
        assert rewritten is not None
        _assert_same(rewritten, reference)


def test_an_unwritable_cache_directory_only_means_no_cache(model: Path, home: Path,
                                                           reference: GGUFHeader) -> None:
    home.mkdir()
    (home / "cache").write_text("a file where the cache directory should be", encoding="utf-8")
    _assert_same(_fresh_open(model), reference)
    _assert_same(_fresh_open(model), reference)
    assert _cached(model) is None
    file_cache.store(file_cache.FileKey("x", 1, 1), "header", b"payload")  # no error either


def test_the_cache_keeps_the_most_recently_used_entries(home: Path) -> None:
    keys = [file_cache.FileKey(f"/models/m{i}.gguf", 100 + i, i) for i in range(file_cache.MAX_ENTRIES + 3)]
    for i, key in enumerate(keys):
        file_cache.store(key, "header", f"payload {i}".encode())
        for entry in _entries():  # distinct times, oldest first, whatever the clock's resolution
            if entry.stat().st_mtime > 1_000_000:
                os.utime(entry, (1000 + i, 1000 + i))
    stale = file_cache.cache_root() / ".tmp-left-by-a-crash.header"
    stale.write_bytes(b"x")
    os.utime(stale, (1000, 1000))
    file_cache.store(keys[-1], "header", b"payload again")
    assert len(_entries()) == file_cache.MAX_ENTRIES and not stale.exists()
    assert file_cache.load(keys[0], "header") is None
    assert file_cache.load(keys[-2], "header") == f"payload {len(keys) - 2}".encode()
    assert file_cache.load(keys[-1], "header") == b"payload again"
    other = file_cache.FileKey(keys[-1].path, keys[-1].size + 1, keys[-1].mtime_ns)
    assert file_cache.load(other, "header") is None


class _Token(str):
    pass


def test_token_arrays_are_still_checked_entry_by_entry() -> None:
    tokens = [f"t{i}" for i in range(1000)]
    assert check_tokenizer_metadata({"tokenizer.ggml.tokens": [*tokens[:-1], _Token("x")]}) == 1000
    with pytest.raises(ModelFileError, match="'tokenizer.ggml.tokens' must be an array of strings"):
        check_tokenizer_metadata({"tokenizer.ggml.tokens": [*tokens, 7]})
    with pytest.raises(ModelFileError, match="'tokenizer.ggml.merges' must be an array of strings"):
        check_tokenizer_metadata({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["a b", b"c d"]})
