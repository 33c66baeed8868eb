"""Block geometry of the ggml tensor types: how many bytes a row of a given type occupies.

Sizes come from the table the header parser uses (`gguf_file.GGML_TYPES`); a type id missing
there is looked up in gguf-py's constants, imported only then (importing the `gguf` package costs
~0.15 s of every start), so that a new ggml type is at least measurable. `SUPPORTED_TYPES` is what
clover can compute with.
"""

from __future__ import annotations

from ..errors import ModelFileError
from ..gguf_header import GGML_TYPES

_IDS = {name: t for t, (name, _, _) in GGML_TYPES.items()}
F32 = _IDS["F32"]
F16 = _IDS["F16"]
BF16 = _IDS["BF16"]
Q8_0 = _IDS["Q8_0"]
Q4_0 = _IDS["Q4_0"]
Q4_1 = _IDS["Q4_1"]
Q5_0 = _IDS["Q5_0"]
Q5_1 = _IDS["Q5_1"]
Q4_K = _IDS["Q4_K"]
Q5_K = _IDS["Q5_K"]
Q6_K = _IDS["Q6_K"]

SUPPORTED_TYPES: frozenset[int] = frozenset({F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K})


def _entry(t: int) -> tuple[str, int, int] | None:
    """(name, elements per block, bytes per block) of a type id, or None when no table lists it."""
    entry = GGML_TYPES.get(t)
    if entry is not None:
        return entry
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        qt = GGMLQuantizationType(t)
        blk, size = GGML_QUANT_SIZES[qt]
    except (ImportError, ValueError, KeyError):
        return None
    return qt.name, int(blk), int(size)


def _sizes(t: int) -> tuple[int, int]:
    entry = _entry(int(t))
    if entry is None:
        raise ModelFileError(f"unknown ggml tensor type id {t}")
    return entry[1], entry[2]


def type_name(t: int) -> str:
    """The ggml name of a type id ("Q4_K"), or "type<N>" for an id ggml does not define."""
    entry = _entry(int(t))
    return entry[0] if entry is not None else f"type{int(t)}"


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
