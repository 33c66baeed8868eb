"""Prefix reuse is exact: what a prompt cache continues equals a cold prefill of the whole sequence.

The reference is always one uninterrupted forward (or preview) from an empty state, a different
path through the engine than restore-from-checkpoint plus a partial prefill.
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime import load_model
from clover_runtime.chat import ChatSession, load_chat
from clover_runtime.decoding import DecodeParams
from clover_runtime.engine.align import ALIGN
from clover_runtime.engine.gdn import CHUNK
from clover_runtime.memory_fit import estimate, gdn_state_bytes
from clover_runtime.prompt_cache import PromptCache, checkpoint_bytes, common_prefix
from clover_runtime.text.reply import ContentDelta, Finished, ReasoningDelta
from synth_models import tiny_model_path

BOUNDARY = 7  # a token id the tests use as the message-boundary marker
TOL = 1e-4


@pytest.fixture(scope="module")
def model():  # noqa: ANN201
    return load_model(tiny_model_path("F32"), backend="numpy")


def _ids(model, n: int, seed: int) -> list[int]:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    return [int(t) if t != BOUNDARY else BOUNDARY + 1 for t in rng.integers(10, model.config.n_tokens, n)]


def _max_abs(got: np.ndarray, want: np.ndarray) -> float:
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite)
    return float(np.max(np.abs(got[finite] - want[finite])))


def _continue_and_compare(model, cache: PromptCache, seq: list[int], tail: list[int]) -> None:  # noqa: ANN001
    """The state holds seq[:-1]: feed the last prompt token and `tail`, compare with a cold pass."""
    assert cache.state.n_past == len(seq) - 1
    assert cache.tokens == seq[:-1]
    got = model.forward(seq[-1:] + tail, cache.state)
    cold = model.forward(seq + tail)[-(1 + len(tail)):]
    assert _max_abs(got, cold) <= TOL


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [6]) == 0


def test_checkpoints_sit_at_aligned_positions(model) -> None:  # noqa: ANN001
    first = _ids(model, 150, seed=1)
    cut = CHUNK + 37  # a boundary in the middle of the second 64-row GDN chunk
    first[cut] = BOUNDARY
    cache = PromptCache(model, 512, checkpoint_every=0, boundary_id=BOUNDARY)
    assert cache.prepare(first).cached == 0
    assert [c.n_past for c in cache.checkpoints] == [ALIGN, 2 * ALIGN]  # at or before the boundary and the end
    second = first[:cut + 3] + _ids(model, 40, seed=2)
    prep = cache.prepare(second)
    assert (prep.cached, prep.prefilled) == (ALIGN, len(second) - 1 - ALIGN)
    _continue_and_compare(model, cache, second, [3, 4, 5])


def test_diverging_one_token_after_a_checkpoint(model) -> None:  # noqa: ANN001
    first = _ids(model, 300, seed=3)
    cache = PromptCache(model, 512, checkpoint_every=128, boundary_id=None)
    cache.prepare(first)
    assert [c.n_past for c in cache.checkpoints] == [128, 256]
    second = first[:129] + [first[129] + 1 if first[129] + 1 < model.config.n_tokens else 10] + first[130:]
    prep = cache.prepare(second)
    assert prep.cached == 128
    assert [c.n_past for c in cache.checkpoints] == [128, 256]  # 256 retaken on the new path
    _continue_and_compare(model, cache, second, [9])


def test_extension_and_repeat_resume_at_the_aligned_checkpoint(model) -> None:  # noqa: ANN001
    """A reply's tokens were computed by decoding, not by a prefill: they are prefilled again."""
    prompt = _ids(model, 150, seed=4)
    cache = PromptCache(model, 512, checkpoint_every=0)
    cache.prepare(prompt)
    reply = [11, 12, 13]
    model.forward(prompt[-1:] + reply, cache.state)  # what a generation commits
    cache.finish(prompt, reply)
    assert cache.n_cached == len(prompt) + len(reply)
    longer = prompt + reply + _ids(model, 20, seed=5)
    prep = cache.prepare(longer)
    assert prep.cached == 2 * ALIGN
    _continue_and_compare(model, cache, longer, [])
    again = cache.prepare(longer)  # the same prompt again: resume at the checkpoint before its end
    assert again.cached == 2 * ALIGN and again.prefilled == len(longer) - 1 - 2 * ALIGN
    _continue_and_compare(model, cache, longer, [20, 21])


