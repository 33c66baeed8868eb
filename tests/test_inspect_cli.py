"""`clover inspect`: the numbers it reports (checked against hand arithmetic from the doc's shapes),
its gguf_dump-style tables (checked against gguf-py's reader), --json, --template and --fit."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

import pytest
from clover_runtime.gguf_file import open_gguf
from clover_runtime.model_summary import summarize
from gguf import GGUFReader
from gguf.scripts.gguf_dump import dump_metadata
from inspect_helpers import TEMPLATE, expected_verdict, real_shape_path, run_clover, write_model


def real_shape_counts() -> tuple[int, int]:
    """Total and active parameters of the real shape, by hand from docs/architecture.md §1-2."""
    h, vocab, e, f, s = 2048, 248_320, 256, 512, 512
    globals_ = vocab * h + h + vocab * h  # token_embd, output_norm, output
    every_layer = (2 * h + e * h  # two norms, router
                   + 2 * e * f * h + e * h * f  # routed experts gate, up, down
                   + h + 2 * s * h + h * s)  # shared expert gate-input, gate, up, down
    attention = 8192 * h + 512 * h + 512 * h + 256 + 256 + h * 4096
    gdn = 8192 * h + 4096 * h + 32 * h + 32 * h + 32 + 32 + 8192 * 4 + 128 + h * 4096
    clover_only = 8192 * 3 + 32 + 32 + 32
    total = globals_ + 40 * every_layer + 10 * attention + 30 * (gdn + clover_only)
    routed = 40 * 3 * e * f * h
    active = total - vocab * h - routed + routed * 8 // 256
    return total, active


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    return real_shape_path(tmp_path_factory.getbasetemp())


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_model(tmp_path / "tiny.gguf")


def test_real_shape_summary_numbers(real):
    total, active = real_shape_counts()
    assert total == 34_661_350_848 and active == 2_947_169_728  # the arithmetic itself, written out
    with open_gguf(real) as m:
        s = summarize(m)
    assert s.n_params == total
    assert s.n_params_active == active
    assert abs(s.n_params / 1e9 - 34.7) < 0.05 and abs(s.n_params_active / 1e9 - 3.0) < 0.1
    assert s.layers_by_kind == {"gated_deltanet": 30, "full_attention": 10}
    assert s.file_type == "Q4_K_M" and s.clover_tensors and s.diffusion_supported and s.chat_template
    mix = {q.type: q.n_tensors for q in s.quant_mix}
    q6_k = 1 + 10 + 40 + 40  # output, attn_v, ffn_down_exps, ffn_down_shexp
    f32 = 1 + 4 * 40 + 2 * 10 + 10 * 30  # output_norm; norms, router, shexp gate; q/k norms; GDN small ones
    q4_k = 1 + 4 * 40 + 3 * 10 + 3 * 30  # token_embd; gate/up experts and shexp; q, k, out; qkv, gate, out
    assert mix == {"Q4_K": q4_k, "Q6_K": q6_k, "F32": f32}
    assert 21e9 < s.tensor_bytes < 23e9  # the doc's Q4_K_M size range
    assert abs(s.bits_per_weight - 8 * s.tensor_bytes / total) < 1e-9


def test_real_shape_through_cli(real, capsys, monkeypatch):
    total, active = real_shape_counts()
    code, out, err = run_clover(["inspect", str(real), "-c", "4096"], capsys, monkeypatch)
    assert code == 0, err
    assert f"34.66 B total, 2.95 B active per token ({total:,} / {active:,})" in out
    assert "40: 30 Gated DeltaNet + 10 full attention (every 4th)" in out
    assert "KV cache f32 (40.0 KiB/token)" in out
    assert "exact: block 32, threshold 0.9, mask token 248319" in out
    assert "present in all 30 GDN layers (120 tensors)" in out


def test_real_shape_json(real, capsys, monkeypatch):
    total, active = real_shape_counts()
    code, out, err = run_clover(["inspect", str(real), "--json", "-c", "131072", "--cache-type", "f16"], capsys,
                                monkeypatch)
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) >= {"filename", "metadata", "tensors", "summary", "memory"}
    assert doc["summary"]["n_params"] == total and doc["summary"]["n_params_active"] == active
    mem = doc["memory"]
    assert mem["estimate"]["kv_per_token"] == 10 * 2 * 2 * 256 * 2 == 20 * 1024
    assert mem["estimate"]["kv_cache"] == 20 * 1024 * 131072 == int(2.5 * 2**30)
    assert mem["verdict"]["verdict"] == expected_verdict(mem["estimate"], mem["verdict"]["available"])
    assert [r["n_ctx"] for r in mem["table"]] == [4096, 16384, 32768, 65536, 131072]
    tokens = doc["metadata"]["tokenizer.ggml.tokens"]
    assert tokens["type"] == "ARRAY" and tokens["array_types"] == ["STRING"] and tokens["count"] == 248_320
    assert "value" not in tokens
    assert doc["metadata"]["clover-moe.expert_count"] == {"index": 22, "type": "UINT32", "value": 256}
    exps = doc["tensors"]["blk.0.ffn_gate_exps.weight"]
    assert exps["shape"] == [2048, 512, 256] and exps["type"] == "Q4_K"
    assert exps["n_bytes"] == 256 * 512 * 2048 // 256 * 144


def test_metadata_table_matches_gguf_dump(tiny, capsys, monkeypatch):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        dump_metadata(GGUFReader(tiny), argparse.Namespace(no_tensors=True))
    expected = [ln for ln in buf.getvalue().splitlines() if ln.startswith("  ")]
    code, out, err = run_clover(["inspect", str(tiny), "--metadata"], capsys, monkeypatch)
    assert code == 0, err
    start = out.splitlines().index(f"* Dumping {len(expected)} key/value pair(s)")
    ours = out.splitlines()[start + 1:start + 1 + len(expected)]
    for mine, ref in zip(ours, expected, strict=True):
        if "FLOAT32" in ref:  # gguf_dump prints the float64 widening; we print the float32 value
            assert mine.split(" = ")[0] == ref.split(" = ")[0]
            assert float(mine.split(" = ")[1]) == pytest.approx(float(ref.split(" = ")[1]), rel=1e-6)
        else:
            assert mine == ref


def test_tensor_table_matches_reader(tiny, capsys, monkeypatch):
    reader = GGUFReader(tiny)
    code, out, err = run_clover(["inspect", str(tiny), "--tensors"], capsys, monkeypatch)
    assert code == 0, err
    lines = out.splitlines()
    start = lines.index(f"* Dumping {len(reader.tensors)} tensor(s)")
    for line, t in zip(lines[start + 1:], reader.tensors, strict=False):
        idx, rest = line.split(":", 1)
        n, dims, ty, nb, off, name = [c.strip() for c in rest.split("|")]
        assert name == t.name and ty == t.tensor_type.name and int(n) == int(t.n_elements)
        shape = [int(d) for d in dims.split(",")]
        assert shape == list(t.shape) + [1] * (4 - len(t.shape))
        assert int(nb) == int(t.n_bytes) and int(off) == int(t.data_offset)


def test_json_tensors_and_arrays_match_reader(tiny, capsys, monkeypatch):
    reader = GGUFReader(tiny)
    code, out, err = run_clover(["inspect", str(tiny), "--json", "--json-array"], capsys, monkeypatch)
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc["tensors"]) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        entry = doc["tensors"][t.name]
        assert entry["shape"] == [int(d) for d in t.shape] and entry["offset"] == int(t.data_offset)
    field = reader.fields["tokenizer.ggml.tokens"]
    assert doc["metadata"]["tokenizer.ggml.tokens"]["value"] == field.contents()
    assert list(doc["metadata"]) == list(reader.fields)
    assert doc["metadata"]["tokenizer.chat_template"]["value"] == TEMPLATE


def test_template_flag(tiny, tmp_path, capsys, monkeypatch):
    """--template prints the template alone (issue 39), so `> t.jinja` saves exactly it."""
    code, out, err = run_clover(["inspect", str(tiny), "--template"], capsys, monkeypatch)
    assert code == 0 and out == TEMPLATE + "\n" and err == ""
    bare = write_model(tmp_path / "bare.gguf", template=None)
    code, out, err = run_clover(["inspect", str(bare), "--template"], capsys, monkeypatch)
    assert code == 1 and out == "" and err.startswith("error: this file has no chat template")


def test_tied_output_and_missing_clover_parts(tmp_path, capsys, monkeypatch):
    # Tiny shape by hand: h 64, 8 experts of FFN 32 (2 used), vocab 320, 3 GDN + 1 attention layers.
    h, v, e, f = 64, 320, 8, 32
    p = write_model(tmp_path / "tied.gguf", tied=True, clover=False, diffusion_keys=False)
    with open_gguf(p) as m:
        s = summarize(m)
    every = 2 * h + e * h + 3 * e * f * h + h + 3 * 32 * h
    attn = 128 * h + 32 * h + 32 * h + 16 + 16 + h * 64
    gdn = 128 * h + 64 * h + 4 * h + 4 * h + 4 + 4 + 128 * 4 + 16 + h * 64
    total = v * h + h + 4 * every + attn + 3 * gdn
    assert s.n_params == total
    assert s.n_params_active == total - 4 * 3 * e * f * h * 6 // 8  # tied head counts once, as the LM head
    assert s.tied_output and not s.clover_tensors and not s.diffusion_supported
    code, out, err = run_clover(["inspect", str(p)], capsys, monkeypatch)
    assert "not exact (missing: Clover-only tensors, mask token id, diffusion keys)" in out
    assert "output tied to the embedding" in out and "Clover tensors   absent" in out


def test_fit_exit_codes(tiny, capsys, monkeypatch):
    code, out, err = run_clover(["inspect", str(tiny), "-c", "256", "--fit"], capsys, monkeypatch)
    assert code == 0, err
    # -c past the model's context: only the error, never a "fits" before it (issue 39)
    code, out, err = run_clover(["inspect", str(tiny), "-c", "100000000", "-np", "64", "--fit"], capsys,
                                monkeypatch)
    assert code == 1 and out == ""
    assert err.strip() == "error: tiny.gguf: -c 100000000 is larger than the model's context length 4096"
    # 4096 tokens x a million sequences: terabytes of KV cache on any machine.
    code, out, err = run_clover(["inspect", str(tiny), "-c", "4096", "-np", "1000000", "--fit"], capsys,
                                monkeypatch)
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("error: tiny.gguf: does not fit: ")
    code, out, err = run_clover(["inspect", str(tiny), "-c", "100000000", "-np", "64"], capsys, monkeypatch)
    assert code == 0 and "does not fit" in out


def test_fit_json_and_cache_type(tiny, capsys, monkeypatch):
    code, out, err = run_clover(["inspect", str(tiny), "--json", "--cache-type", "q8_0", "-c", "0"], capsys,
                                monkeypatch)
    assert code == 0, err
    mem = json.loads(out)["memory"]
    assert mem["n_ctx"] == 4096 and mem["cache_type"] == "q8_0"
    assert mem["estimate"]["kv_per_token"] == 1 * 2 * (16 + 16) * 34 // 32
    assert [r["n_ctx"] for r in mem["table"]] == [4096]  # capped at the model's 4,096
    code, out, err = run_clover(["inspect", str(tiny), "--cache-type", "q4_0"], capsys, monkeypatch)
    assert code == 2 and err.strip() == "error: unknown --cache-type 'q4_0' (use one of: f32, f16, q8_0)"


def test_default_context_is_16k_capped(real, tiny, capsys, monkeypatch):
    code, out, err = run_clover(["inspect", str(real), "--json"], capsys, monkeypatch)
    assert json.loads(out)["memory"]["n_ctx"] == 16384
    code, out, err = run_clover(["inspect", str(tiny), "--json"], capsys, monkeypatch)
    assert json.loads(out)["memory"]["n_ctx"] == 4096


def test_rich_rendering_on_a_terminal(tiny):
    """On a terminal the same report renders as rich tables (no markup leaks from values)."""
    from clover_runtime.memory_fit import SystemMemory, fit_report
    from rich.console import Console

    from clover_cli import inspect_cmd
    from clover_cli.fit_table import print_pairs, render_fit

    with open_gguf(tiny) as m:
        s = summarize(m)
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=160, color_system=None)
    print_pairs(con, inspect_cmd.summary_pairs(s) + [("odd", "[bold]not markup[/]")])
    report = fit_report(s.config, s.tensor_bytes, 1024, system=SystemMemory(16 << 30, 8 << 30))
    render_fit(report, con)
    text = buf.getvalue()
    assert "[bold]not markup[/]" in text and "┃" in text and "*1,024" in text
    assert "fits: needs" in text


def test_json_from_a_bare_header(tiny):
    """The Hub seam: a header parsed from the first bytes of a file gives the same document."""
    from clover_runtime.gguf_header import parse_header
    from clover_runtime.memory_fit import SystemMemory, fit_report

    from clover_cli import inspect_cmd

    data = tiny.read_bytes()
    header = parse_header(data[:len(data) // 2], name="tiny.gguf")  # the header is far shorter
    s = summarize(header, filename="someone/tiny")
    report = fit_report(s.config, s.tensor_bytes, 2048, system=SystemMemory(8 << 30, 4 << 30))
    doc = inspect_cmd.json_document("someone/tiny", header, s, report)
    with open_gguf(tiny) as m:
        local = inspect_cmd.json_document("tiny.gguf", m, summarize(m), report)
    assert doc["tensors"] == local["tensors"] and doc["metadata"] == local["metadata"]
    assert doc["summary"]["n_params"] == local["summary"]["n_params"]


def test_generator_real_shape_matches_hand_count(tmp_path, capsys, monkeypatch):
    """The project's own generator (clover_runtime.synth) at the real shape reports the same numbers."""
    from clover_runtime import synth

    total, active = real_shape_counts()
    path = synth.write_model(tmp_path / "real.gguf", synth.SynthSpec.real_shape(), sparse=True)
    code, out, err = run_clover(["inspect", str(path), "--json", "-c", "4096"], capsys, monkeypatch)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["summary"]["n_params"], doc["summary"]["n_params_active"]) == (total, active)
    # by default the estimate is what clover allocates: K and V in float32, twice llama.cpp's f16
    assert doc["memory"]["cache_type"] == "f32"
    assert doc["memory"]["estimate"]["kv_per_token"] == 10 * 2 * 2 * 256 * 4 == 40 * 1024
