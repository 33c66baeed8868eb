"""`--decode auto` chooses by seconds (issue 34): the policy on recorded costs, every mode writing
AR's text, and verified sampling drawing from AR's distribution."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from clover_runtime import load_model
from clover_runtime.decoding import BlockEvent, DecodeParams, SamplingParams, calibration, generate, generate_ar
from clover_runtime.decoding.auto import EXPLORE, AutoDecode, Costs, describe
from clover_runtime.decoding.policy import accept_draft, verified_draft
from clover_runtime.decoding.sampling import candidates
from clover_runtime.text.reply import Timings
from synth_models import tiny_model_path

PROMPT = [11, 12, 13, 14, 15]


def simulate(chooser: AutoDecode, n_tokens: int, step_s: float, *blocks: tuple[float, int]) -> dict[str, float]:
    """Drive the chooser with recorded costs: an AR token costs `step_s`, the k-th diffusion block
    costs blocks[k % len(blocks)][0] seconds for [1] tokens. Returns each mode's seconds and tokens."""
    out = {"ar_s": 0.0, "ar_n": 0, "dg_s": 0.0, "dg_n": 0}
    written = k = 0
    while written < n_tokens:
        choice = chooser.next()
        if choice.mode == "ar":
            n = min(choice.tokens, n_tokens - written)
            chooser.record_ar(n * step_s, n)
            out["ar_s"] += n * step_s
            out["ar_n"] += n
            written += n
        else:
            seconds, n = blocks[k % len(blocks)]
            k += 1
            chooser.record_block(seconds, n)
            out["dg_s"] += seconds
            out["dg_n"] += n
            written += n
    return out


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for a chi-square variable: 1 - P(dof/2, x/2), the regularized lower incomplete
    gamma function by its power series (no scipy in the test environment)."""
    a, z = dof / 2, x / 2
    term = total = 1.0 / a
    n = 0
    while term > 1e-15 * total:
        n += 1
        term *= z / (a + n)
        total += term
    return max(0.0, 1.0 - math.exp(a * math.log(z) - z - math.lgamma(a)) * total)


def _speed_vs_ar(run: dict[str, float], step_s: float) -> float:
    return (run["ar_n"] + run["dg_n"]) * step_s / (run["ar_s"] + run["dg_s"])


@pytest.mark.parametrize("n_tokens", [64, 512, 4096])
def test_dear_passes_that_never_agree_cost_at_most_five_percent(n_tokens: int) -> None:
    """The measured CPU case: a 32-row pass costs 13.5 decode steps and a random-weight preview
    never agrees, so a diffusion block (one pass, then the commit) adds one token for ~15 steps."""
    seed = Costs(step_s=0.027, pass_s=0.365)
    run = simulate(AutoDecode(32, seed), n_tokens, 0.027, (0.41, 1))
    assert _speed_vs_ar(run, 0.027) >= 0.95, run
    if n_tokens == 64:
        assert run["dg_n"] == 0  # the first probe waits until it is a small share of the reply


def test_a_file_already_known_to_lose_waits_before_probing_and_backs_off() -> None:
    """The first wait is a probe block's expected excess over AR (0.4 s a token on blocks of 5
    tokens) over EXPLORE, as after a block lost within a reply."""
    seed = Costs(step_s=1.0, pass_s=3.0, relative=1.4, block_tokens=5.0)
    chooser = AutoDecode(32, seed)
    first = chooser.next()
    assert first.mode == "ar" and first.tokens == math.ceil(0.4 * 5 / EXPLORE)
    barely = AutoDecode(32, Costs(step_s=1.0, pass_s=3.0, relative=1.02, block_tokens=5.0))
    assert barely.next().tokens == math.ceil(0.02 * 5 / EXPLORE)  # a near tie is probed again soon
    waits = []
    for _ in range(4):  # each lost probe waits twice as long as the one before
        while chooser.next().mode == "ar":
            chooser.record_ar(32.0, 32)
        chooser.record_block(10.0, 2)
        waits.append(chooser.wait)
    assert waits == [pytest.approx(8 / EXPLORE * 2**k) for k in range(4)]


def test_short_replies_add_up_to_the_next_probe() -> None:
    """The AR time a reply waited is handed to the next reply's chooser (`calibration.waited`), so
    replies shorter than one wait still reach a probe, and a file measured wrongly once is measured again."""
    seed = Costs(step_s=1.0, pass_s=3.0, relative=1.4)
    waited = 0.0
    probes = 0
    for _ in range(10):  # ten replies of 40 tokens; one wait is 100 steps
        chooser = AutoDecode(32, seed, waited)
        written = 0
        while written < 40:
            choice = chooser.next()
            if choice.mode == "diffusion":
                probes += 1
                chooser.record_block(2.0, 8)  # diffusion now wins: four tokens per AR step's second
                break
            n = min(choice.tokens, 40 - written)
            chooser.record_ar(float(n), n)
            written += n
        waited = chooser.waited
        if probes:
            break
    assert probes == 1 and chooser.relative() < 1 and chooser.next().mode == "diffusion"


def test_cheap_passes_that_agree_keep_diffusion() -> None:
    """A GPU-like case: a pass costs 1.2 steps and a block writes 32 tokens in 3 passes + commit."""
    chooser = AutoDecode(32, Costs(step_s=0.01, pass_s=0.012))
    assert chooser.next().mode == "diffusion"
    run = simulate(chooser, 2048, 0.01, (0.05, 32))
    assert run["ar_n"] == 0 and run["dg_n"] >= 2048
    assert chooser.relative() == pytest.approx(0.05 / 32 / 0.01)


def test_nothing_measured_times_three_ar_tokens_then_a_block() -> None:
    chooser = AutoDecode(32, None)
    assert chooser.next().mode == "ar" and chooser.next().tokens == 3  # two of them with a forward
    chooser.record_ar(0.03, 3)
    assert chooser.next().mode == "diffusion"


def test_diffusion_that_starts_losing_hands_over_to_ar_and_probes_again() -> None:
    chooser = AutoDecode(32, Costs(step_s=1.0, pass_s=1.0, relative=0.5))
    assert chooser.next().mode == "diffusion"
    chooser.record_block(8.0, 32)  # 0.25 s per token: diffusion stays
    assert chooser.next().mode == "diffusion"
    chooser.record_block(40.0, 2)  # the text turned hard to guess
    assert chooser.next().mode == "ar"
    run = simulate(chooser, 8000, 1.0, (8.0, 32))  # and easy again: the next probe brings diffusion back
    # the hard block lost (the two blocks' sums: 24.8 s for 16 tokens, with hope 21.9, against
    # AR's 1 s a token), and its excess (38 s) set the wait
    assert run["ar_n"] == math.ceil(38 / EXPLORE)
    assert run["dg_n"] + run["ar_n"] >= 8000


def test_blocks_that_keep_few_and_many_tokens_are_priced_by_their_sums() -> None:
    """The demo's blocks take ~13 ms each and keep 1 to 30 tokens (9 on average: 1.4 ms a token
    against AR's 2.3 ms). Seconds over tokens keeps diffusion; the running mean of each block's
    ratio (6.9 ms a token for blocks of 1 and 17) handed the replies to AR."""
    chooser = AutoDecode(32, Costs(step_s=0.0023, pass_s=0.004))  # a cheap pass: diffusion at once
    run = simulate(chooser, 600, 0.0023, (0.013, 17), (0.013, 1))
    assert run["ar_n"] == 0 and chooser.relative() < 1


def test_an_earlier_reply_s_estimate_outweighs_one_probe_block() -> None:
    """A reply starts from what earlier ones measured (`Costs.relative`, `Costs.block_tokens`): a
    first block that keeps one token does not send a file where diffusion wins back to AR."""
    seed = Costs(step_s=0.0023, pass_s=0.0065, relative=0.6, block_tokens=8.0)
    chooser = AutoDecode(32, seed)
    assert chooser.next().mode == "diffusion"
    chooser.record_block(0.013, 1)
    assert chooser.next().mode == "diffusion" and chooser.relative() < 1
    alone = AutoDecode(32, Costs(step_s=0.0023, pass_s=0.0065, relative=0.6))  # no weight recorded
    alone.record_block(0.013, 1)
    assert alone.next().mode == "ar"


def test_a_reply_is_judged_by_its_blocks_sums_not_by_its_first_block() -> None:
    """The demo's first reply at 2 threads (recorded): a block and its tail drafts kept 11 tokens in
    30.4 ms, the next 20 in 21.6 ms, the last (to the stop) 1 in 7.9 ms: 32 tokens in 60 ms against
    AR's 2.32 ms a token. A running mean that weighs the newest block 0.25 kept the first block as
    most of the estimate (2.5 ms a token) and sent the next replies to AR."""
    chooser = AutoDecode(32, None)
    chooser.record_ar(0.007, 3, step_s=0.00232)
    for seconds, tokens, drafted in ((0.0304, 11, 103), (0.0216, 20, 38), (0.0079, 1, 32)):
        chooser.record_block(seconds, tokens, drafted)
    assert chooser.relative() < 0.9 and chooser.next().mode == "diffusion"
    seed = Costs(chooser.ar_spt, 0.006, chooser.relative(), chooser.dg_tokens)
    assert AutoDecode(32, seed).next().mode == "diffusion"  # the next reply starts in diffusion


def test_two_early_blocks_that_keep_few_tokens_do_not_hand_a_fresh_reply_to_ar() -> None:
    """The demo at 1 thread (recorded): AR steps of 2.79 ms, a reply's first blocks 10.9 ms for 4
    tokens and 10.4 ms for 3. With so few blocks seen, a block may yet keep far more (the demo's
    average is ~7.7), so diffusion goes on; the old rule handed the rest of the reply to AR, and
    auto ran at 1.12x AR where every block diffusion's ran at 1.63x."""
    chooser = AutoDecode(32, None)
    chooser.record_ar(0.0084, 3, step_s=0.00279)
    chooser.record_block(0.0109, 4, 32)
    chooser.record_block(0.0104, 3, 32)
    assert chooser.next().mode == "diffusion"
    run = simulate(chooser, 2000, 0.00279, (0.0109, 4), (0.0104, 3), (0.011, 17), (0.0101, 1), (0.0106, 13))
    assert run["ar_n"] == 0  # 7.6 tokens a block: 1.4 ms a token against AR's 2.79


