"""The inference engine: the Clover trunk's causal forward, its sequence state and the preview pass."""

from .generate_ar import generate_ar
from .model import GDN_PREVIEW_MODES, Model, PreviewResult, load_model
from .sampling import sample_token
from .state import SequenceState
from .weights import BACKENDS, Weights

__all__ = [
    "BACKENDS",
    "GDN_PREVIEW_MODES",
    "Model",
    "PreviewResult",
    "SequenceState",
    "Weights",
    "generate_ar",
    "load_model",
    "sample_token",
]
