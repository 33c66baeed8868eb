"""The demo model's torch side (training/): the training pass against clover's decoder, the export.

Skipped without torch (the `train` extra); tests/test_training_engine_match.py covers the engine
side without it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "training"))

import corpus as demo_corpus  # noqa: E402
import engine_fixture  # noqa: E402
import vocab as demo_vocab  # noqa: E402
from clover_runtime.decoding import policy  # noqa: E402
from clover_runtime.decoding.diffusion import resolve_mode  # noqa: E402
from clover_runtime.decoding.params import DecodeParams  # noqa: E402
from clover_runtime.loader import load_model  # noqa: E402
from clover_runtime.model_config import supports_exact_diffusion  # noqa: E402
from clover_runtime.synth.writer import write_model  # noqa: E402
from export import export  # noqa: E402
from model import CloverLM  # noqa: E402
from objectives import IGNORE, Example, losses, make_batch  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A seeded fixture-shaped torch model and the same model loaded by clover (F32)."""
    torch.manual_seed(1)
    model = CloverLM(engine_fixture.fixture_spec())
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.2)
    for layer in model.layers:
        layer.mixer.chunk = 8  # sequences of 22-30 rows span several chunks; block starts fall inside them
    path = write_model(tmp_path_factory.mktemp("demo") / "tiny.gguf", model.spec, tensors_override=model.gguf_tensors())
    with load_model(path, backend="numpy") as engine:
        yield model, engine


def test_the_fixture_script_reproduces_the_committed_fixture() -> None:
    built = engine_fixture.build()
    with np.load(engine_fixture.FIXTURE) as committed:
        assert sorted(committed.files) == sorted(built)
        for key, value in built.items():
            if key.startswith("w_") or key.endswith(("_ids", "_prefix", "_block")) or key == "spec":
                assert np.array_equal(committed[key], value), key
            else:
                np.testing.assert_allclose(committed[key], value, atol=1e-5, err_msg=key)


def _batch(engine, gen: torch.Generator):  # noqa: ANN001, ANN202
    rng = np.random.default_rng(2)
    bos = engine.config.diffusion.mask_token_id - 9
    ex = [Example(tuple(int(t) for t in rng.integers(0, bos, 30)), ((5, 12), (18, 29))),
          Example(tuple(int(t) for t in rng.integers(0, bos, 22)), ((3, 22),))]
    return make_batch(ex, 8, engine.config.diffusion.mask_token_id, bos, gen)


def test_training_blocks_are_clovers_preview_passes(tiny) -> None:  # noqa: ANN001
    """Every block of a training batch, run in one batched pass over the clean sequences, gives the
    logits of clover's preview pass over that block after its clean prefix."""
    model, engine = tiny
    batch = _batch(engine, torch.Generator().manual_seed(0))
    assert batch.starts.tolist() == [[5, 18, 26], [3, 11, 19]]
    with torch.no_grad():
        _, block_logits = model(batch.ids, batch.blocks, batch.starts)
    for b in range(2):
        for n, start in enumerate(batch.starts[b].tolist()):
            state = engine.new_state(64)
            engine.forward(batch.ids[b, :start].numpy(), state)
            want = engine.preview(batch.blocks[b, n].numpy(), state, gdn_preview="clover").logits
            assert np.abs(block_logits[b, n].numpy() - want).max() < 1e-3


def test_diffusion_loss_uses_the_rows_clover_reads(tiny) -> None:  # noqa: ANN001
    """The diffusion loss is the cross-entropy of the rows `policy.logit_rows_for` picks from
    clover's preview (shifted alignment), over masked positions other than the first, each
    weighted by 1/rate of its block, per predicted position; the causal
    loss covers exactly the assistant tokens."""
    model, engine = tiny
    batch = _batch(engine, torch.Generator().manual_seed(3))
    with torch.no_grad():
        parts = losses(model, batch)
    terms, positions = [], 0
    for b in range(2):
        for n, start in enumerate(batch.starts[b].tolist()):
            positions += int(batch.valid[b, n]) * (batch.blocks.shape[-1] - 1)
            masked = np.flatnonzero(batch.masked[b, n].numpy()).tolist()
            rows, _ = policy.logit_rows_for(masked, shift_logits=True)
            if not rows:
                continue
            state = engine.new_state(64)
            engine.forward(batch.ids[b, :start].numpy(), state)
            logits = engine.preview(batch.blocks[b, n].numpy(), state, logit_rows=rows, gdn_preview="clover").logits
            targets = batch.block_targets[b, n].numpy()[[r + 1 for r in rows]]
            logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
                - logits.max(1, keepdims=True)
            terms += list(-logp[np.arange(len(rows)), targets] / float(batch.rate[b, n]))  # ELBO weight 1/rate
    assert len(terms) > 5
    assert abs(float(parts["diffusion"]) - float(np.sum(terms)) / positions) < 1e-3
    kept = (batch.ar_targets[0] != IGNORE).nonzero().reshape(-1).tolist()
    assert kept == list(range(4, 11)) + list(range(17, 28))