def test_no_reuse_and_unrelated_prompt_start_cold(model) -> None:  # noqa: ANN001
    prompt = _ids(model, 70, seed=6)
    cache = PromptCache(model, 256, checkpoint_every=0)
    cache.prepare(prompt)
    assert cache.prepare(prompt, reuse=False).cached == 0
    assert [c.n_past for c in cache.checkpoints] == [ALIGN]
    other = _ids(model, 25, seed=7)
    assert cache.reusable(other) == 0
    assert cache.prepare(other).cached == 0
    _continue_and_compare(model, cache, other, [1])


def test_checkpoint_count_is_bounded(model) -> None:  # noqa: ANN001
    cache = PromptCache(model, 512, max_checkpoints=3, checkpoint_every=20)  # rounded up to ALIGN
    cache.prepare(_ids(model, 300, seed=8))
    assert [c.n_past for c in cache.checkpoints] == [128, 192, 256]
    assert cache.checkpoint_bytes == 3 * gdn_state_bytes(model.config)


def test_preview_after_cached_prefix_equals_cold(model) -> None:  # noqa: ANN001
    """Diffusion mode: the preview pass over a block reads the restored state exactly."""
    assert model.has_clover_tensors
    first = _ids(model, 90, seed=9)
    first[70] = BOUNDARY
    cache = PromptCache(model, 512, checkpoint_every=0, boundary_id=BOUNDARY)
    cache.prepare(first)
    second = first[:72] + _ids(model, 15, seed=10)
    assert cache.prepare(second).cached == ALIGN
    model.forward(second[-1:], cache.state)
    cold = model.new_state(512)
    model.forward(second, cold)
    block = [model.config.n_tokens - 1] * 4 + [12, 13]
    for mode in ("clover", "causal"):
        got = model.preview(block, cache.state, gdn_preview=mode).logits
        want = model.preview(block, cold, gdn_preview=mode).logits
        assert _max_abs(got, want) <= TOL


