"""Synthetic Clover GGUF models with seeded random weights, from a tiny test model to the real shape."""

from .spec import PRESETS, QUANTS, SynthSpec, build_spec
from .weights import TensorPlan, WeightStream, plan_tensors
from .writer import plan_model, write_model

__all__ = [
    "PRESETS", "QUANTS", "SynthSpec", "TensorPlan", "WeightStream", "build_spec", "plan_model", "plan_tensors",
    "write_model",
]
