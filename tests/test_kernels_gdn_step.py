"""A decode row's GDN layer in one compiled call (`kernels.gdn_step`) gives the bits of the
step-by-step layer (`engine.steps.causal_layer`): the new row, the conv ring and the recurrent
state, on every GDN layer of a model, at one and two threads, with the eight-row pass and
without; and a model decodes to the same logits whether its layers take it or not."""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.engine import steps
from clover_runtime.loader import load_model
from engine_models import one_call_cases, one_call_model, own_copies
from synth_models import small_model_path

pytest.importorskip("clover_runtime.kernels.gdn_step")


@one_call_cases
def test_a_gdn_layer_in_one_call_has_the_step_by_step_bits(monkeypatch, quant, threads, x8):
    with one_call_model(monkeypatch, quant, threads, x8) as model:
        cfg = model.config
        state = model.new_state(64)
        model.forward([5, 17, 3, 99, 42, 7, 11, 64, 8], state)  # a state worth continuing
        rng = np.random.default_rng(threads)
        for i in cfg.gdn_layers:
            L = model.layers[i]
            plan = model.weights.gdn_step(L, cfg)
            assert plan is not None
            x = (rng.standard_normal((1, cfg.n_embd)) * 2).astype(np.float32)
            stepwise, compiled = own_copies(state)
            want = steps.causal_layer(model.ops, L, x, stepwise)
            got = plan.run(x, *compiled.gdn(i))
            np.testing.assert_array_equal(got, want)
            for a, b in zip(compiled.gdn(i), stepwise.gdn(i), strict=True):
                np.testing.assert_array_equal(a, b)
            assert not np.array_equal(compiled.gdn(i)[1], state.gdn(i)[1])  # the state did advance


def test_a_model_decodes_alike_with_and_without_the_one_call_layers():
    """A mapped model's layers (gate and up apart) go step by step, a model read into memory
    takes the one-call GDN and attention layers: their decode steps give the same logits."""
    path = small_model_path("Q4_K_M", arch="qwen35moe")
    with load_model(path, n_threads=1, in_memory=False) as mapped, load_model(path, n_threads=1,
                                                                             in_memory=True) as fused:
        cfg = fused.config
        assert all(fused.weights.gdn_step(fused.layers[i], cfg) is not None for i in cfg.gdn_layers)
        assert all(mapped.weights.gdn_step(mapped.layers[i], cfg) is None for i in cfg.gdn_layers)
        attention = [i for i in fused.layers if i not in cfg.gdn_layers]
        assert all(fused.weights.attention_step(fused.layers[i], cfg) is not None for i in attention)
        assert all(mapped.weights.attention_step(mapped.layers[i], cfg) is None for i in attention)
        out = []
        for m in (mapped, fused):
            state = m.new_state(64)
            rows = [m.forward([5, 17, 3, 99], state)]
            rows += [m.forward([t], state, last_only=True) for t in (8, 250, 31, 77)]
            out.append(rows)
        for a, b in zip(*out, strict=True):
            np.testing.assert_array_equal(a, b)
