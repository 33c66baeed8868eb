"""Block geometry of the ggml tensor types: how many bytes a row of a given type occupies.

Sizes come from `gguf.constants.GGML_QUANT_SIZES` (constants only, no quantization code), so that a
new ggml type listed there is at least measurable; `SUPPORTED_TYPES` is what clover can compute with.
"""

from __future__ import annotations

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelFileError

F32 = int(GGMLQuantizationType.F32)
F16 = int(GGMLQuantizationType.F16)
BF16 = int(GGMLQuantizationType.BF16)
Q8_0 = int(GGMLQuantizationType.Q8_0)
Q4_0 = int(GGMLQuantizationType.Q4_0)
Q4_1 = int(GGMLQuantizationType.Q4_1)
Q5_0 = int(GGMLQuantizationType.Q5_0)
Q5_1 = int(GGMLQuantizationType.Q5_1)
Q4_K = int(GGMLQuantizationType.Q4_K)
Q5_K = int(GGMLQuantizationType.Q5_K)
Q6_K = int(GGMLQuantizationType.Q6_K)

SUPPORTED_TYPES: frozenset[int] = frozenset({F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K})

_SIZES: dict[int, tuple[int, int]] = {int(t): (int(b), int(s)) for t, (b, s) in GGML_QUANT_SIZES.items()}
_NAMES: dict[int, str] = {int(t): t.name for t in GGMLQuantizationType}


def _sizes(t: int) -> tuple[int, int]:
    try:
        return _SIZES[int(t)]
    except KeyError:
        raise ModelFileError(f"unknown ggml tensor type id {t}") from None


def type_name(t: int) -> str:
    """The ggml name of a type id ("Q4_K"), or "type<N>" for an id ggml does not define."""
    return _NAMES.get(int(t), f"type{int(t)}")


def block_size(t: int) -> int:
    """Elements per block: a row length must be a multiple of it."""
    return _sizes(t)[0]


def type_size(t: int) -> int:
    """Bytes per block."""
    return _sizes(t)[1]


def row_bytes(t: int, n_cols: int) -> int:
    """Bytes of one row of `n_cols` elements; a row always holds whole blocks."""
    blk, size = _sizes(t)
    if n_cols % blk:
        raise ModelFileError(f"row length {n_cols} is not a multiple of the {type_name(t)} block size {blk}")
    return n_cols // blk * size


def bits_per_weight(t: int) -> float:
    """Storage cost per weight including the block scales (Q4_K: 4.5, Q6_K: 6.5625)."""
    blk, size = _sizes(t)
    return size * 8 / blk


def check_supported(t: int) -> int:
    """Return `t` as an int, or raise the one-line error a user sees for an unsupported quant type."""
    if int(t) not in SUPPORTED_TYPES:
        supported = ", ".join(type_name(s) for s in sorted(SUPPORTED_TYPES))
        raise ModelFileError(f"unsupported quant type {type_name(t)} (clover supports {supported})")
    return int(t)
