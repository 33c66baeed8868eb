"""A verified block's commit rounds exactly as AR's one-token steps do (issue 34: greedy diffusion
writes AR's text bit for bit, not just up to float rounding).

A causal forward over up to a block of rows continuing a state must give, row for row, the same
logits, bit for bit, as feeding those tokens one at a time: the Gated DeltaNet layers use the
per-token form, the attention kernel sums each row over exactly the positions it sees, the
activations are chosen by a row's size and the MoE sums each row alone. Checked across the
64-position boundary the causal passes cut at, on one and two kernel threads.
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.loader import load_model
from clover_runtime.synth import SynthSpec
from synth_models import model_path

pytest.importorskip("numba")


@pytest.mark.parametrize("quant,threads", [("Q8_0", 1), ("Q4_K_M", 2)])
def test_a_block_forward_equals_one_token_steps_bit_for_bit(quant: str, threads: int) -> None:
    model = load_model(model_path(SynthSpec.small(quant=quant, n_layer=4)), n_threads=threads)
    assert model.config.attention_layers and model.config.gdn_layers
    rng = np.random.default_rng(7)
    vocab = model.config.n_tokens
    prompt = rng.integers(10, vocab, 45).tolist()
    block = rng.integers(10, vocab, 32).tolist()  # positions 45..76: across the cut at 64
    batched_state = model.new_state(128)
    model.forward(prompt, batched_state, last_only=True)
    stepped_state = batched_state.copy()
    batched = model.forward(block, batched_state)
    stepped = np.stack([model.forward([t], stepped_state, last_only=True)[0] for t in block])
    finite = np.isfinite(stepped)
    assert np.array_equal(batched, stepped), f"max difference {np.abs(batched - stepped)[finite].max()}"
    again = model.forward([block[0]], batched_state, last_only=True)
    assert np.array_equal(again, model.forward([block[0]], stepped_state, last_only=True))  # the states agree too
