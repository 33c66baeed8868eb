"""Hostile GGUF metadata and tensor tables: every key clover reads is checked for type and range
before anything is sized from it, and the tensor table as llama.cpp's loader checks it. Each case
is one `error:` line naming the key (or tensor) and exit code 1, fast."""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

import pytest
from gguf_bytes import ARRAY, FLOAT32, INT32, RAW, STRING, UINT32, UINT64, load
from inspect_helpers import run_clover, write_model

A = "clover-moe"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return load(write_model(tmp_path_factory.mktemp("hostile-gguf") / "base.gguf"))


def one_error(tmp_path: Path, g, capsys, monkeypatch, args=("inspect",)) -> str:
    path = g.write(tmp_path / "case.gguf")
    t0 = time.monotonic()
    code, out, err = run_clover([*args, str(path)], capsys, monkeypatch)
    assert time.monotonic() - t0 < 10
    lines = err.strip().splitlines()
    assert code == 1 and out == "", err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "internal error" not in err
    return lines[0]


def nested(depth: int) -> bytes:
    """The payload of `depth` arrays, each holding the next, the innermost one uint32."""
    return struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQI", UINT32, 1, 7)


@pytest.mark.parametrize(("key", "vtype", "value", "needle"), [
    (f"{A}.block_count", UINT32, 2**31 - 1, f"'{A}.block_count' is 2147483647, outside the sane range 1..512"),
    (f"{A}.block_count", UINT64, 2**63 - 1, f"'{A}.block_count' is 9223372036854775807, outside"),
    (f"{A}.block_count", INT32, -1, f"'{A}.block_count' is -1, outside the sane range 1..512"),
    (f"{A}.block_count", STRING, "4", f"'{A}.block_count' must be an integer, not a string"),
    (f"{A}.block_count", FLOAT32, 4.0, f"'{A}.block_count' must be an integer, not the float 4.0"),
    (f"{A}.full_attention_interval", UINT32, 0, f"'{A}.full_attention_interval' is 0, outside"),
    (f"{A}.rope.dimension_count", UINT32, 2**31 - 1, f"'{A}.rope.dimension_count' is 2147483647, outside the "
                                                      "sane range 0..16"),
    (f"{A}.attention.layer_norm_rms_epsilon", FLOAT32, float("nan"), "layer_norm_rms_epsilon' is nan, outside"),
    (f"{A}.rope.freq_base", FLOAT32, float("inf"), f"'{A}.rope.freq_base' is inf, outside"),
    (f"{A}.attention.head_count", STRING, "x", f"'{A}.attention.head_count' must be an integer, not a string"),
    (f"{A}.attention.head_count_kv", UINT32, 3, "4 attention heads do not divide into 3 KV heads"),
    (f"{A}.expert_used_count", UINT32, 9, f"'{A}.expert_used_count' is 9, outside the sane range 1..8"),
    (f"{A}.diffusion.threshold", FLOAT32, float("nan"), f"'{A}.diffusion.threshold' is nan"),
    (f"{A}.diffusion.block_length", UINT64, 2**40, f"'{A}.diffusion.block_length' is 1099511627776, outside"),
    ("tokenizer.ggml.mask_token_id", UINT32, 10**6, "'tokenizer.ggml.mask_token_id' is 1000000, outside"),
    ("tokenizer.ggml.eos_token_id", STRING, "x", "'tokenizer.ggml.eos_token_id' must be an integer"),
    ("general.architecture", UINT32, 7, "'general.architecture' must be a string, not int"),
    ("tokenizer.chat_template", UINT32, 7, "'tokenizer.chat_template' must be a string"),
])
def test_bad_metadata_value_is_one_line_naming_the_key(base, tmp_path, capsys, monkeypatch, key, vtype, value,
                                                        needle):
    line = one_error(tmp_path, base.set(key, vtype, value), capsys, monkeypatch)
    assert needle in line, line


def test_tokens_of_the_wrong_type(base, tmp_path, capsys, monkeypatch):
    g = base.set("tokenizer.ggml.tokens", ARRAY, list(range(320)), UINT32)
    assert "'tokenizer.ggml.tokens' must be an array of strings" in one_error(tmp_path, g, capsys, monkeypatch)


