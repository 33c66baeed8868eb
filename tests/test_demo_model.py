"""The shipped demo model (`clover_runtime/demo`, trained by training/train.py): named `demo`
everywhere a model is accepted, recorded in its manifest, and really trained: it answers held-out
sums (never trained on; the held-out set comes from the training seed) in AR mode, and reveals
several tokens per diffusion pass; with clover's checked commits (the default) diffusion answers
exactly as AR does, at issue 15's 90 %. Unchecked diffusion (the vendor's decoder) is far less
accurate: the figure asserted for it is the shipped file's measured floor, so that a worse file
cannot be shipped unnoticed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "training"))

import corpus as demo_corpus  # noqa: E402
import eval as demo_eval  # noqa: E402
from clover_runtime.chat import load_chat  # noqa: E402
from clover_runtime.demo import DEMO_FILE, demo_path  # noqa: E402
from clover_runtime.gguf_file import open_gguf  # noqa: E402
from clover_runtime.hub import resolve_model  # noqa: E402

MANIFEST = ROOT / "training" / "demo-manifest.json"
SEED = 0  # the seed the shipped file was trained from (the manifest says so too)
N_PAIRS = 40


@pytest.fixture(scope="module")
def held_out() -> demo_corpus.Corpus:
    return demo_corpus.make_corpus(SEED, arithmetic_pairs=1, repeats=1)


@pytest.fixture(scope="module")
def chat():
    return load_chat("demo", n_ctx=2048)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "COLUMNS": "120"}
    env.pop("CLOVER_DEBUG", None)
    return env


def _clover(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], input="", capture_output=True, text=True,
                          env=_env(tmp_path), timeout=300)


def test_demo_names_the_shipped_file_which_is_small_and_diffusion_ready() -> None:
    path = resolve_model("demo")
    assert path == demo_path() and path.name == DEMO_FILE
    assert resolve_model(" Demo ") == path
    assert path.stat().st_size <= 15_000_000
    with open_gguf(path) as f:
        md = f.metadata
        assert any(k.endswith(".diffusion.block_length") for k in md)
        assert any(name.endswith("ssm_bd_scale") for name in f.tensors), "the Clover-only tensors are shipped"


def test_manifest_describes_the_shipped_file() -> None:
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    assert manifest["file"] == DEMO_FILE and manifest["seed"] == SEED
    assert manifest["sha256"] == hashlib.sha256(demo_path().read_bytes()).hexdigest()
    assert "training/train.py" in manifest["command"]


def test_held_out_arithmetic_in_both_modes_and_tokens_per_forward(chat, held_out: demo_corpus.Corpus) -> None:
    pairs = held_out.held_out_arithmetic
    pairs = pairs[:: len(pairs) // N_PAIRS][:N_PAIRS]
    ar = demo_eval.arithmetic(chat, pairs, "ar", 128)
    assert ar["accuracy"] >= 0.9, ar
    assert ar["tokens_per_forward"] <= 1.0 + 1e-9
    diffusion = demo_eval.arithmetic(chat, pairs, "diffusion", 128)  # commits checked: clover's default
    assert (diffusion["accuracy"], diffusion["exact"]) == (ar["accuracy"], ar["exact"]), (diffusion, ar)
    assert diffusion["tokens_per_forward"] >= 2.5, diffusion  # issue 15's target; 2.77 measured on these 40
    unchecked = demo_eval.arithmetic(chat, pairs, "diffusion", 128, verify=False)  # as the vendor decodes
    assert unchecked["tokens_per_forward"] >= 2.5, unchecked  # a confident model, unlike random weights
    # unchecked blocks follow float rounding chaotically: 7.5 % on these 40 since the attention kernel
    # sums scores lane by lane (10 % before), 10.8 % against 11.7 % over 120 sums; the seventh file 15 %
    assert unchecked["accuracy"] >= 0.05, unchecked


def test_chat_rows_count_every_turn_and_question(chat, held_out: demo_corpus.Corpus) -> None:
    """eval.py's chat rows: three-turn chats of held-out sums with the model's own replies as
    history, each turn scored once (right, or listed among the misses with its question), and
    held-out out-of-scope questions scored against the refusal."""
    pairs = held_out.held_out_arithmetic[::100][:6]
    ar = demo_eval.follow_ups(chat, pairs, "ar", 128)
    assert ar["chats"] == 2 and len(ar["turn_right"]) == len(ar["turn_earlier_numbers"]) == 3
    assert round(sum(ar["turn_right"]) * 2) + len(ar["misses"]) == 6, ar
    follow = demo_corpus.FOLLOW_UPS
    expected = {1: {demo_corpus.arithmetic_question(*pairs[0]), demo_corpus.arithmetic_question(*pairs[3])},
                2: {follow[0].format(a=a, op=op, b=b) for a, op, b in (pairs[1], pairs[4])},
                3: {follow[1].format(a=a, op=op, b=b) for a, op, b in (pairs[2], pairs[5])}}
    assert all(m["question"] in expected[m["turn"]] for m in ar["misses"]), ar["misses"]
    questions = held_out.held_out_refusals[:3]
    refused = demo_eval.refusals(chat, questions, "ar", 64)
    assert refused["n"] == 3 and round(refused["right"] * 3) + len(refused["misses"]) == 3, refused


@pytest.mark.parametrize("extra", [[], ["--decode", "ar", "-sys", demo_corpus.SYSTEM]])
def test_clover_run_demo_prints_the_worked_answer(tmp_path: Path, extra: list[str]) -> None:
    """The README's main command (block diffusion, no system prompt), and AR with the system prompt."""
    res = _clover(["run", "demo", "What is 48 + 36?", "--no-think", *extra], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == demo_corpus.arithmetic_answer(48, "+", 36), res.stdout


def test_inspect_and_pull_know_the_demo(tmp_path: Path) -> None:
    res = _clover(["inspect", "demo", "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["summary"]["diffusion_supported"] is True and doc["summary"]["clover_tensors"] is True
    assert doc["summary"]["filename"] == "demo"
    res = _clover(["pull", "demo"], tmp_path)
    assert res.returncode == 0 and "ships with clover" in res.stdout, res.stderr
