"""Decoding: block diffusion and exact autoregressive generation as one event stream."""

from .diffusion import generate, resolve_mode
from .events import BlockEvent, DoneEvent, GenerationStats, PassEvent
from .params import DecodeParams, SamplingParams
from .recommended import recommended_sampling

__all__ = ["BlockEvent", "DecodeParams", "DoneEvent", "GenerationStats", "PassEvent", "SamplingParams", "generate",
           "recommended_sampling", "resolve_mode"]
