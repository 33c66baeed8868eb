"""Parsed GGUF headers kept in the per-file cache (`file_cache`), so a start skips the parse.

A real vocabulary is ~500k strings, and walking their length fields is most of a start's header
time; the cached form stores each string array as one NUL-separated UTF-8 block (one decode and
one split) and each numeric array as its raw bytes, with the small rest as JSON. Nothing is
pickled. An entry is used only when the file's path, size and modification time match and the
bytes at both ends of the file's header are the ones the entry was made from.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from . import file_cache
from .gguf_header import T_ARRAY, T_STRING, GGUFHeader, TensorInfo

KIND = "header"
MIN_HEADER_BYTES = 1 << 20  # smaller headers parse in milliseconds: an entry would only cost a write
_EDGE = 1 << 16  # bytes hashed at each end of the header
_LEN = struct.Struct("<Q")


def load(path: Path, buf: Any) -> GGUFHeader | None:
    """The cached header of the file at `path` (mapped as `buf`), or None."""
    key = file_cache.FileKey.of(path)
    if key is None or key.size != len(buf):
        return None
    payload = file_cache.load(key, KIND)
    if payload is None:
        return None
    try:
        header, fingerprint = _decode(payload)
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, struct.error):
        return None
    if header.header_size > len(buf) or fingerprint != _fingerprint(buf, header.header_size):
        return None
    return header


def store(path: Path, buf: Any, header: GGUFHeader) -> None:
    """Keep `header` (just parsed from `buf`, the file at `path`) for the next start."""
    if header.header_size < MIN_HEADER_BYTES:
        return
    key = file_cache.FileKey.of(path)
    if key is None or key.size != len(buf):
        return
    try:
        payload = _encode(header, _fingerprint(buf, header.header_size))
    except (ValueError, TypeError, UnicodeEncodeError):
        return  # a value this format cannot hold: the file is parsed each time, as before
    file_cache.store(key, KIND, payload)


def _fingerprint(buf: Any, header_size: int) -> list[int]:
    view = memoryview(buf)
    return [header_size, zlib.crc32(view[:min(_EDGE, header_size)]),
            zlib.crc32(view[max(0, header_size - _EDGE):header_size])]


def _encode(header: GGUFHeader, fingerprint: list[int]) -> bytes:
    blobs: list[bytes] = []

    def blob(data: bytes) -> int:
        blobs.append(data)
        return len(blobs) - 1

    meta = []
    for key, value in header.metadata.items():
        vtype, etype = header.value_types[key]
        meta.append([key, vtype, etype, _encode_value(value, vtype, etype, blob)])
    tensors = [[t.name, t.ggml_type, list(t.shape), t.offset, t.n_bytes] for t in header.tensors]
    head = {"version": header.version, "alignment": header.alignment, "data_offset": header.data_offset,
            "header_size": header.header_size, "fingerprint": fingerprint, "meta": meta, "tensors": tensors,
            "blobs": [len(b) for b in blobs]}
    text = json.dumps(head, allow_nan=True).encode("utf-8")
    return b"".join([_LEN.pack(len(text)), text, *blobs])


def _encode_value(value: Any, vtype: int, etype: int | None, blob: Any) -> Any:
    if vtype != T_ARRAY:
        return value
    if etype == T_STRING:
        joined = "\x00".join(value)
        if joined.count("\x00") != max(len(value) - 1, 0):
            return {"list": value}  # a string holding a NUL of its own: kept as a JSON list
        return {"strings": blob(joined.encode("utf-8", "surrogatepass")), "count": len(value)}
    if isinstance(value, np.ndarray):
        return {"array": blob(value.tobytes()), "dtype": value.dtype.str, "count": int(value.size)}
    return {"nested": _nested(value)}


def _nested(value: Any) -> Any:
    """Arrays of arrays (rare and small): numpy arrays as dtype + values, lists as lists."""
    if isinstance(value, np.ndarray):
        return {"dtype": value.dtype.str, "values": value.tolist()}
    if isinstance(value, list):
        return [_nested(v) for v in value]
    return value


def _unnested(value: Any) -> Any:
    if isinstance(value, dict):
        return np.array(value["values"], dtype=np.dtype(value["dtype"]))
    if isinstance(value, list):
        return [_unnested(v) for v in value]
    return value


def _decode(payload: bytes) -> tuple[GGUFHeader, list[int]]:
    (n,) = _LEN.unpack_from(payload, 0)
    head = json.loads(payload[_LEN.size:_LEN.size + n].decode("utf-8"))
    blobs: list[memoryview] = []
    pos = _LEN.size + n
    view = memoryview(payload)
    for size in head["blobs"]:
        blobs.append(view[pos:pos + size])
        pos += size
    if pos != len(payload):
        raise ValueError("entry size does not match its blobs")
    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple[int, int | None]] = {}
    for key, vtype, etype, enc in head["meta"]:
        metadata[key] = _decode_value(enc, vtype, blobs)
        value_types[key] = (vtype, etype)
    tensors = [TensorInfo(name, int(ttype), tuple(shape), int(offset), int(n_bytes))
               for name, ttype, shape, offset, n_bytes in head["tensors"]]
    header = GGUFHeader(int(head["version"]), metadata, value_types, tensors, int(head["alignment"]),
                        int(head["data_offset"]), int(head["header_size"]))
    return header, list(head["fingerprint"])


def _decode_value(enc: Any, vtype: int, blobs: list[memoryview]) -> Any:
    if vtype != T_ARRAY:
        return enc
    if "strings" in enc:
        count = int(enc["count"])
        strings = str(blobs[enc["strings"]], "utf-8", "surrogatepass").split("\x00") if count else []
        if len(strings) != count:
            raise ValueError("string array count")
        return strings
    if "array" in enc:
        arr = np.frombuffer(blobs[enc["array"]], dtype=np.dtype(enc["dtype"])).copy()
        if arr.size != int(enc["count"]):
            raise ValueError("array count")
        return arr
    if "list" in enc:
        return list(enc["list"])
    return _unnested(enc["nested"])