def test_blocks_that_keep_one_token_still_hand_over_to_ar() -> None:
    """Random weights: a block keeps the one token AR would write. However few blocks were seen,
    one costing 15 steps loses even if a block could keep a quarter of its 32 positions more."""
    chooser = AutoDecode(32, None)
    chooser.record_ar(0.081, 3, step_s=0.027)
    chooser.record_block(0.41, 1, 32)
    assert chooser.next().mode == "ar"


def test_ar_is_priced_by_its_typical_step_not_a_first_slow_one() -> None:
    chooser = AutoDecode(32, None)
    chooser.record_ar(4.7, 2, step_s=0.0023)  # the first step loaded kernels: 4.7 s
    assert chooser.ar_spt == pytest.approx(0.0023) and chooser.waited == pytest.approx(4.7)


def test_a_pass_is_worth_drafting_only_when_it_reveals_what_ar_writes_in_its_time() -> None:
    chooser = AutoDecode(32, Costs(step_s=0.01, pass_s=0.07))
    assert chooser.keep_drafting(7) and not chooser.keep_drafting(6)


def test_the_banner_says_what_auto_does_and_why() -> None:
    assert describe(Costs(0.01, 0.071)) == ("auto: AR on this machine — a preview pass costs 7.1 decode steps; "
                                            "diffusion needs ≥ 7.1 tokens per pass (probed again now and then)")
    assert describe(Costs(0.01, 0.012)).startswith("auto: block diffusion — a preview pass costs 1.2")
    assert "2.0× AR's speed" in describe(Costs(0.01, 0.03, relative=0.5))
    assert "first reply" in describe(None)


