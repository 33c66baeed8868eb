"""Usage and Timings carry exact counts; rates and shapes are derived from them in one place, and
/metrics counts forwards exactly (no rebuilding from a rounded tokens-per-forward)."""

from __future__ import annotations

from clover_runtime.decoding import GenerationStats
from clover_runtime.text.reply import Timings, Usage

from clover_cli.server.metrics import Metrics


def test_timings_from_stats_keep_the_exact_counts_and_derive_the_rates() -> None:
    stats = GenerationStats(prompt_tokens=40, generated_tokens=7, prompt_ms=200.0, gen_ms=350.0, forwards=3,
                            passes=2, blocks=1, ar_tokens=0, diffusion_tokens=7, diffusion_ms=350.0)
    t = Timings.of(stats, cache_n=16)
    assert (t.prompt_n, t.predicted_n, t.cache_n, t.forwards, t.passes, t.blocks) == (40, 7, 16, 3, 2, 1)
    assert t.prompt_per_second == 200.0 and t.predicted_per_second == 20.0
    body = t.to_json()
    assert body["tokens_per_forward"] == 2.333 and body["forwards"] == 3  # rounded only in the shape
    assert body["predicted_per_token_ms"] == 50.0 and body["diffusion_per_second"] == 20.0
    assert Timings().to_json()["tokens_per_forward"] == 0.0  # nothing generated: no division by zero


def test_usage_adds_and_totals() -> None:
    u = Usage(10, 5, 4) + Usage(3, 2, 0)
    assert u == Usage(13, 7, 4) and u.total_tokens == 20
    assert u.to_json() == {"prompt_tokens": 13, "completion_tokens": 7, "total_tokens": 20, "cached_tokens": 4}


def test_metrics_count_forwards_exactly() -> None:
    m = Metrics()
    # 7 tokens in 3 forwards, then 5 in 3: a rounded ratio (2.333, 1.667) would not sum back to 6
    m.record(Usage(10, 7), Timings(prompt_n=10, predicted_n=7, forwards=3))
    m.record(Usage(10, 5), Timings(prompt_n=10, predicted_n=5, forwards=3))
    assert m.forwards_total == 6 and m.tokens_predicted_total == 12
    text = m.render(processing=0, deferred=0, n_slots=1, n_ctx=512)
    assert "clover:tokens_per_forward 2\n" in text, text
