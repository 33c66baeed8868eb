"""Dequantization of GGUF blocks on a torch device, written from the ggml block layouts.

The GGUF bytes are uploaded as they are (a uint8 tensor of whole blocks) and decoded on the
device just before a product, a tile of rows at a time, so no full-precision copy of a weight
ever exists. Every decoder takes the blocks as (n_blocks, type_size) uint8 and returns
(n_blocks, block_size) in `dtype`; the numpy decoders in `clover_runtime.quants` and gguf-py's
are the oracles the tests compare against.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..quants.formats import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, type_name

Decoder = Callable[[torch.Tensor, torch.dtype], torch.Tensor]


def _f16(b: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte `start` of every block, as float32 (n_blocks, 1)."""
    return b[:, start:start + 2].contiguous().view(torch.float16).float()


def _nibbles_32(qs: torch.Tensor) -> torch.Tensor:
    """32-weight blocks: element j is the low nibble of byte j (j < 16), element j + 16 its high one."""
    return torch.cat([qs & 15, qs >> 4], dim=1)


def _bits_32(qh: torch.Tensor) -> torch.Tensor:
    """Bit i (0..31) of the little-endian 4-byte field qh, as (n_blocks, 32) uint8."""
    shifts = torch.arange(8, device=qh.device, dtype=torch.uint8)
    return ((qh[:, :, None] >> shifts) & 1).reshape(qh.shape[0], 32)


def _q8_0(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (b[:, 2:34].contiguous().view(torch.int8).float() * _f16(b, 0)).to(dtype)


def _q4_0(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return ((_nibbles_32(b[:, 2:18]).float() - 8.0) * _f16(b, 0)).to(dtype)


def _q4_1(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (_nibbles_32(b[:, 4:20]).float() * _f16(b, 0) + _f16(b, 2)).to(dtype)


def _q5_0(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    q = _nibbles_32(b[:, 6:22]) | (_bits_32(b[:, 2:6]) << 4)
    return ((q.float() - 16.0) * _f16(b, 0)).to(dtype)


def _q5_1(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    q = _nibbles_32(b[:, 8:24]) | (_bits_32(b[:, 4:8]) << 4)
    return (q.float() * _f16(b, 0) + _f16(b, 2)).to(dtype)


def _k_scales_mins(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12-byte Q4_K/Q5_K field: eight 6-bit scales and eight 6-bit mins. Scales/mins 0-3 are
    the low 6 bits of bytes 0-3 / 4-7; 4-7 take their low nibble from bytes 8-11 (scale: low
    nibble, min: high nibble) and their top two bits from bits 6-7 of bytes 0-3 / 4-7."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = torch.cat([lo & 63, (hi & 15) | ((lo >> 6) << 4)], dim=1)
    mins = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=1)
    return scales.float(), mins.float()


def _k_affine(b: torch.Tensor, q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """d·scale_j·q − dmin·min_j over the eight 32-weight sub-blocks j; q is (n, 8, 32)."""
    n = b.shape[0]
    scales, mins = _k_scales_mins(b[:, 4:16])
    scale = (_f16(b, 0) * scales)[:, :, None]
    minimum = (_f16(b, 2) * mins)[:, :, None]
    return (q.float() * scale - minimum).reshape(n, 256).to(dtype)


def _q4_k(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # four 32-byte groups, each two sub-blocks: the low nibbles, then the high nibbles
    qs = b[:, 16:144].reshape(-1, 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], dim=2).reshape(-1, 8, 32)
    return _k_affine(b, q, dtype)


def _q5_k(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # as Q4_K, and bit j of qh[l] is the fifth bit of element l of sub-block j
    qs = b[:, 48:176].reshape(-1, 4, 1, 32)
    low = torch.cat([qs & 15, qs >> 4], dim=2).reshape(-1, 8, 32)
    shifts = torch.arange(8, device=b.device, dtype=torch.uint8)[None, :, None]
    high = (b[:, 16:48][:, None, :] >> shifts) & 1
    return _k_affine(b, low | (high << 4), dtype)


def _q6_k(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # two halves of 128 weights: ql (64 bytes) holds quarters 0-1 as low nibbles and 2-3 as high
    # nibbles; qh (32 bytes) the top two bits of quarter k at bits 2k; an int8 scale per 16 weights
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 1, 64)
    low = torch.cat([ql & 15, ql >> 4], dim=2).reshape(n, 2, 4, 32)
    shifts = torch.tensor([0, 2, 4, 6], device=b.device, dtype=torch.uint8)[None, None, :, None]
    high = (b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3
    q = (low | (high << 4)).float() - 32.0
    scale = b[:, 192:208].contiguous().view(torch.int8).float() * _f16(b, 208)
    return (q.reshape(n, 16, 16) * scale[:, :, None]).reshape(n, 256).to(dtype)


def _f16_blocks(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return b.contiguous().view(torch.float16).to(dtype)


def _bf16_blocks(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return b.contiguous().view(torch.bfloat16).to(dtype)


def _f32_blocks(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return b.contiguous().view(torch.float32).to(dtype)


DECODERS: dict[int, Decoder] = {
    F32: _f32_blocks, F16: _f16_blocks, BF16: _bf16_blocks, Q8_0: _q8_0, Q4_0: _q4_0, Q4_1: _q4_1,
    Q5_0: _q5_0, Q5_1: _q5_1, Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k,
}


def dequantize_blocks(blocks: torch.Tensor, ggml_type: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n_blocks, type_size) uint8 blocks of one ggml type -> (n_blocks, block_size) values."""
    decode = DECODERS.get(int(ggml_type))
    if decode is None:
        raise ValueError(f"no device decoder for {type_name(ggml_type)}")
    return decode(blocks, dtype)
