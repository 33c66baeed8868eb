"""The GGUF header: its value types, the tensor table, and a direct parser over any buffer.

`gguf.GGUFReader` builds a Python object per array element and needs ~14 s for a file with the
real 248,320-token vocabulary; this parser reads the header with `struct` over a buffer (a fraction
of a second). It parses any buffer, so the Hub code runs it on the first megabytes of a remote file
fetched with range requests, and `gguf_file` on a mapped file.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types.
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL = range(8)
T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(8, 13)

_SCALAR_FORMATS = {
    T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I", T_INT32: "<i",
    T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q", T_FLOAT64: "<d",
}
_NUMPY_DTYPES = {
    T_UINT8: np.uint8, T_INT8: np.int8, T_UINT16: np.uint16, T_INT16: np.int16, T_UINT32: np.uint32,
    T_INT32: np.int32, T_FLOAT32: np.float32, T_BOOL: np.bool_, T_UINT64: np.uint64, T_INT64: np.int64,
    T_FLOAT64: np.float64,
}
VALUE_TYPE_NAMES = {
    T_UINT8: "UINT8", T_INT8: "INT8", T_UINT16: "UINT16", T_INT16: "INT16", T_UINT32: "UINT32",
    T_INT32: "INT32", T_FLOAT32: "FLOAT32", T_BOOL: "BOOL", T_STRING: "STRING", T_ARRAY: "ARRAY",
    T_UINT64: "UINT64", T_INT64: "INT64", T_FLOAT64: "FLOAT64",
}

# ggml tensor types: (name, elements per block, bytes per block). Known so that any file can be
# listed; which of them the engine can compute with is decided in `clover_runtime.quants`.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}

# llama.cpp's limits (GGML_MAX_DIMS, GGML_MAX_NAME); nested arrays are not GGUF llama.cpp can read at
# all, so a little depth is tolerated for gguf-py files and more is a corrupt or hostile header.
MAX_DIMS = 4
MAX_NAME_BYTES = 63
MAX_ARRAY_DEPTH = 4
MAX_ALIGNMENT = 1 << 20
_INTEGER_TYPES = (T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_UINT64, T_INT64)

SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


class HeaderTruncated(Exception):
    """The buffer ended inside the header; a remote reader fetches more bytes and retries."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"header needs at least {needed} bytes")
        self.needed = needed


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as listed in a header. `shape` is numpy order (GGUF `ne` reversed)."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # absolute byte offset inside its shard file
    n_bytes: int
    shard: int = 0

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, (f"type{self.ggml_type}", 1, 1))[0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def ne(self) -> tuple[int, ...]:
        """Dimensions in GGUF order (fastest-varying first), as gguf_dump prints them."""
        return tuple(reversed(self.shape))


@dataclass
class GGUFHeader:
    """Everything before the tensor data of one GGUF file."""

    version: int
    metadata: dict[str, Any]
    value_types: dict[str, tuple[int, int | None]]  # key -> (type, array element type)
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int
    header_size: int


def _tensor_nbytes(name: str, ggml_type: int, shape: tuple[int, ...], file: str = "file") -> int:
    if ggml_type not in GGML_TYPES:
        raise ModelFileError(f"{file}: tensor '{name}' has unknown ggml type id {ggml_type}")
    _, block, size = GGML_TYPES[ggml_type]
    n = 1
    for d in shape:
        n *= d
    if shape and shape[-1] % block:
        raise ModelFileError(
            f"{file}: tensor '{name}' row length {shape[-1]} is not a multiple of the "
            f"{GGML_TYPES[ggml_type][0]} block size {block}"
        )
    return n // block * size


_U64 = struct.Struct("<Q")


class _Cursor:
    """Sequential little-endian reads over a buffer, raising HeaderTruncated at its end.

    With the file's size known, a count whose smallest encoding cannot fit in what is left of the
    file is refused at once (`room`), so absurd counts fail fast instead of looping over the file.
    """

    __slots__ = ("buf", "pos", "end", "file_size", "name")

    def __init__(self, buf: Any, file_size: int | None = None, name: str = "file") -> None:
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
        self.pos = 0
        self.end = len(self.buf)
        self.file_size = file_size
        self.name = name

    def room(self, count: int, min_size: int, what: str) -> None:
        """HeaderTruncated now when `count` items of at least `min_size` bytes (`what`, for the
        reader) cannot fit in the rest of the file: a truncated file or an absurd count."""
        needed = self.pos + count * min_size
        if self.file_size is not None and needed > self.file_size:
            raise HeaderTruncated(needed)

    def take(self, n: int) -> memoryview:
        start = self.pos
        stop = start + n
        if stop > self.end:
            raise HeaderTruncated(stop)
        self.pos = stop
        return self.buf[start:stop]

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > self.end:
            raise HeaderTruncated(self.pos + size)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self, what: str = "string length") -> str:
        n = self.scalar("<Q")
        self.room(n, 1, what)
        raw = self.take(n)
        return bytes(raw).decode("utf-8", errors="replace")

    def string_array(self, count: int) -> list[str]:
        """`count` strings: one pass over the length fields, then one UTF-8 decode of all the bytes
        (a real vocabulary is ~500k strings; decoding each alone was most of a header's parse)."""
        buf, pos, end = self.buf, self.pos, self.end
        unpack = _U64.unpack_from
        starts = [0] * count
        for i in range(count):
            if pos + 8 > end:
                raise HeaderTruncated(pos + 8)
            (n,) = unpack(buf, pos)
            pos += 8
            starts[i] = pos
            pos += n
            if pos > end:
                raise HeaderTruncated(pos)
        first, self.pos = self.pos, pos
        return _decode_strings(buf[first:pos], starts, first)

    def value(self, vtype: int, key: str = "", depth: int = 0) -> tuple[Any, int | None]:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype]), None
        if vtype == T_STRING:
            return self.string(), None
        if vtype == T_ARRAY:
            etype = self.scalar("<I")
            count = self.scalar("<Q")
            if etype == T_STRING:
                self.room(count, 8, f"array '{key}' count")
                return self.string_array(count), etype
            if etype in _NUMPY_DTYPES:
                dtype = np.dtype(_NUMPY_DTYPES[etype]).newbyteorder("<")
                self.room(count, dtype.itemsize, f"array '{key}' count")
                raw = self.take(count * dtype.itemsize)
                return np.frombuffer(raw, dtype=dtype).copy(), etype
            if etype == T_ARRAY:
                if depth >= MAX_ARRAY_DEPTH:
                    raise ModelFileError(f"{self.name}: metadata key '{key}' nests arrays more than "
                                         f"{MAX_ARRAY_DEPTH} deep")
                self.room(count, 12, f"array '{key}' count")
                return [self.value(T_ARRAY, key, depth + 1)[0] for _ in range(count)], etype
            raise ModelFileError(f"{self.name}: metadata key '{key}' has unknown array element type {etype}")
        raise ModelFileError(f"{self.name}: metadata key '{key}' has unknown value type {vtype}")