def test_export_is_byte_reproducible_and_selects_exact_diffusion(tmp_path: Path) -> None:
    dialogues = demo_corpus.make_corpus(1, arithmetic_pairs=60, repeats=1).train
    tok = demo_vocab.train_tokenizer([t for d in dialogues for t, _ in demo_corpus.segments(d)], 512)
    arrays = demo_vocab.vocab_arrays(tok)
    spec = engine_fixture.fixture_spec().with_(n_vocab=len(arrays.tokens))
    for quant in ("F16", "Q8_0"):
        files = []
        for run in range(2):
            torch.manual_seed(7)
            files.append(export(CloverLM(spec).gguf_tensors(), spec, arrays, tmp_path / f"{run}-{quant}.gguf", quant))
        assert files[0].read_bytes() == files[1].read_bytes()
        with load_model(files[0]) as m:
            assert supports_exact_diffusion(m.config, m.file.tensors)
            assert resolve_mode(m, DecodeParams())[0] == "diffusion"
            assert m.config.diffusion.mask_token_id == arrays.special["mask"]
            assert m.file.metadata["general.name"] == "clover-demo"


def test_a_short_training_run_is_reproducible_from_its_seed(tmp_path: Path) -> None:
    """train.py twice with the same seed and step count (names of vocabulary pieces, echo
    dialogues, results stated first, a causal-only warm-up, a copy phase and a final phase without
    the echoes): the same GGUF bytes; the loss of every phase is logged, and the manifest's command
    names every option that changed what was trained."""
    import ship
    import train

    args = ["--seed", "4", "--steps", "3", "--log-every", "1", "--arithmetic-pairs", "40", "--repeats", "1",
            "--hidden", "64", "--expert-ff", "32", "--vocab-size", "512", "--batch-tokens", "1024", "--threads", "1",
            "--name-pieces", "--echoes", "3", "--result-first", "--copy-steps", "2", "--copy-others", "5",
            "--warmup-steps", "2", "--warmup-dialogues", "20", "--final-steps", "2"]
    for run in ("a", "b"):
        assert train.main([*args, "--out", str(tmp_path / run)]) == 0
    for quant in ("F16", "Q8_0"):
        first = (tmp_path / "a" / f"demo-{quant}.gguf").read_bytes()
        assert first == (tmp_path / "b" / f"demo-{quant}.gguf").read_bytes()
    log = json.loads((tmp_path / "a" / "train-log.json").read_text(encoding="utf-8"))
    phases = ["warmup"] * 2 + ["main"] * 3 + ["copy"] * 2 + ["final"] * 2
    assert [(r["step"], r["phase"]) for r in log["log"]] == list(enumerate(phases, 1))
    assert [r["diffusion"] == 0 for r in log["log"]] == [p == "warmup" for p in phases]
    assert log["main_steps"] == 3
    assert log["commit"] is None or re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", log["commit"]), log["commit"]
    shipped = ship.manifest(tmp_path / "a", tmp_path / "a" / "demo-Q8_0.gguf")
    assert shipped["training_commit"] == log["commit"]
    command = shipped["command"]
    rerun = command.split(" && ")[0].split()[2:]
    assert rerun[:4] == ["--seed", "4", "--steps", "3"]
    assert train.parse_args(rerun) == train.parse_args([*args, "--log-every", "20", "--out", "build/demo"])


def test_a_shared_prompt_runs_once_and_changes_nothing(tiny) -> None:  # noqa: ANN001
    """Rows that share a prompt (the tool prompt of every weather dialogue) run it once as a batch
    of one; each row's causal and block rows, and the gradients of the causal and diffusion
    losses, are those of the row run on its own."""
    from model import shared_prefix

    model, engine = tiny
    rng = np.random.default_rng(5)
    bos = engine.config.diffusion.mask_token_id - 9
    prompt = tuple(int(t) for t in rng.integers(0, bos, 14))
    ex = [Example(prompt + tuple(int(t) for t in rng.integers(0, bos, n)), ((16, 14 + n),)) for n in (12, 9, 16)]
    batch = make_batch(ex, 8, engine.config.diffusion.mask_token_id, bos, torch.Generator().manual_seed(1))
    assert shared_prefix(batch.ids, batch.starts) == 14

    def rows(ids, blocks, starts):  # noqa: ANN001, ANN202
        model.zero_grad()
        x, xn, _ = model.hidden_states(ids, blocks, starts)
        (x.square().mean() + xn.square().mean()).backward()
        return x.detach(), xn.detach(), [p.grad.clone() for p in model.parameters()]

    x, xn, grads = rows(batch.ids, batch.blocks, batch.starts)
    alone = [rows(batch.ids[b:b + 1], batch.blocks[b:b + 1], batch.starts[b:b + 1]) for b in range(3)]
    for b, (xb, xnb, _) in enumerate(alone):
        assert torch.allclose(x[b], xb[0], atol=1e-5) and torch.allclose(xn[b], xnb[0], atol=1e-5)
    for g, *per_row in zip(grads, *(a[2] for a in alone), strict=True):
        assert torch.allclose(g, sum(per_row) / 3, atol=1e-5, rtol=1e-4)


