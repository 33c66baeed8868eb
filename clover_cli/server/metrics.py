"""Counters behind `GET /metrics`, in Prometheus text format with `clover:` names.

The names mirror llama-server's `llamacpp:*` set where one exists, so existing dashboards need
only a prefix change; tokens per forward and diffusion passes are clover's own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from clover_runtime.text.reply import Timings, Usage


@dataclass
class Metrics:
    requests_total: int = 0
    requests_errors_total: int = 0
    requests_rejected_total: int = 0
    requests_cancelled_total: int = 0
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    forwards_total: int = 0
    passes_total: int = 0
    blocks_total: int = 0
    tokens_ar_total: int = 0
    tokens_diffusion_total: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def record(self, usage: Usage, timings: Timings) -> None:
        """Add one finished generation's usage and timings (exact counts: forwards are counted, not
        rebuilt from a rounded tokens-per-forward)."""
        with self._lock:
            self.prompt_tokens_total += timings.prompt_n
            self.prompt_tokens_cached_total += timings.cache_n
            self.prompt_seconds_total += timings.prompt_ms / 1000.0
            self.tokens_predicted_total += timings.predicted_n
            self.tokens_predicted_seconds_total += timings.predicted_ms / 1000.0
            self.forwards_total += timings.forwards
            self.passes_total += timings.passes
            self.blocks_total += timings.blocks
            self.tokens_ar_total += timings.ar_n
            self.tokens_diffusion_total += timings.diffusion_n

    def render(self, *, processing: int, deferred: int, n_slots: int, n_ctx: int) -> str:
        with self._lock:
            prompt_rate = (self.prompt_tokens_total / self.prompt_seconds_total
                           if self.prompt_seconds_total else 0.0)
            gen_rate = (self.tokens_predicted_total / self.tokens_predicted_seconds_total
                        if self.tokens_predicted_seconds_total else 0.0)
            tpf = self.tokens_predicted_total / self.forwards_total if self.forwards_total else 0.0
            rows = [
                ("requests_total", "counter", "Requests that reached a generation endpoint.",
                 self.requests_total),
                ("requests_errors_total", "counter", "Generation requests that ended in an error.",
                 self.requests_errors_total),
                ("requests_rejected_total", "counter", "Requests refused with 503 (queue full).",
                 self.requests_rejected_total),
                ("requests_cancelled_total", "counter", "Generations stopped by disconnect or timeout.",
                 self.requests_cancelled_total),
                ("prompt_tokens_total", "counter", "Number of prompt tokens processed (prefilled).",
                 self.prompt_tokens_total),
                ("prompt_tokens_cached_total", "counter",
                 "Prompt tokens reused from a slot's prompt cache (not prefilled).", self.prompt_tokens_cached_total),
                ("prompt_seconds_total", "counter", "Prompt processing time.", self.prompt_seconds_total),
                ("tokens_predicted_total", "counter", "Number of generated tokens.",
                 self.tokens_predicted_total),
                ("tokens_predicted_seconds_total", "counter", "Generation time.",
                 self.tokens_predicted_seconds_total),
                ("diffusion_passes_total", "counter", "Forward passes spent on generation.",
                 self.passes_total),
                ("blocks_total", "counter", "Committed diffusion blocks.", self.blocks_total),
                ("tokens_ar_total", "counter", "Generated tokens written by AR (--decode ar, and auto's AR spans).",
                 self.tokens_ar_total),
                ("tokens_diffusion_total", "counter", "Generated tokens committed by block diffusion.",
                 self.tokens_diffusion_total),
                ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", prompt_rate),
                ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", gen_rate),
                ("tokens_per_forward", "gauge", "Generated tokens per forward pass (1.0 for autoregressive).",
                 tpf),
                ("requests_processing", "gauge", "Requests generating now.", processing),
                ("requests_deferred", "gauge", "Requests waiting for a slot (queue depth).", deferred),
                ("n_slots", "gauge", "Parallel sequences (-np).", n_slots),
                ("n_ctx", "gauge", "Total context size (-c).", n_ctx),
            ]
        lines = []
        for name, kind, help_, value in rows:
            lines.append(f"# HELP clover:{name} {help_}")
            lines.append(f"# TYPE clover:{name} {kind}")
            lines.append(f"clover:{name} {_num(value)}")
        return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.6g}"
