"""Seeded fuzzing of the GGUF reader and the model description through the real `clover inspect`
entry point (in-process, as the other CLI tests run it; a sample also as a real subprocess).

Every mutated file must end either as a normal answer (exit 0) or as exactly one `error:` line and
exit code 1: no traceback, no "internal error", within a time limit and under a 2 GiB memory cap.
Categories: truncations, byte flips in each header section, absurd counts and lengths, wrong value
types for every key clover reads, nested arrays, bad offsets and alignment.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from gguf_bytes import (
    ARRAY,
    BOOL,
    FLOAT32,
    FLOAT64,
    INT32,
    INT64,
    RAW,
    STRING,
    UINT8,
    UINT32,
    UINT64,
    Gguf,
    load,
)
from inspect_helpers import run_clover, write_model

SEED = 1604
CASE_LIMIT_S = 10.0
MEMORY_LIMIT = 2 << 30
A = "clover-moe"
READ_KEYS = [f"{A}.{k}" for k in (
    "block_count", "context_length", "embedding_length", "attention.head_count", "attention.head_count_kv",
    "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon",
    "rope.dimension_count", "rope.freq_base", "full_attention_interval", "ssm.group_count",
    "ssm.time_step_rank", "ssm.state_size", "ssm.inner_size", "ssm.conv_kernel", "expert_count",
    "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length",
    "diffusion.block_length", "diffusion.threshold", "diffusion.shift_logits")] + [
    "general.architecture", "general.name", "general.alignment", "general.file_type", "tokenizer.ggml.model",
    "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.mask_token_id", "tokenizer.chat_template", "split.count"]
WRONG_VALUES = [(STRING, "12"), (FLOAT32, float("nan")), (FLOAT64, float("inf")), (FLOAT32, 1.5), (BOOL, 1),
                (INT32, -1), (INT64, -(2**63)), (UINT64, 2**64 - 1), (UINT32, 0), (UINT8, 255),
                (ARRAY, [1, 2, 3]), (ARRAY, ["a"])]
TRIED: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def built_once():
    """Typer rebuilds the click command tree on every call (most of an in-process run's time); the
    tree of our static app is the same each time, so it is built once for the many fuzz cases."""
    import typer.main

    original = typer.main.get_command
    cache: dict[int, object] = {}

    def cached(app):
        if id(app) not in cache:
            cache[id(app)] = original(app)
        return cache[id(app)]

    typer.main.get_command = cached
    yield
    typer.main.get_command = original


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Gguf:
    return load(write_model(tmp_path_factory.mktemp("fuzz-gguf") / "base.gguf"))


@contextmanager
def memory_cap():
    """At most MEMORY_LIMIT more address space than the process has now (Linux)."""
    try:
        import resource
    except ImportError:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (used + MEMORY_LIMIT, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def check(data: bytes, tmp_path: Path, capsys, monkeypatch, category: str, what: str) -> None:
    """One fuzz case: a clean answer or exactly one error line and exit 1, in time and memory."""
    TRIED[category] = TRIED.get(category, 0) + 1
    path = tmp_path / "case.gguf"
    path.write_bytes(data)
    t0 = time.monotonic()
    with memory_cap():
        code, out, err = run_clover(["inspect", str(path)], capsys, monkeypatch)
    took = time.monotonic() - t0
    assert took < CASE_LIMIT_S, f"{what}: took {took:.1f} s"
    assert "Traceback" not in err and "internal error" not in err, f"{what}: {err}"
    if code == 0:
        assert "error:" not in err, f"{what}: {err}"
        return
    lines = err.strip().splitlines()
    assert code == 1 and out == "", f"{what}: exit {code}, out {out[:200]!r}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {err}"


def sections(g: Gguf) -> dict[str, tuple[int, int]]:
    """Byte ranges of the header's parts: fixed fields, key/values, tensor entries, data."""
    kv_end = len(Gguf(g.kvs, [], b"", version=g.version).header())
    head = len(g.header())
    return {"fixed": (0, 24), "metadata": (24, kv_end), "tensor_infos": (kv_end, head),
            "data": (head, len(g.to_bytes()))}


def test_truncations(base, tmp_path, capsys, monkeypatch):
    rng = random.Random(SEED)
    data = base.to_bytes()
    head = len(base.header())
    cuts = [0, 1, 3, 4, 8, 23, 24, head - 1, head, len(data) - 1] + [rng.randrange(head) for _ in range(30)]
    cuts += [rng.randrange(head, len(data)) for _ in range(5)]
    for cut in cuts:
        check(data[:cut], tmp_path, capsys, monkeypatch, "truncation", f"cut at {cut}")


@pytest.mark.parametrize("section", ["fixed", "metadata", "tensor_infos", "data"])
def test_byte_flips(base, tmp_path, capsys, monkeypatch, section):
    rng = random.Random(f"{SEED}-{section}")
    data = base.to_bytes()
    lo, hi = sections(base)[section]
    for _ in range(24 if section != "data" else 6):
        raw = bytearray(data)
        flips = [rng.randrange(lo, hi) for _ in range(rng.choice((1, 1, 2, 8)))]
        for at in flips:
            raw[at] = rng.choice((raw[at] ^ (1 << rng.randrange(8)), 0x00, 0xFF, rng.randrange(256)))
        check(bytes(raw), tmp_path, capsys, monkeypatch, f"flip:{section}", f"{section} flips at {flips}")


def test_absurd_counts_and_lengths(base, tmp_path, capsys, monkeypatch):
    rng = random.Random(SEED + 1)
    data = base.to_bytes()
    kv_end = sections(base)["metadata"][1]
    # every u64 length/count field in the metadata: the key length, string lengths, array counts
    length_fields = [8, 16]
    pos = 24
    for kv in base.kvs:
        length_fields.append(pos)
        pos += len(Gguf([kv], [], b"").header()) - 24
    for _ in range(40):
        at = rng.choice(length_fields + [rng.randrange(24, kv_end - 8)])
        value = rng.choice((2**63 - 1, 2**64 - 1, 2**32, 2**40 + rng.randrange(99), 10**7, 9_999_999))
        raw = bytearray(data)
        raw[at:at + 8] = struct.pack("<Q", value)
        check(bytes(raw), tmp_path, capsys, monkeypatch, "absurd count", f"u64 {value} at {at}")


def test_wrong_value_types(base, tmp_path, capsys, monkeypatch):
    for key in READ_KEYS:
        for vtype, value in WRONG_VALUES:
            etype = None
            if vtype == ARRAY:
                etype = STRING if isinstance(value[0], str) else INT32
            check(base.set(key, vtype, value, etype).to_bytes(), tmp_path, capsys, monkeypatch, "wrong type",
                  f"{key} = {value!r} ({vtype})")


def test_nested_arrays(base, tmp_path, capsys, monkeypatch):
    rng = random.Random(SEED + 2)
    for depth in [2, 4, 5, 6, 50, 2000, 100_000] + [rng.randrange(2, 500) for _ in range(5)]:
        payload = struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQI", UINT32, 1, 7)
        key = rng.choice(["evil.nest", f"{A}.block_count", "tokenizer.ggml.tokens"])
        check(base.set(key, ARRAY, payload, RAW).to_bytes(), tmp_path, capsys, monkeypatch, "nested arrays",
              f"{key} nested {depth} deep")


def test_bad_offsets_and_alignment(base, tmp_path, capsys, monkeypatch):
    rng = random.Random(SEED + 3)
    for vtype, value in [(UINT32, 0), (UINT32, 1), (UINT32, 3), (INT32, -32), (UINT32, 2**31), (UINT64, 2**40),
                         (STRING, "32"), (UINT32, 64), (FLOAT32, 32.0), (UINT32, 16)]:
        check(base.set("general.alignment", vtype, value).to_bytes(), tmp_path, capsys, monkeypatch,
              "offsets/alignment", f"alignment {value!r}")
    for _ in range(20):
        g = load_copy(base)
        i = rng.randrange(len(g.tensors))
        kind = rng.choice(("shift", "swap", "huge", "zero", "dims"))
        if kind == "shift":
            g.tensors[i].offset += rng.choice((1, 4, 31, 32, -32, 4096))
        elif kind == "swap":
            j = rng.randrange(len(g.tensors))
            g.tensors[i].offset, g.tensors[j].offset = g.tensors[j].offset, g.tensors[i].offset
        elif kind == "huge":
            g.tensors[i].offset = 2**64 - 32
        elif kind == "zero":
            g.tensors[i].offset = 0
        else:
            g.tensors[i].ne = [rng.choice((0, 1, 2**31, 2**63)) for _ in range(rng.randrange(1, 6))]
        g.tensors[i].offset %= 2**64
        check(g.to_bytes(), tmp_path, capsys, monkeypatch, "offsets/alignment", f"{kind} tensor {i}")


def load_copy(g: Gguf) -> Gguf:
    from dataclasses import replace

    from gguf_bytes import Tensor

    return replace(g, tensors=[Tensor(t.name, list(t.ne), t.ttype, t.offset) for t in g.tensors])


def test_a_sample_through_a_real_subprocess(base, tmp_path):
    """The installed entry point (`python -m clover_cli`) on a few hostile files: one line, exit 1."""
    root = Path(__file__).resolve().parent.parent
    cases = {"nested.gguf": base.set("evil", ARRAY, struct.pack("<IQ", ARRAY, 1) * 3000, RAW).to_bytes(),
             "layers.gguf": base.set(f"{A}.block_count", UINT64, 2**63 - 1).to_bytes(),
             "cut.gguf": base.to_bytes()[:5000]}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        res = subprocess.run([sys.executable, "-m", "clover_cli", "inspect", str(path)], capture_output=True,
                             text=True, encoding="utf-8", cwd=root, timeout=60)
        assert res.returncode == 1 and res.stdout == ""
        assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error: "), res.stderr


def test_zz_report_counts():
    """Prints the inputs tried per category (run with -s to see them)."""
    print("\nGGUF fuzz inputs per category:", dict(sorted(TRIED.items())), "total", sum(TRIED.values()))
    assert sum(TRIED.values()) > 0 or os.environ.get("PYTEST_XDIST_WORKER")
