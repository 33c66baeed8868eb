"""A GGUF file as editable parts, written back byte by byte: the tool for hostile-file tests.

Read with gguf-py's GGUFReader (not clover's parser) and serialized here from the GGUF spec, so a
test can give any key any type or value, nest arrays, lie about counts and move tensor offsets.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gguf import GGUFReader

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
RAW = -1  # as an ARRAY's etype: the value is the payload bytes after the type id, written as is
SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
          BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


@dataclass
class KV:
    key: str
    vtype: int
    value: Any
    etype: int | None = None  # element type of an ARRAY; nested arrays hold (etype, values) tuples


@dataclass
class Tensor:
    name: str
    ne: list[int]  # GGUF order, fastest-varying first
    ttype: int
    offset: int  # relative to the data section


@dataclass
class Gguf:
    kvs: list[KV]
    tensors: list[Tensor]
    data: bytes
    version: int = 3
    alignment: int = 32
    n_kv: int | None = None  # None: the true count
    n_tensors: int | None = None
    magic: bytes = b"GGUF"
    extra: dict = field(default_factory=dict)

    def kv(self, key: str) -> KV:
        return next(k for k in self.kvs if k.key == key)

    def set(self, key: str, vtype: int, value: Any, etype: int | None = None) -> Gguf:
        """A copy with `key` set (added at the end when absent)."""
        kvs = [k for k in self.kvs if k.key != key] + [KV(key, vtype, value, etype)]
        return replace(self, kvs=kvs)

    def header(self) -> bytes:
        out = bytearray(self.magic)
        out += struct.pack("<IQQ", self.version, len(self.tensors) if self.n_tensors is None else self.n_tensors,
                           len(self.kvs) if self.n_kv is None else self.n_kv)
        for kv in self.kvs:
            out += _string(kv.key) + struct.pack("<I", kv.vtype) + _value(kv.vtype, kv.value, kv.etype)
        for t in self.tensors:
            out += _string(t.name) + struct.pack("<I", len(t.ne)) + b"".join(struct.pack("<Q", d) for d in t.ne)
            out += struct.pack("<IQ", t.ttype, t.offset)
        return bytes(out)

    def to_bytes(self) -> bytes:
        head = self.header()
        pad = -len(head) % self.alignment if self.alignment > 0 else 0
        return head + b"\0" * pad + self.data

    def write(self, path: Path) -> Path:
        path.write_bytes(self.to_bytes())
        return path


def _string(s: str | bytes) -> bytes:
    raw = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: int, value: Any, etype: int | None) -> bytes:
    if vtype in SCALAR:
        return struct.pack(SCALAR[vtype], value)
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY and etype == RAW:
        return bytes(value)
    if vtype == ARRAY:
        out = struct.pack("<IQ", etype, len(value))
        for item in value:
            if etype == ARRAY:
                inner_type, inner = item
                out += _value(ARRAY, inner, inner_type)
            else:
                out += _value(etype, item, None)
        return out
    return b""  # an unknown type id: no payload


def load(path: Path) -> Gguf:
    """A GGUF file as parts (metadata with their on-disk types, tensor entries, the data section)."""
    r = GGUFReader(path)
    kvs = []
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        vtype = int(f.types[0])
        etype = int(f.types[1]) if vtype == ARRAY else None
        value = f.contents()
        if vtype == ARRAY and etype != STRING:
            value = list(value)
        kvs.append(KV(name, vtype, value, etype))
    tensors = [Tensor(t.name, [int(d) for d in t.field.parts[3]], int(t.tensor_type),
                      int(t.field.parts[-1][0])) for t in r.tensors]
    data = path.read_bytes()[r.data_offset:]
    alignment = int(r.fields["general.alignment"].contents()) if "general.alignment" in r.fields else 32
    return Gguf(kvs, tensors, data, alignment=alignment)
