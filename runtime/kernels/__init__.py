"""Compiled (numba) kernels: fused dequantize-and-multiply for dense and grouped-MoE weights."""

from .jit import kernel_cache_dir, set_threads
from .matmul import matmul, moe_matmul

__all__ = ["kernel_cache_dir", "matmul", "moe_matmul", "set_threads"]
