"""Compiled (numba) kernels: fused dequantize-and-multiply for dense and grouped-MoE weights, the
chunked Gated DeltaNet used for prefill and its token-by-token form for decode."""

from . import attention_step, gdn_step, moe_step
from .attention import attend_cache
from .gdn import gdn_chunked, gdn_mixer, gdn_recurrent
from .gdn_inputs import conv_heads
from .jit import default_threads, kernel_cache_dir, set_threads
from .matmul import Matrices, Routes, matmul, moe_matmul, prepare
from .q8 import quantize_rows

__all__ = ["Matrices", "Routes", "attend_cache", "attention_step", "conv_heads", "default_threads", "gdn_chunked",
           "gdn_mixer", "gdn_recurrent", "gdn_step", "kernel_cache_dir", "matmul", "moe_matmul", "moe_step",
           "prepare", "quantize_rows", "set_threads"]
