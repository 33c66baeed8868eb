"""The engine against transformers' Qwen3_5MoeForCausalLM: an oracle that shares none of our code.

A tiny random model is written to GGUF by the test's own converter (tests/hf_oracle.py: names,
norm + 1, ssm_a = -exp(A_log), tiled value heads), so a mistake shared by the engine and the
slow reference (both written from clover-model.md) still shows up here.
"""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.engine import generate_ar, load_model
from engine_models import oracle_model, token_ids
from hf_oracle import TinyShape, build_hf_model, random_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3_5MoeForCausalLM"):  # a hard failure: the oracle must not silently vanish
    raise ImportError(f"transformers {transformers.__version__} lacks Qwen3_5MoeForCausalLM (need 5.x)")

SHAPE = TinyShape()  # hidden 64, 4 layers (attention at layer 3), GDN 2 key / 4 value heads, 8 experts top-2
N_TOKENS = 240


@pytest.fixture(scope="module")
def hf_model():  # noqa: ANN201
    torch.manual_seed(0)
    return build_hf_model(SHAPE, random_weights(SHAPE, seed=0))


@pytest.fixture(scope="module")
def ids() -> list[int]:
    return token_ids(N_TOKENS, SHAPE.n_tokens, seed=11)


@pytest.fixture(scope="module")
def hf_logits(hf_model, ids) -> np.ndarray:  # noqa: ANN001
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("fused", [False, True])
def test_logits_match_transformers(tmp_path, hf_logits, ids, fused: bool) -> None:  # noqa: ANN001
    model = load_model(oracle_model(tmp_path, "F32", fused=fused, shape=SHAPE), backend="numpy")
    got = model.forward(ids)
    diff = float(np.max(np.abs(got - hf_logits)))
    print(f"max |logit diff| vs transformers over {N_TOKENS} tokens: {diff:.3g}")
    assert diff <= 1e-3
    assert np.array_equal(got.argmax(axis=1), hf_logits.argmax(axis=1))


def test_greedy_generation_matches_transformers(tmp_path, hf_model, ids) -> None:  # noqa: ANN001
    prompt = ids[:20]
    mask = torch.ones(1, len(prompt), dtype=torch.long)
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt]), attention_mask=mask, max_new_tokens=32,
                                do_sample=False)
    want = out[0, len(prompt):].tolist()
    model = load_model(oracle_model(tmp_path, "F32", shape=SHAPE), backend="numba")
    assert list(generate_ar(model, prompt, max_tokens=32)) == want