def test_deeply_nested_arrays_fail_fast(base, tmp_path, capsys, monkeypatch):
    line = one_error(tmp_path, base.set("evil.nest", ARRAY, nested(2000), RAW), capsys, monkeypatch)
    assert "metadata key 'evil.nest' nests arrays more than 4 deep" in line


@pytest.mark.parametrize(("vtype", "value", "needle"), [
    (UINT32, 0, "'general.alignment' is 0; it must be a power of two"),
    (UINT32, 3, "'general.alignment' is 3; it must be a power of two"),
    (INT32, -32, "'general.alignment' is -32; it must be a power of two"),
    (STRING, "32", "'general.alignment' must be an integer"),
])
def test_bad_alignment(base, tmp_path, capsys, monkeypatch, vtype, value, needle):
    assert needle in one_error(tmp_path, base.set("general.alignment", vtype, value), capsys, monkeypatch)


def test_misaligned_overlapping_and_duplicate_tensors(base, tmp_path, capsys, monkeypatch):
    g = load(base.write(tmp_path / "copy.gguf"))
    g.tensors[1].offset += 4
    assert "tensor 'output_norm.weight' data is at offset 81,924, expected 81,920 (misaligned)" in one_error(
        tmp_path, g, capsys, monkeypatch)
    g.tensors[1].offset = 0
    assert "(overlapping or out of order)" in one_error(tmp_path, g, capsys, monkeypatch)
    g = load(base.write(tmp_path / "copy.gguf"))
    g.tensors[1].name = g.tensors[0].name
    assert "tensor 'token_embd.weight' appears twice" in one_error(tmp_path, g, capsys, monkeypatch)
    g = load(base.write(tmp_path / "copy.gguf"))
    g.tensors[0].ne = [2**40, 2**40]
    assert "absurd shape" in one_error(tmp_path, g, capsys, monkeypatch)
    g.tensors[0].ne = [1] * 5
    assert "(5 dimensions)" in one_error(tmp_path, g, capsys, monkeypatch)


@pytest.mark.parametrize("field", ["n_kv", "n_tensors"])
def test_absurd_counts_fail_fast(base, tmp_path, capsys, monkeypatch, field):
    g = load(base.write(tmp_path / "copy.gguf"))
    setattr(g, field, 2**40)
    assert one_error(tmp_path, g, capsys, monkeypatch) == "error: case.gguf: corrupt GGUF header (absurd counts)"
    setattr(g, field, 9_000_000)
    assert one_error(tmp_path, g, capsys, monkeypatch) == \
        "error: case.gguf: truncated file (ends inside the GGUF header)"


def test_absurd_string_array_count_fails_fast(base, tmp_path, capsys, monkeypatch):
    g = base.set("tokenizer.ggml.tokens", ARRAY, [], STRING)
    raw = bytearray(g.to_bytes())
    marker = b"tokenizer.ggml.tokens" + (9).to_bytes(4, "little") + (8).to_bytes(4, "little")
    at = raw.index(marker) + len(marker)
    raw[at:at + 8] = (2**62).to_bytes(8, "little")
    path = tmp_path / "count.gguf"
    path.write_bytes(bytes(raw))
    code, out, err = run_clover(["inspect", str(path)], capsys, monkeypatch)
    assert code == 1 and err.strip().splitlines() == ["error: count.gguf: truncated file (ends inside the GGUF header)"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_by_permissions(base, tmp_path, capsys, monkeypatch):
    path = base.write(tmp_path / "locked.gguf")
    path.chmod(0)
    code, out, err = run_clover(["inspect", str(path)], capsys, monkeypatch)
    assert code == 1 and err.strip().splitlines() == [f"error: cannot read {path}: Permission denied"]


def test_unreadable_file_refused_by_the_os(base, tmp_path, capsys, monkeypatch):
    """The OS refusing the mapping (as it does for a file without read permission)."""
    path = base.write(tmp_path / "refused.gguf")

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(mmap, "mmap", refuse)
    code, out, err = run_clover(["inspect", str(path)], capsys, monkeypatch)
    assert code == 1 and err.strip().splitlines() == [f"error: cannot read {path}: Permission denied"]
