"""Decoding: block diffusion and exact autoregressive generation as one event stream."""

from .diffusion import generate, generate_ar, resolve_mode
from .events import BlockEvent, DoneEvent, GenerationStats, PassEvent
from .params import DecodeParams, SamplingParams
from .recommended import recommended_sampling

__all__ = ["BlockEvent", "DecodeParams", "DoneEvent", "GenerationStats", "PassEvent", "SamplingParams", "generate",
           "generate_ar", "recommended_sampling", "resolve_mode"]