def test_checkpoint_bytes_in_memory_fit(model) -> None:  # noqa: ANN001
    cfg = model.config
    per = checkpoint_bytes(cfg)
    assert per == cfg.n_gdn_layers * 4 * (cfg.ssm_v_heads * cfg.ssm_state * cfg.ssm_v_dim
                                          + (cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim)
    base = estimate(cfg, 0, 256, 2, ctx_checkpoints=0)
    est = estimate(cfg, 0, 256, 2, ctx_checkpoints=5)
    assert est.checkpoints == 2 * 5 * per
    assert est.total == base.total + 2 * 5 * per


# ---- a conversation through the chat session ---------------------------------------------------

def _turn(session: ChatSession, messages: list[dict], params: DecodeParams, cache) -> tuple[str, Finished]:  # noqa: ANN001
    text, done = [], None
    for ev in session.stream(messages, params=params, cache=cache):
        if isinstance(ev, (ContentDelta, ReasoningDelta)):
            text.append(ev.text)
        elif isinstance(ev, Finished):
            done = ev
    assert done is not None
    return "".join(text), done


@pytest.mark.parametrize("decode", ["ar", "diffusion"])
def test_conversation_text_identical_with_and_without_cache(decode: str) -> None:
    session = load_chat(tiny_model_path("F32"), n_ctx=1024, backend="numpy")
    params = DecodeParams(decode=decode, max_tokens=12, block_length=4)
    cache = session.new_cache(checkpoint_every=0)
    messages: list[dict] = [{"role": "system", "content": "You are terse. " * 8}]
    cached_seen = []
    for i, question in enumerate(["Hello there", "And then?", "One more"]):
        messages.append({"role": "user", "content": question})
        cold_text, cold = _turn(session, messages, params, None)
        warm_text, warm = _turn(session, messages, params, cache)
        assert warm_text == cold_text
        assert warm.usage.prompt_tokens == cold.usage.prompt_tokens
        assert warm.timings.cache_n == warm.usage.cached_tokens
        assert warm.timings.prompt_n == warm.usage.prompt_tokens - warm.usage.cached_tokens
        cached_seen.append(warm.usage.cached_tokens)
        messages.append({"role": "assistant", "content": warm_text or f"ok {i}"})
    ids = session.tokenizer.encode(session.render(messages[:3]))
    assert cached_seen[0] == 0
    assert all(c >= len(ids) // 2 for c in cached_seen[1:]), cached_seen


# ---- saved states ------------------------------------------------------------------------------

def test_saved_state_resumes_exactly_in_another_cache(model, tmp_path) -> None:  # noqa: ANN001
    from clover_runtime import state_file

    first = _ids(model, 140, seed=11)
    first[90] = BOUNDARY
    cache = PromptCache(model, 512, checkpoint_every=40, boundary_id=BOUNDARY)
    cache.prepare(first)
    path = tmp_path / "s.state"
    assert state_file.save(cache, path, extra={"note": "é"}) > 0
    other = PromptCache(model, 300, checkpoint_every=40, boundary_id=BOUNDARY)
    assert state_file.load(other, path).extra == {"note": "é"}
    assert other.tokens == first[:-1] and other.n_cached == len(first) - 1
    assert [c.n_past for c in other.checkpoints] == [c.n_past for c in cache.checkpoints] == [64, 128]
    _continue_and_compare(model, other, first, [4, 5])  # the state itself
    second = first[:95] + _ids(model, 10, seed=12)
    assert other.prepare(second).cached == 64  # a restored checkpoint
    _continue_and_compare(model, other, second, [6])


def test_saved_state_is_refused_for_another_model(model, tmp_path) -> None:  # noqa: ANN001
    from clover_runtime import state_file

    cache = PromptCache(model, 256)
    cache.prepare(_ids(model, 20, seed=13))
    path = tmp_path / "s.state"
    state_file.save(cache, path)
    other_model = load_model(tiny_model_path("Q8_0"), backend="numpy")
    with pytest.raises(state_file.StateFileError, match="saved with another model file"):
        state_file.load(PromptCache(other_model, 256), path)
    junk = tmp_path / "junk.state"
    junk.write_text('{"messages": []}', encoding="utf-8")
    with pytest.raises(state_file.StateFileError, match="not a clover saved state"):
        state_file.load(cache, junk)
    small = PromptCache(model, 16)
    with pytest.raises(state_file.StateFileError, match="more than this context"):
        state_file.load(small, path)


def test_boundary_checkpoint_is_the_last_one_before_the_given_role(model) -> None:  # noqa: ANN001
    ids = _ids(model, 400, seed=14)
    role = [3, 4]
    for p in (80, 200, 320):
        ids[p] = BOUNDARY
    ids[81:83] = role  # `<|im_start|>assistant` at 80 and 240; 200 and 320 begin another role's message
    ids[241:243] = role
    ids[240] = BOUNDARY
    cache = PromptCache(model, 512, checkpoint_every=0, boundary_id=BOUNDARY, boundary_next=role)
    cache.prepare(ids)
    assert [c.n_past for c in cache.checkpoints] == [192, 384]  # 240 and the end (399), aligned down
    any_role = PromptCache(model, 512, checkpoint_every=0, boundary_id=BOUNDARY)
    any_role.prepare(ids)
    assert [c.n_past for c in any_role.checkpoints] == [320, 384]