def test_complementary_masks_predict_every_position_once(tiny) -> None:  # noqa: ANN001
    """With `complementary`, each block appears twice, under a mask and under its complement."""
    _, engine = tiny
    rng = np.random.default_rng(2)
    bos = engine.config.diffusion.mask_token_id - 9
    ex = [Example(tuple(int(t) for t in rng.integers(0, bos, 30)), ((5, 29),))]
    batch = make_batch(ex, 8, engine.config.diffusion.mask_token_id, bos, torch.Generator().manual_seed(0), True)
    nb = batch.starts.shape[1] // 2
    assert torch.equal(batch.starts[:, :nb], batch.starts[:, nb:])
    assert torch.equal(batch.masked[:, :nb] ^ batch.masked[:, nb:], batch.valid[:, :nb, None].expand(-1, -1, 8))
    assert torch.allclose(batch.rate[:, nb:], (1 - batch.rate[:, :nb]).clamp_min(1 / 8))


def test_answers_to_a_tool_count_the_weighted_number_of_times(tiny) -> None:  # noqa: ANN001
    """With `answer_weight` W, each causal row and each block of a span marked as answering a
    tool's result counts W times: the weighted losses equal the unweighted ones plus W - 1 more
    of those rows' (and blocks') terms, and the logged `answer` loss is those rows' mean."""
    model, engine = tiny
    rng = np.random.default_rng(2)
    bos = engine.config.diffusion.mask_token_id - 9
    ex = [Example(tuple(int(t) for t in rng.integers(0, bos, 30)), ((5, 12), (18, 29)), (1,)),
          Example(tuple(int(t) for t in rng.integers(0, bos, 22)), ((3, 22),))]
    batch = make_batch(ex, 8, engine.config.diffusion.mask_token_id, bos, torch.Generator().manual_seed(3), True)
    assert batch.ar_answer.nonzero().tolist() == [[0, r] for r in range(17, 28)]
    assert batch.block_answer.tolist() == [[False, True, True] * 2, [False] * 6]
    with torch.no_grad():
        x, _, _ = model.hidden_states(batch.ids)
        ce = torch.nn.functional.cross_entropy(model.logits(x[0, 17:28]), batch.ar_targets[0, 17:28], reduction="sum")
        plain = losses(model, batch)
        weighted = losses(model, batch, answer_weight=4.0)
        answer_only = losses(model, _only_blocks(batch, batch.block_answer))
    n_rows = int((batch.ar_targets != IGNORE).sum())
    assert abs(float(plain["answer"]) - float(ce) / 11) < 1e-5
    assert abs(float(weighted["ar"]) - (float(plain["ar"]) + 3 * float(ce) / n_rows)) < 1e-5
    positions = int(batch.valid.sum()) * 7
    extra = float(answer_only["diffusion"]) * int(batch.block_answer.sum()) * 7 / positions
    assert extra > 0
    assert abs(float(weighted["diffusion"]) - (float(plain["diffusion"]) + 3 * extra)) < 1e-4


def _only_blocks(batch, keep):  # noqa: ANN001, ANN202
    """The batch with only the `keep` blocks valid (the others predict nothing)."""
    from dataclasses import replace

    return replace(batch, valid=batch.valid & keep, masked=batch.masked & keep[..., None])


def test_the_final_answer_of_a_tool_dialogue_is_the_one_marked() -> None:
    from tokenizers import decoders
    from train import tokenize

    corpus = demo_corpus.make_corpus(1, arithmetic_pairs=20, repeats=1)
    tok = demo_vocab.train_tokenizer([t for d in corpus.train for t, _ in demo_corpus.segments(d)], 512)
    tok.decoder = decoders.ByteLevel()
    for d, e in zip(corpus.train, tokenize(corpus.train, tok), strict=True):
        if d.kind in ("weather", "calculator"):
            assert e.answers == (1,) and len(e.spans) == 2
            start, end = e.spans[1]
            assert tok.decode(list(e.ids[start:end]), skip_special_tokens=False).endswith(
                d.messages[-1]["content"] + "<|im_end|>")
        else:
            assert e.answers == ()


def test_with_calls_weighted_the_tool_call_is_marked_too() -> None:
    """`--weight-tool-calls` marks the assistant piece that calls the tool (its arguments copy
    the question's city or expression) as well as the answer, and nothing in other dialogues."""
    from tokenizers import decoders
    from train import tokenize

    corpus = demo_corpus.make_corpus(1, arithmetic_pairs=20, repeats=1)
    tok = demo_vocab.train_tokenizer([t for d in corpus.train for t, _ in demo_corpus.segments(d)], 512)
    tok.decoder = decoders.ByteLevel()
    kinds = set()
    for d, e in zip(corpus.train, tokenize(corpus.train, tok, calls=True), strict=True):
        if d.kind in ("weather", "calculator"):
            kinds.add(d.kind)
            assert e.answers == (0, 1)
            start, end = e.spans[0]
            call = tok.decode(list(e.ids[start:end]), skip_special_tokens=False)
            assert call.count("<tool_call>") == 1 and d.messages[-3]["tool_calls"][0]["function"]["name"] in call
        else:
            assert e.answers == ()
    assert kinds == {"weather", "calculator"}
