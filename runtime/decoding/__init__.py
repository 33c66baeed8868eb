"""Decoding: block diffusion and exact autoregressive generation as one event stream."""

from .diffusion import generate, generate_ar, resolve_mode
from .events import BlockEvent, DoneEvent, GenerationStats, PassEvent
from .params import DecodeParams, SamplingParams

__all__ = ["BlockEvent", "DecodeParams", "DoneEvent", "GenerationStats", "PassEvent", "SamplingParams", "generate",
           "generate_ar", "resolve_mode"]
