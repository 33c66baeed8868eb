"""Decoding: block diffusion and exact autoregressive generation as one event stream."""

from .diffusion import generate, generate_ar, resolve_mode
from .events import BlockEvent, DoneEvent, GenerationStats, PassEvent, TokenLogprob
from .params import DecodeParams, SamplingParams
from .recommended import recommended_sampling
from .sampling import log_softmax, token_logprob

__all__ = ["BlockEvent", "DecodeParams", "DoneEvent", "GenerationStats", "PassEvent", "SamplingParams",
           "TokenLogprob", "generate", "generate_ar", "log_softmax", "recommended_sampling", "resolve_mode",
           "token_logprob"]
