"""Quantized tensor formats: geometry, dequantization and encoders for the ggml types clover supports."""

from .dequant import dequantize, dequantize_rows
from .encode import quantize
from .formats import (
    SUPPORTED_TYPES,
    bits_per_weight,
    block_size,
    row_bytes,
    type_name,
    type_size,
)

__all__ = [
    "SUPPORTED_TYPES",
    "bits_per_weight",
    "block_size",
    "dequantize",
    "dequantize_rows",
    "quantize",
    "row_bytes",
    "type_name",
    "type_size",
]
