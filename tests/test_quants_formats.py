"""Block geometry and error handling of clover_runtime.quants, checked against gguf's constants."""

from __future__ import annotations

import numpy as np
import pytest
from clover_runtime.errors import ModelFileError
from clover_runtime.quants import (
    SUPPORTED_TYPES,
    bits_per_weight,
    block_size,
    dequantize,
    dequantize_rows,
    quantize,
    row_bytes,
    type_name,
    type_size,
)
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

EXPECTED = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}


def test_supported_set_is_the_eleven_types():
    assert {type_name(t) for t in SUPPORTED_TYPES} == EXPECTED
    assert all(GGMLQuantizationType(t).name == type_name(t) for t in SUPPORTED_TYPES)


@pytest.mark.parametrize("t", sorted(SUPPORTED_TYPES), ids=type_name)
def test_geometry_matches_gguf(t):
    qt = GGMLQuantizationType(t)
    assert (block_size(t), type_size(t)) == GGML_QUANT_SIZES[qt]
    n_cols = 2048
    assert row_bytes(t, n_cols) == quant_shape_to_byte_shape((3, n_cols), qt)[-1]
    assert bits_per_weight(t) == pytest.approx(8 * type_size(t) / block_size(t))


def test_bits_per_weight_of_the_common_types():
    # From the block layouts: Q4_K = 144 bytes / 256, Q6_K = 210 / 256, Q8_0 = 34 / 32.
    assert bits_per_weight(GGMLQuantizationType.Q4_K) == 4.5
    assert bits_per_weight(GGMLQuantizationType.Q6_K) == 6.5625
    assert bits_per_weight(GGMLQuantizationType.Q8_0) == 8.5
    assert bits_per_weight(GGMLQuantizationType.BF16) == 16.0


def test_unknown_and_unsupported_types():
    assert type_name(999) == "type999"
    with pytest.raises(ModelFileError, match="unknown ggml tensor type id 999"):
        block_size(999)
    q2k = int(GGMLQuantizationType.Q2_K)
    assert row_bytes(q2k, 256) == 84  # listed, measurable, but not computable
    with pytest.raises(ModelFileError, match=r"^unsupported quant type Q2_K \(clover supports"):
        dequantize(np.zeros(84, np.uint8), q2k, (1, 256))
    with pytest.raises(ModelFileError, match="unsupported quant type IQ2_XS"):
        quantize(np.zeros((1, 256), np.float32), GGMLQuantizationType.IQ2_XS)


def test_row_length_not_a_multiple_of_the_block():
    with pytest.raises(ModelFileError, match="row length 100 is not a multiple of the Q4_K block size 256"):
        row_bytes(GGMLQuantizationType.Q4_K, 100)
    with pytest.raises(ValueError, match="not a multiple of the Q8_0 block size 32"):
        quantize(np.zeros((2, 48), np.float32), GGMLQuantizationType.Q8_0)


def test_wrong_byte_count_is_a_model_file_error():
    t = GGMLQuantizationType.Q4_0
    with pytest.raises(ModelFileError, match="expected 36 bytes of tensor data, got 35"):
        dequantize(np.zeros(35, np.uint8), t, (2, 32))
    with pytest.raises(ModelFileError, match="not whole rows"):
        dequantize_rows(np.zeros(35, np.uint8), t, 32, slice(0, 1))


def test_non_finite_values_are_refused_by_block_formats():
    x = np.ones((1, 32), np.float32)
    x[0, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite values to Q4_0"):
        quantize(x, GGMLQuantizationType.Q4_0)
    # F16/BF16 represent non-finite values themselves.
    bf16 = GGMLQuantizationType.BF16
    assert np.isnan(dequantize(quantize(x, bf16), bf16, (1, 32))[0, 3])