def _decode_strings(region: memoryview, starts: list[int], base: int) -> list[str]:
    """The strings of a GGUF string array whose bytes (length fields included) are `region` and
    whose data begin at `starts` (absolute; `base` is the region's start).

    Each length field becomes one NUL separator and the whole is decoded and split once. A NUL is
    not part of any multi-byte UTF-8 sequence, so when that strict decode succeeds and no string
    holds a NUL of its own, each piece is exactly what decoding that string alone gives. Anything
    else is decoded string by string with replacement characters."""
    count = len(starts)
    if count == 0:
        return []
    raw = np.frombuffer(region, dtype=np.uint8)
    at = np.asarray(starts, dtype=np.int64) - base  # data starts within the region
    keep = np.ones(len(raw), dtype=bool)
    keep[((at - 8)[:, None] + np.arange(7)).ravel()] = False  # keep the last byte of each length field
    marked = raw.copy()
    marked[at - 1] = 0
    joined = marked[keep]
    if int(np.count_nonzero(joined == 0)) == count:
        try:
            return joined.tobytes().decode("utf-8").split("\x00")[1:]
        except UnicodeDecodeError:
            pass
    ends = [*(a - 8 for a in at[1:].tolist()), len(raw)]
    return [str(region[a:e], "utf-8", "replace") for a, e in zip(at.tolist(), ends, strict=True)]


