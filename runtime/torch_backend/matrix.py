"""A quantized weight matrix (or expert stack) held on a torch device in its GGUF bytes.

A product decodes a tile of rows at a time on the device and multiplies it, so the matrix never
exists in full precision; tiles are sized so that the decoded rows stay a few tens of MB.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ..quants.formats import row_bytes, type_size
from .dequant import dequantize_blocks

TILE_ELEMENTS = 1 << 23  # decoded weights per tile: 32 MB in float32, 16 MB in half precision


class DeviceMatrix:
    """`count` matrices of (n_out, n_in) in one ggml type, uploaded as raw blocks to `device`."""

    def __init__(self, raw: np.ndarray, ggml_type: int, n_out: int, n_in: int, count: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        rb = row_bytes(ggml_type, n_in)
        data = np.ascontiguousarray(np.asarray(raw).reshape(-1).view(np.uint8)).reshape(count, n_out, rb)
        with warnings.catch_warnings():  # the mapped file is read-only; nothing ever writes to it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.blocks = torch.from_numpy(data).to(device)  # on torch's CPU device: the mapping itself
        self.ggml_type, self.n_out, self.n_in, self.count = ggml_type, n_out, n_in, count
        self.dtype = dtype
        self.tile_rows = max(1, min(n_out, TILE_ELEMENTS // n_in))

    def rows(self, expert: int, r0: int, r1: int) -> torch.Tensor:
        """Rows r0:r1 of matrix `expert`, decoded: (r1 - r0, n_in) in the compute dtype."""
        blocks = self.blocks[expert, r0:r1].reshape(-1, type_size(self.ggml_type))
        return dequantize_blocks(blocks, self.ggml_type, self.dtype).reshape(r1 - r0, self.n_in)

    def matmul(self, x: torch.Tensor, expert: int = 0) -> torch.Tensor:
        """x (n, n_in) on the device times matrix `expert` transposed: (n, n_out)."""
        x = x.to(self.dtype)
        if self.tile_rows >= self.n_out:
            return x @ self.rows(expert, 0, self.n_out).T
        out = torch.empty((x.shape[0], self.n_out), dtype=self.dtype, device=x.device)
        for r0 in range(0, self.n_out, self.tile_rows):
            r1 = min(self.n_out, r0 + self.tile_rows)
            out[:, r0:r1] = x @ self.rows(expert, r0, r1).T
        return out

    def moe(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Per-row expert products: ids (n, k), x (n, n_in) or (n, k, n_in) -> (n, k, n_out)."""
        n, k = ids.shape
        xs = x[:, None, :].expand(n, k, self.n_in) if x.dim() == 2 else x
        flat_x, flat_ids = xs.reshape(n * k, self.n_in), ids.reshape(-1)
        out = torch.empty((n * k, self.n_out), dtype=self.dtype, device=x.device)
        for e in torch.unique(flat_ids).tolist():
            sel = torch.nonzero(flat_ids == e, as_tuple=True)[0]
            out[sel] = self.matmul(flat_x[sel], int(e))
        return out.reshape(n, k, self.n_out)
