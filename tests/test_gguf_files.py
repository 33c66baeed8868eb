"""The GGUF file layer as a user meets it: bad files get one exact line and exit code 1, split sets
open as one model, and a header parses from a partial buffer (the remote-header path)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clover_runtime.errors import ModelFileError
from clover_runtime.gguf_file import open_gguf
from clover_runtime.gguf_header import HeaderTruncated, parse_header
from clover_runtime.model_summary import summarize
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from hypothesis import given, settings
from hypothesis import strategies as st
from inspect_helpers import REAL, byte_level_vocab, edit_bytes, real_shape_path, run_clover, write_model

SUPPORTED = "F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16"


def assert_one_error(result: tuple[int, str, str], line: str) -> None:
    code, out, err = result
    assert code == 1
    assert out == ""
    assert err.strip().splitlines() == [f"error: {line}"]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_model(tmp_path / "tiny.gguf")


def test_not_a_gguf(tmp_path, capsys, monkeypatch):
    p = tmp_path / "notes.gguf"
    p.write_text("hello, this is a text file and not a model\n", encoding="utf-8")
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch),
                     "notes.gguf: not a GGUF file (bad magic b'hell')")


def test_empty_and_tiny_files(tmp_path, capsys, monkeypatch):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch),
                     "empty.gguf: not a GGUF file (empty)")
    p.write_bytes(b"GG")
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch),
                     "empty.gguf: not a GGUF file (too small)")


def test_unsupported_version(tiny, capsys, monkeypatch):
    edit_bytes(tiny, 4, struct.pack("<I", 4))
    assert_one_error(run_clover(["inspect", str(tiny)], capsys, monkeypatch),
                     "tiny.gguf: unsupported GGUF version 4 (supported: 2, 3)")


def test_truncated_tensor_data(tiny, capsys, monkeypatch):
    last = GGUFReader(tiny).tensors[-1]  # independent oracle for where the data must end
    end = int(last.data_offset) + int(last.n_bytes)
    with open(tiny, "r+b") as fh:
        fh.truncate(end - 100)
    assert_one_error(run_clover(["inspect", str(tiny)], capsys, monkeypatch),
                     f"tiny.gguf: truncated file: tensor '{last.name}' ends at byte {end:,} "
                     f"but the file has {end - 100:,} bytes")


def test_truncated_inside_header(tiny, capsys, monkeypatch):
    data = tiny.read_bytes()
    tiny.write_bytes(data[:900])  # inside the metadata (the token list alone is longer)
    assert_one_error(run_clover(["inspect", str(tiny)], capsys, monkeypatch),
                     "tiny.gguf: truncated file (ends inside the GGUF header)")


@pytest.mark.parametrize("name", ["blk.3.attn_k.weight", "blk.1.ssm_a", "output_norm.weight",
                                  "blk.0.ffn_down_exps.weight"])
def test_missing_tensor(tmp_path, name, capsys, monkeypatch):
    p = write_model(tmp_path / "m.gguf", drop=(name,))
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch), f"missing tensor '{name}'")


def test_misshaped_tensor(tmp_path, capsys, monkeypatch):
    # ssm_out maps the 4 x 16 GDN values back to hidden 64: numpy shape (64, 64) by the doc.
    p = write_model(tmp_path / "m.gguf", reshape={"blk.0.ssm_out.weight": (64, 96)})
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch),
                     "tensor 'blk.0.ssm_out.weight' has shape [64, 96], expected [64, 64]")


def test_misshaped_expert_tensor(tmp_path, capsys, monkeypatch):
    p = write_model(tmp_path / "m.gguf", reshape={"blk.2.ffn_up_exps.weight": (8, 64, 64)})
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch),
                     "tensor 'blk.2.ffn_up_exps.weight' has shape [8, 64, 64], expected [8, 32, 64]")


def test_unknown_architecture(tmp_path, capsys, monkeypatch):
    p = write_model(tmp_path / "m.gguf", arch="mamba9")
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch),
                     "unknown architecture 'mamba9' (supported: clover-moe, qwen35moe, qwen3next)")


def test_unsupported_quant_type(tmp_path, capsys, monkeypatch):
    p = write_model(tmp_path / "m.gguf", retype={"blk.1.ffn_down_exps.weight": int(Q.IQ4_NL)})
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch),
                     "tensor 'blk.1.ffn_down_exps.weight' has unsupported quant type IQ4_NL "
                     f"(clover supports {SUPPORTED})")


def test_unknown_type_id(tmp_path, capsys, monkeypatch):
    p = write_model(tmp_path / "m.gguf")
    data = bytearray(p.read_bytes())
    name = b"blk.0.ssm_a"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # -> n_dims, ne[0], type
    assert struct.unpack_from("<I", data, at)[0] == 1
    struct.pack_into("<I", data, at + 4 + 8, 99)
    p.write_bytes(bytes(data))
    assert_one_error(run_clover(["inspect", str(p)], capsys, monkeypatch),
                     "m.gguf: tensor 'blk.0.ssm_a' has unknown ggml type id 99")


def test_missing_file(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "nope.gguf"
    assert_one_error(run_clover(["inspect", str(missing)], capsys, monkeypatch),
                     f"model file not found: {missing}")


def test_error_line_through_the_real_entry_point(tmp_path):
    """The same line from `python -m clover_cli` in a fresh process: no traceback, exit code 1."""
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<I", 1) + bytes(32))
    res = subprocess.run([sys.executable, "-m", "clover_cli", "inspect", str(p)], capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 1
    assert res.stdout == ""
    assert res.stderr.strip() == "error: bad.gguf: unsupported GGUF version 1 (supported: 2, 3)"


def _split(tmp_path: Path) -> list[Path]:
    first = write_model(tmp_path / "model.gguf", split_tensors=30, seed=7)
    return sorted(first.parent.glob("model-*-of-00003.gguf"))


def test_split_set_opens_as_one(tmp_path):
    shards = _split(tmp_path)
    assert [s.name for s in shards] == [f"model-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    whole = write_model(tmp_path / "whole.gguf", seed=7)
    with open_gguf(whole) as ref, open_gguf(shards[1]) as split:
        assert split.paths == shards
        assert list(split.tensors) == list(ref.tensors)
        assert {t.shard for t in split.tensors.values()} == {0, 1, 2}
        last = list(ref.tensors)[-1]
        assert split.tensors[last].shard == 2
        for name in ("token_embd.weight", last):
            assert np.array_equal(split.raw(name), ref.raw(name))
        reader = GGUFReader(shards[2])  # oracle: gguf-py's own reader of the last shard
        t = reader.tensors[-1]
        assert np.array_equal(split.raw(t.name).view(np.float32), np.asarray(t.data).reshape(-1))
        a, b = summarize(ref), summarize(split)
        assert (a.n_params, a.n_params_active) == (b.n_params, b.n_params_active)
        assert a.tensor_bytes == b.tensor_bytes
        assert b.shards == [s.name for s in shards]


def test_split_set_missing_shard(tmp_path, capsys, monkeypatch):
    shards = _split(tmp_path)
    shards[2].unlink()
    assert_one_error(run_clover(["inspect", str(shards[0])], capsys, monkeypatch),
                     "split model is incomplete: missing model-00003-of-00003.gguf")


def test_split_set_through_cli(tmp_path, capsys, monkeypatch):
    shards = _split(tmp_path)
    code, out, err = run_clover(["inspect", str(shards[2]), "--tensors"], capsys, monkeypatch)
    assert code == 0, err
    assert "model-00001-of-00003.gguf, model-00002-of-00003.gguf, model-00003-of-00003.gguf" in out
    assert "| shard 3 | blk.3.attn_output.weight" in out


def test_header_from_partial_buffer(tiny):
    """A remote reader fetches the first bytes, learns how many more it needs, and retries."""
    data = tiny.read_bytes()
    n = 64
    while True:
        try:
            header = parse_header(data[:n], name="tiny.gguf")
            break
        except HeaderTruncated as exc:
            assert exc.needed > n
            n = exc.needed
    assert n < header.data_offset + 1
    s = summarize(header, filename="remote")
    with open_gguf(tiny) as m:
        full = summarize(m)
    assert (s.n_params, s.n_params_active, s.tensor_bytes) == (full.n_params, full.n_params_active,
                                                               full.tensor_bytes)
    assert s.file_size is None and s.shards == []


def test_header_problems_raise_model_file_error(tiny):
    with pytest.raises(ModelFileError, match="not a GGUF"):
        parse_header(b"PK\x03\x04" + bytes(60))


def test_real_vocabulary_header_reads_back_the_strings_written(tmp_path_factory):
    """A 248,320-token header (plus its merges) through the one-pass string-array decoder gives back
    the strings the file was written with. (Its speed is a benchmark's business, not a test's:
    timings fail under load.)"""
    path = real_shape_path(tmp_path_factory.getbasetemp())
    tokens, merges = byte_level_vocab(REAL.n_vocab)
    with open_gguf(path) as m:
        assert m.metadata["tokenizer.ggml.tokens"] == tokens
        assert m.metadata["tokenizer.ggml.merges"] == merges
    assert len(tokens) == 248_320


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=12), st.text(max_size=6).map(lambda t: t.encode("utf-8"))), max_size=40))
def test_string_arrays_decode_as_each_string_alone(items):
    """The one-decode fast path gives exactly what decoding each string alone (with replacement
    characters) gives: invalid bytes, NULs, empty strings and sequences split across strings."""
    from clover_runtime.gguf_header import _Cursor

    region = b"".join(struct.pack("<Q", len(x)) + x for x in items)
    assert _Cursor(region).string_array(len(items)) == [x.decode("utf-8", "replace") for x in items]