def parse_header(buf: Any, file_size: int | None = None, name: str = "file") -> GGUFHeader:
    """Parse a GGUF header from the start of `buf` (bytes, mmap or memoryview).

    Raises HeaderTruncated when `buf` ends inside the header (the caller may fetch more) and
    ModelFileError for anything that is not a usable GGUF header. With `file_size`, tensor data
    running past the end of the file is reported as truncation.
    """
    cur = _Cursor(buf, file_size, name)
    if cur.end < 4 and file_size is not None and file_size < 4:
        raise ModelFileError(f"{name}: not a GGUF file (too small)")
    magic = bytes(cur.take(4))
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{name}: not a GGUF file (bad magic {magic!r})")
    version = cur.scalar("<I")
    if version not in SUPPORTED_VERSIONS:
        raise ModelFileError(f"{name}: unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.scalar("<Q")
    n_kv = cur.scalar("<Q")
    if n_tensors > 10_000_000 or n_kv > 10_000_000:
        raise ModelFileError(f"{name}: corrupt GGUF header (absurd counts)")
    cur.room(n_kv, 13, "key/value count")  # the smallest entry: empty key, type, one byte
    cur.room(n_tensors, 24, "tensor count")  # empty name, one dimension, type, offset
    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple[int, int | None]] = {}
    for _ in range(n_kv):
        key = cur.string("key length")
        if key in metadata:
            raise ModelFileError(f"{name}: metadata key '{key}' appears twice")
        vtype = cur.scalar("<I")
        value, etype = cur.value(vtype, key)
        metadata[key] = value
        value_types[key] = (vtype, etype)
    raw_tensors = []
    for _ in range(n_tensors):
        tname = cur.string("tensor name length")
        n_dims = cur.scalar("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelFileError(f"{name}: corrupt tensor entry '{tname}' ({n_dims} dimensions)")
        ne = [cur.scalar("<Q") for _ in range(n_dims)]
        ttype = cur.scalar("<I")
        offset = cur.scalar("<Q")
        raw_tensors.append((tname, ttype, tuple(reversed(ne)), offset))
    alignment = _alignment(metadata, value_types, name)
    header_size = cur.pos
    data_offset = (header_size + alignment - 1) // alignment * alignment
    tensors = _check_tensor_entries(raw_tensors, alignment, data_offset, name)
    if file_size is not None:
        for t in tensors:
            if t.offset + t.n_bytes > file_size:
                raise ModelFileError(
                    f"{name}: truncated file: tensor '{t.name}' ends at byte {t.offset + t.n_bytes:,} "
                    f"but the file has {file_size:,} bytes"
                )
    return GGUFHeader(version, metadata, value_types, tensors, alignment, data_offset, header_size)


def _alignment(metadata: dict[str, Any], value_types: dict[str, tuple[int, int | None]], name: str) -> int:
    """`general.alignment`: an unsigned integer power of two, as llama.cpp requires."""
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    value = metadata["general.alignment"]
    if value_types["general.alignment"][0] not in _INTEGER_TYPES:
        raise ModelFileError(f"{name}: metadata key 'general.alignment' must be an integer")
    value = int(value)
    if value <= 0 or value & (value - 1) or value > MAX_ALIGNMENT:
        raise ModelFileError(f"{name}: metadata key 'general.alignment' is {value}; it must be a power of "
                             f"two up to {MAX_ALIGNMENT}")
    return value


def _check_tensor_entries(raw: list[tuple[str, int, tuple[int, ...], int]], alignment: int,
                          data_offset: int, name: str) -> list[TensorInfo]:
    """The tensor list checked as llama.cpp's gguf loader does: short unique names, sizes that do
    not overflow, and each tensor's data exactly where the one before it ends (padded to the
    alignment), so no two tensors overlap and none is misaligned."""
    seen: set[str] = set()
    tensors = []
    expected = 0
    for tname, ttype, shape, offset in raw:
        if len(tname.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise ModelFileError(f"{name}: tensor name '{tname[:40]}...' is longer than {MAX_NAME_BYTES} bytes")
        if tname in seen:
            raise ModelFileError(f"{name}: tensor '{tname}' appears twice")
        seen.add(tname)
        n = 1
        for d in shape:
            n *= d
        if n >= 1 << 63:
            raise ModelFileError(f"{name}: tensor '{tname}' has an absurd shape {list(reversed(shape))}")
        n_bytes = _tensor_nbytes(tname, ttype, shape, name)
        if offset != expected:
            problem = "misaligned" if offset % alignment else "overlapping or out of order"
            raise ModelFileError(f"{name}: tensor '{tname}' data is at offset {offset:,}, expected {expected:,} "
                                 f"({problem})")
        expected += (n_bytes + alignment - 1) // alignment * alignment
        tensors.append(TensorInfo(tname, ttype, shape, data_offset + offset, n_bytes))
    return tensors