def test_verified_draft_keeps_the_revealed_run_or_one_mask() -> None:
    block = np.array([7, 8, 99, 5, 99])
    masked = block == 99
    assert verified_draft(block, masked, 0).tolist() == [7, 8]
    assert verified_draft(np.array([7, 99, 3]), np.array([False, True, False]), 1).tolist() == [7, 99]


def test_accept_draft_is_greedy_ar_at_temperature_zero() -> None:
    logits = np.array([0.1, 2.0, 1.0, -1.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert accept_draft(logits, 1, SamplingParams(), rng) == 1
    assert accept_draft(logits, 2, SamplingParams(), rng) == 1


def test_accept_draft_draws_from_ar_s_distribution() -> None:
    """The rule alone: whatever the draft, the kept-or-resampled token has p's distribution."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float64)).astype(np.float32)
    sp = SamplingParams(temperature=1.0)
    _, p = candidates(logits, sp)
    rng = np.random.default_rng(1)
    for draft in (0, 3):
        counts = np.bincount([accept_draft(logits, draft, sp, rng) for _ in range(4000)], minlength=4)
        chi2 = float((((counts - 4000 * p) ** 2) / (4000 * p)).sum())
        assert chi2 < 16.27, (draft, counts)  # chi-square, 3 degrees of freedom, p = 0.001


@pytest.fixture(scope="module")
def tiny():
    return load_model(tiny_model_path("F32"), n_threads=1)  # one thread: thousands of short generations


def _tokens(model, prompt, **kw):  # noqa: ANN001, ANN202
    events = list(generate(model, prompt, DecodeParams(**kw)))
    return [t for e in events if isinstance(e, BlockEvent) for t in e.token_ids], events[-1].stats


def _write_costs(model, costs: Costs) -> None:  # noqa: ANN001
    """Put a recorded measurement where `--decode auto` reads it (this test session's CLOVER_HOME)."""
    calibration.flush()  # no earlier reply's write lands over this one
    path = calibration.record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data[calibration.model_key(model)] = {"step_s": costs.step_s, "pass_s": costs.pass_s, "relative": costs.relative}
    path.write_text(json.dumps(data), encoding="utf-8")
    calibration._memory.pop(calibration.model_key(model), None)


@pytest.mark.parametrize("costs", [None, Costs(1e-4, 10.0, relative=0.5), Costs(1e-4, 10.0, relative=2.0),
                                   Costs(1.0, 1e-4, relative=0.1)])
@pytest.mark.parametrize("prompt", [PROMPT, [40, 7, 300, 2, 99, 5, 18]])
def test_every_mode_writes_what_greedy_ar_writes(tiny, costs: Costs | None, prompt: list[int]) -> None:
    """Whatever auto measured before (nothing; dear passes it still starts with, so drafting stops
    after the first pass; dear passes that lost, so it starts in AR; cheap passes), greedy auto,
    forced diffusion and AR write the same tokens, and the stats split them by mode."""
    if costs is None:
        calibration.flush()
        calibration.record_path().unlink(missing_ok=True)
        calibration._memory.clear()
    else:
        _write_costs(tiny, costs)
    ar = list(generate_ar(tiny, prompt, max_tokens=70))
    auto, stats = _tokens(tiny, prompt, max_tokens=70, block_length=16)
    forced, _ = _tokens(tiny, prompt, decode="diffusion", max_tokens=70, block_length=16)
    assert auto == ar and forced == ar
    assert stats.ar_tokens + stats.diffusion_tokens == len(ar) and stats.auto_note.startswith("auto:")
    assert calibration.load(tiny) is not None  # the reply's measurements were kept


def test_auto_on_a_model_whose_preview_drafts_well_writes_by_diffusion() -> None:
    """The shipped demo model drafts several tokens of a worked sum per pass: with cheap passes
    recorded, auto writes by diffusion, at more than one token per forward, and AR's text."""
    from clover_runtime.chat import load_chat
    from clover_runtime.demo import demo_path
    from clover_runtime.text.reply import Reply

    chat = load_chat(demo_path(), n_ctx=512, n_threads=1)
    _write_costs(chat.model, Costs(1.0, 1.0, relative=0.2))
    messages = [{"role": "user", "content": "What is 48 + 36?"}]
    replies = {}
    for decode in ("auto", "ar"):
        out = Reply()
        for ev in chat.stream(messages, params=DecodeParams(decode=decode, max_tokens=64),
                              chat_template_kwargs={"enable_thinking": False}):
            out.add(ev)
        replies[decode] = out
    assert replies["auto"].content == replies["ar"].content and "84" in replies["ar"].content
    stats = replies["auto"].stats
    assert stats.diffusion_tokens > stats.ar_tokens and Timings.of(stats).tokens_per_forward > 1.5, stats


def test_verified_sampling_has_ar_s_distribution(tiny) -> None:
    """Chi-square of the first two tokens' joint frequencies under verified diffusion at
    temperature 1 (top-k 4, so 16 cells) against AR's exact probabilities from the model."""
    sp_kw = {"temperature": 1.0, "top_k": 4}
    prompt = [40, 7, 300]
    p1_ids, p1 = candidates(tiny.forward(prompt, last_only=True)[0], SamplingParams(**sp_kw))
    exact: dict[tuple[int, int], float] = {}
    for a, pa in zip(p1_ids.tolist(), p1, strict=True):
        ids, pb = candidates(tiny.forward([*prompt, a], last_only=True)[0], SamplingParams(**sp_kw))
        for b, q in zip(ids.tolist(), pb, strict=True):
            exact[(a, b)] = float(pa * q)
    draws = 2400
    counts: dict[tuple[int, int], int] = dict.fromkeys(exact, 0)
    for seed in range(draws):
        toks, _ = _tokens(tiny, prompt, decode="diffusion", max_tokens=2, block_length=4,
                          sampling=SamplingParams(seed=seed, **sp_kw))
        counts[(toks[0], toks[1])] += 1
    cells = [k for k, v in exact.items() if v * draws >= 5]
    rest = 1.0 - sum(exact[k] for k in cells)
    obs = [counts[k] for k in cells] + [draws - sum(counts[k] for k in cells)]
    exp = [exact[k] * draws for k in cells] + [rest * draws]
    pairs = [(o, e) for o, e in zip(obs, exp, strict=True) if e > 0]
    chi2 = sum((o - e) ** 2 / e for o, e in pairs)
    p_value = chi2_sf(chi2, len(pairs) - 1)
    assert p_value > 0.01, (chi2, obs, exp)


def test_the_costs_record_is_rewritten_when_it_drifts_from_the_file_not_from_the_last_reply(tiny) -> None:
    """Each reply's figures moved 6 % from the last reply's, under the 10 % drift, yet the record was
    rewritten (and fsynced) after every reply; it now changes only once the figures left what it holds."""
    calibration.flush()
    calibration.record_path().unlink(missing_ok=True)
    calibration._memory.clear()
    calibration._written.clear()
    writes = []
    for k in range(6):
        calibration.update(tiny, Costs(0.01 * 1.06**k, 0.02, 0.5))
        calibration.flush()
        writes.append(json.loads(calibration.record_path().read_text(encoding="utf-8"))[
            calibration.model_key(tiny)]["step_s"])
    assert writes == pytest.approx([0.01] * 2 + [0.01 * 1.06**2] * 2 + [0.01 * 1.06**4] * 2)
    assert calibration.load(tiny).step_s == pytest.approx(0.01 * 1.06**5)  # the process uses the newest


def test_a_cut_commit_drafts_the_next_block_from_its_own_tail() -> None:
    """On the demo a draft usually fails at one digit of a sum; the commit's own logits past the
    refusal draft the rest (`policy.reuse_tail`), so some blocks run no preview pass at all, and
    the text is still greedy AR's."""
    from clover_runtime.chat import load_chat
    from clover_runtime.decoding.policy import reuse_tail
    from clover_runtime.demo import demo_path
    from clover_runtime.text.reply import Reply

    assert reuse_tail(False, 1) and not reuse_tail(False, 0) and reuse_tail(True, 2) and not reuse_tail(True, 1)
    chat = load_chat(demo_path(), n_ctx=512, n_threads=1)
    replies = {}
    for decode in ("diffusion", "ar"):
        out = Reply()
        for question in ("What is 47 + 38?", "What is 91 - 56?"):
            for ev in chat.stream([{"role": "user", "content": question}],
                                  params=DecodeParams(decode=decode, max_tokens=96),
                                  chat_template_kwargs={"enable_thinking": False}):
                out.add(ev)
        replies[decode] = out
    assert replies["diffusion"].content == replies["ar"].content
    stats = replies["diffusion"].stats
    assert stats.passes < stats.blocks and stats.corrections > 0, stats


def test_a_block_drafted_by_a_tail_is_not_started_once_cancelled() -> None:
    """A block drafted by the commit's tail runs no preview pass, where the loop looked for a cancel:
    on the demo the block after the first one is such a block, and a cancel set as the first block
    arrives must end the reply there (a server's slot comes back as soon as its client leaves)."""
    import threading

    from clover_runtime.chat import load_chat
    from clover_runtime.demo import demo_path

    chat = load_chat(demo_path(), n_ctx=512, n_threads=1)
    prompt = chat.prepare([{"role": "user", "content": "What is 47 + 38?"}],
                          chat_template_kwargs={"enable_thinking": False}).ids
    full = [e for e in generate(chat.model, prompt, DecodeParams(decode="diffusion", max_tokens=96))]
    assert sum(isinstance(e, BlockEvent) for e in full) > 1 and full[-1].stats.passes < full[-1].stats.blocks
    cancel = threading.Event()
    after: list = []
    for ev in generate(chat.model, prompt, DecodeParams(decode="diffusion", max_tokens=96), cancel=cancel):
        if cancel.is_set():
            after.append(ev)
        elif isinstance(ev, BlockEvent):
            cancel.set()
    assert len(after) == 1 and after[0].stats.finish_reason == "cancelled", after


def test_the_coreset_is_offered_only_where_it_leaves_few_experts_and_kept_only_where_it_pays() -> None:
    """The cost model's coreset (`policy.draft_coreset_size`, `policy.coreset_pays`): 16 of the real
    model's 256 experts; none for the demo's 8 or a dense model; kept only for a pass share ≤ 0.8."""
    from clover_runtime.decoding.policy import CORESET_SHARE, coreset_pays, draft_coreset_size

    assert draft_coreset_size(256, 8) == 16 and draft_coreset_size(32, 2) == 4
    assert draft_coreset_size(8, 2) is None and draft_coreset_size(0, 0) is None
    assert coreset_pays(0.5) and coreset_pays(CORESET_SHARE)
    assert not coreset_pays(0.95) and not coreset_pays(1.0) and not coreset_pays(0.0)
    assert describe(Costs(0.01, 0.071, coreset=16, coreset_share=0.42)).endswith(
        "; drafts route within 16 experts a layer (a pass 0.42× a full one)")
    assert "experts a layer" not in describe(Costs(0.01, 0.071, coreset=0, coreset_share=0.97))


def test_a_reply_leaves_the_record_to_the_writer_thread_and_an_exit_still_lands_it(tiny, tmp_path) -> None:
    """`update` hands the atomic (fsynced) rewrite to a writer thread, so no reply waits on the disk;
    a process that exits right after its last reply still leaves the record on disk."""
    home = tmp_path / "home"
    script = (
        "from clover_runtime import load_model\n"
        "from clover_runtime.decoding import calibration\n"
        "from clover_runtime.decoding.auto import Costs\n"
        f"m = load_model({str(tiny.file.path)!r}, n_threads=1)\n"
        "calibration.update(m, Costs(0.01, 0.02, 0.5))\n"
        "print(calibration.model_key(m))\n"
    )
    env = {**os.environ, "CLOVER_HOME": str(home), "NUMBA_CACHE_DIR": numba.config.CACHE_DIR}  # compiled kernels kept
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    record = json.loads((home / "cache" / calibration.FILE_NAME).read_text(encoding="utf-8"))
    assert record[out.stdout.strip()]["step_s"] == pytest.approx(0.01)
    assert not list((home / "cache").glob("*.tmp"))  # no temporary file left behind


@pytest.fixture(scope="module")
def many_experts():
    """A small Clover model with 32 experts of which a token routes to 2: a coreset of 4 is offered."""
    from clover_runtime.synth import SynthSpec
    from synth_models import model_path

    return load_model(model_path(SynthSpec(n_expert=32, n_expert_used=2)), n_threads=1)


def test_auto_measures_the_coreset_once_and_drafts_within_the_one_it_chose(many_experts) -> None:
    """On a file with many experts the first auto reply measures what a coreset saves a pass and
    keeps the verdict in the record; a record that chose a coreset makes every preview pass route
    within it; either way the text is greedy AR's."""
    model = many_experts
    calibration.flush()
    calibration.record_path().unlink(missing_ok=True)
    calibration._memory.clear()
    calibration._written.clear()
    ar = list(generate_ar(model, PROMPT, max_tokens=40))
    auto, _ = _tokens(model, PROMPT, max_tokens=40, block_length=16)
    assert auto == ar
    measured = calibration.load(model)
    assert measured is not None and measured.coreset in (0, 4) and measured.coreset_share > 0
    calibration.flush()
    entry = json.loads(calibration.record_path().read_text(encoding="utf-8"))[calibration.model_key(model)]
    assert entry["coreset"] == measured.coreset and entry["coreset_share"] == measured.coreset_share

    for chosen in (4, 0):  # cheap passes that won before: every block diffuses
        calibration.update(model, Costs(1.0, 1e-4, relative=0.1, block_tokens=8.0, coreset=chosen,
                                        coreset_share=0.5 if chosen else 0.97))
        auto, stats = _tokens(model, PROMPT, max_tokens=40, block_length=16)
        assert auto == ar and stats.passes > 0
        widest = max(stats.experts_history)
        assert widest <= 4 if chosen else widest > 4
