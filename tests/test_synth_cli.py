"""`clover make-model` and `python -m clover_runtime.synth`: options reach the file, errors are one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clover_runtime.gguf_file import open_gguf
from clover_runtime.model_config import describe, has_clover_tensors
from clover_runtime.synth.__main__ import main as synth_main
from typer.testing import CliRunner

from clover_cli.app import app

ROOT = Path(__file__).resolve().parent.parent


def _types(path):
    with open_gguf(path) as f:
        return {n: t.type_name for n, t in f.tensors.items()}


def test_make_model_writes_the_requested_model(tmp_path):
    out = tmp_path / "m.gguf"
    res = CliRunner().invoke(app, ["make-model", str(out), "--preset", "small", "--quant", "q4_k_m",
                                   "--layers", "2", "--arch", "qwen35moe", "--seed", "5", "--fused-qkv",
                                   "--tied-output", "--no-clover-tensors", "--no-diffusion-keys"])
    assert res.exit_code == 0, res.output
    assert f"Wrote {out}" in res.stdout and "qwen35moe, 2 layers" in res.stdout
    with open_gguf(out) as f:
        cfg = describe(f)
        assert (cfg.arch, cfg.n_layer, cfg.n_embd) == ("qwen35moe", 2, 256)
        assert f.metadata["general.file_type"] == 15  # MOSTLY_Q4_K_M
        assert "output.weight" not in f.tensors and not has_clover_tensors(cfg, f.tensors)
        assert cfg.diffusion.mask_token_id is None and cfg.diffusion.keys_present == ()
        assert f.tensors["blk.1.ffn_down_exps.weight"].type_name == "Q6_K"
        assert f.tensors["blk.1.ffn_gate_exps.weight"].type_name == "Q4_K"


def test_make_model_real_shape_sparse_and_fallback_note(tmp_path):
    out = tmp_path / "real.gguf"
    args = ["make-model", str(out), "--preset", "real-shape", "--layers", "4", "--sparse"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "(sparse)" in res.stdout
    with open_gguf(out) as f:
        assert describe(f).n_expert == 256
    res = CliRunner().invoke(app, ["make-model", str(tmp_path / "t.gguf"), "--quant", "Q4_K"])
    assert res.exit_code == 0
    assert "fallback type (Q4_K->Q5_0)" in res.stderr
    assert set(_types(tmp_path / "t.gguf").values()) == {"F32", "Q5_0"}


def test_make_model_overwrites_only_its_own_files(tmp_path):
    out = tmp_path / "m.gguf"
    out.write_text("my notes, not a model")
    res = CliRunner().invoke(app, ["make-model", str(out)])
    assert res.exit_code != 0
    assert "already exists and is not a model clover made" in str(res.exception)
    assert out.read_text() == "my notes, not a model"
    assert CliRunner().invoke(app, ["make-model", str(out), "--force"]).exit_code == 0
    assert CliRunner().invoke(app, ["make-model", str(out), "--quant", "Q8_0"]).exit_code == 0
    assert "Q8_0" in _types(out).values()


def test_bad_option_is_one_error_line_and_exit_code_1(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "clover_cli", "make-model", str(tmp_path / "x.gguf"), "--quant", "Q3_K"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"},
    )
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("error: unknown quant 'Q3_K' (choose from F32, F16, BF16")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_python_dash_m_runtime_synth(tmp_path, capsys):
    out = tmp_path / "s.gguf"
    assert synth_main([str(out), "--quant", "Q4_0", "--layers", "8", "--fused-gate-up"]) == 0
    assert "wrote" in capsys.readouterr().out
    with open_gguf(out) as f:
        cfg = describe(f)
        assert cfg.n_layer == 8 and cfg.attention_layers == [3, 7]
        assert "blk.7.ffn_gate_up_exps.weight" in f.tensors
    assert synth_main([str(out), "--preset", "tiny", "--layers", "0"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: invalid synthetic model spec: n_layer must be positive, got 0")
