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


def test_lazily_read_logits_equal_the_forward_bit_for_bit() -> None:
    """`forward_rows` (a verified commit's pass) computes a row's logits only when it is read,
    eight rows at a time, and each equals `forward`'s row bit for bit, across the cut between
    prefill chunks too; rows nobody reads cost no head product."""
    from clover_runtime.engine.model import HEAD_ROWS

    model = load_model(model_path(SynthSpec.small(quant="Q4_K_M", n_layer=4)), n_threads=1)
    model.prefill_chunk = 16  # the 21 rows below then arrive in two pieces: 10 + 11
    rng = np.random.default_rng(3)
    prompt = rng.integers(10, model.config.n_tokens, 6).tolist()
    block = rng.integers(10, model.config.n_tokens, 21).tolist()
    eager_state = model.new_state(64)
    model.forward(prompt, eager_state, last_only=True)
    lazy_state = eager_state.copy()
    eager = model.forward(block, eager_state)
    lazy = model.forward_rows(block, lazy_state)
    assert len(lazy) == 21 and lazy.computed == 0
    assert np.array_equal(lazy[0], eager[0]) and lazy.computed == HEAD_ROWS
    assert np.array_equal(lazy[-1], eager[-1]) and lazy.computed == HEAD_ROWS + 3  # 18..20 (piece 2 starts at 10)
    assert all(np.array_equal(lazy[i], eager[i]) for i in range(21))
    assert lazy.computed == 21
    again = model.forward([block[0]], lazy_state, last_only=True)
    assert np.array_equal(again, model.forward([block[0]], eager_state, last_only=True))  # the same state
