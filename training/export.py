"""Write a trained demo model as a GGUF through clover's own writer (`clover_runtime.synth`).

The model's `SynthSpec` gives the metadata (architecture, shapes, the diffusion keys), its
tensors are stored with the writer's quant plan (norms, conv taps, router and the Clover-only
scalars stay F32), and the trained vocabulary and the Qwen3.6 chat template replace the synthetic
ones. With the Clover-only tensors, the diffusion keys and a mask token, `--decode auto` picks
exact block diffusion. The same weights give the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from clover_runtime.synth import SynthSpec
from clover_runtime.synth.writer import write_model
from clover_runtime.text.vocab import VocabArrays

NAME = "clover-demo"
DESCRIPTION = "clover's demo model: a tiny Clover model trained by training/train.py"


def export(tensors: dict[str, np.ndarray], spec: SynthSpec, vocab: VocabArrays, path: str | Path,
           quant: str = "F16") -> Path:
    """Write `tensors` (GGUF names, float32 numpy shapes) as a `quant` GGUF at `path`."""
    out = spec.with_(quant=quant, name=NAME, clover_tensors=True, diffusion_keys=True, chat_template=True)
    return write_model(path, out, tensors_override=tensors, vocab=vocab, description=DESCRIPTION)
