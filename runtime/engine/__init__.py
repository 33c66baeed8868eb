"""The inference engine: the Clover trunk's causal forward, its sequence state and the preview pass."""

from .model import GDN_PREVIEW_MODES, Model, PreviewResult
from .state import SequenceState
from .weights import BACKENDS, Weights

__all__ = [
    "BACKENDS",
    "GDN_PREVIEW_MODES",
    "Model",
    "PreviewResult",
    "SequenceState",
    "Weights",
]
