"""A decode row's attention layer in one compiled call (`kernels.attention_step`) gives the bits
of the step-by-step layer (`engine.steps.causal_layer` with `engine.attention.causal`): the new
row and the K/V it writes, at one and two threads, with the eight-row pass and without, at the
start of a sequence and deeper into it."""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.engine import steps
from clover_runtime.engine.layers import AttentionLayer
from engine_models import one_call_cases, one_call_model, own_copies

pytest.importorskip("clover_runtime.kernels.attention_step")


@one_call_cases
def test_an_attention_layer_in_one_call_has_the_step_by_step_bits(monkeypatch, quant, threads, x8):
    with one_call_model(monkeypatch, quant, threads, x8) as model:
        cfg = model.config
        layers = [L for L in model.layers.values() if isinstance(L, AttentionLayer)]
        assert layers
        rng = np.random.default_rng(threads)
        for prompt in ([], [5, 17, 3, 99, 42, 7, 11, 64, 8]):  # position 0, then a cache to read
            state = model.new_state(64)
            if prompt:
                model.forward(prompt, state)
            model.weights.enter()
            for L in layers:
                plan = model.weights.attention_step(L, cfg)
                assert plan is not None
                x = (rng.standard_normal((1, cfg.n_embd)) * 2).astype(np.float32)
                stepwise, compiled = own_copies(state)
                want = steps.causal_layer(model.ops, L, x, stepwise)
                got = plan.run(x, compiled.n_past, *compiled.kv(L.index))
                np.testing.assert_array_equal(got, want)
                n = state.n_past + 1
                for a, b in zip(compiled.kv(L.index), stepwise.kv(L.index), strict=True):
                    np.testing.assert_array_equal(a[:, :n], b[:, :n])
                assert np.any(compiled.kv(L.index)[0][:, n - 1])  # its key was written
