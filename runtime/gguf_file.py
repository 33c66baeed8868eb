"""GGUF files memory-mapped: a single file or a split set, with the parsed header kept per process
and on disk (`header_cache`), and tensor data untouched until a tensor is asked for."""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import header_cache
from .errors import ModelFileError
from .gguf_header import SPLIT_RE, GGUFHeader, HeaderTruncated, TensorInfo, parse_header


def split_paths(path: Path) -> list[Path]:
    """All shards of a split set `*-00001-of-0000N.gguf` given any one of them; else [path]."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count = int(m.group("count"))
    paths = [path.with_name(f"{m.group('prefix')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise ModelFileError(f"split model is incomplete: missing {', '.join(missing)}")
    return paths


class HeaderView:
    """What a model's first header says, for an opened file and a remote one alike (`headers[0]`)."""

    headers: list[GGUFHeader]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.headers[0].metadata

    @property
    def value_types(self) -> dict[str, tuple[int, int | None]]:
        return self.headers[0].value_types

    @property
    def version(self) -> int:
        return self.headers[0].version


@dataclass
class GGUFModelFile(HeaderView):
    """An opened GGUF model (one file or a split set) with memory-mapped tensor data."""

    paths: list[Path]
    headers: list[GGUFHeader]
    tensors: dict[str, TensorInfo]
    _maps: list[Any] = field(default_factory=list, repr=False)

    @property
    def path(self) -> Path:
        return self.paths[0]

    @property
    def file_size(self) -> int:
        return sum(len(m) if m is not None else 0 for m in self._maps) or sum(
            p.stat().st_size for p in self.paths
        )

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view into the mapped file (no copy)."""
        t = self.tensors[name]
        m = self._maps[t.shard]
        return np.frombuffer(m, dtype=np.uint8, count=t.n_bytes, offset=t.offset)

    def read(self, name: str) -> np.ndarray:
        """The tensor's bytes read into this process's memory (`resident`: huge pages where the OS
        has them), read-only."""
        from .resident import read_bytes

        t = self.tensors[name]
        return read_bytes(self.paths[t.shard], t.offset, t.n_bytes)

    def read_interleaved(self, names: Sequence[str], count: int) -> np.ndarray:
        """Tensors that stack `count` matrices each (experts; 1 for plain matrices) read into one
        buffer matrix by matrix: matrix e of every tensor in order, then matrix e+1, read-only
        (a product of their concatenated rows then runs as one)."""
        from .resident import read_slices

        return read_slices([(self.paths[t.shard], t.offset, t.n_bytes) for t in map(self.tensors.__getitem__, names)],
                           count)

    def close(self) -> None:
        for m in self._maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass  # numpy views still alive; the OS unmaps when they are collected
        self._maps = []

    def __enter__(self) -> GGUFModelFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map_file(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size == 0:
            raise ModelFileError(f"{path.name}: not a GGUF file (empty)")
        with open(path, "rb") as fh:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


_HEADER_CACHE: dict[tuple[str, int, int], GGUFHeader] = {}
_HEADER_CACHE_SIZE = 4


def _parsed_header(m: Any, path: Path) -> GGUFHeader:
    """The header of a mapped file, parsed once per process while the file is unchanged (`run`
    and `serve` check the memory fit and then load the same file) and kept on disk for the next
    process (`header_cache`): a real vocabulary makes each parse cost about half a second."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    header = _HEADER_CACHE.get(key)
    if header is None:
        header = header_cache.load(path, m)
    if header is None:
        try:
            header = parse_header(m, file_size=len(m), name=path.name)
        except HeaderTruncated:
            raise ModelFileError(f"{path.name}: truncated file (ends inside the GGUF header)") from None
        header_cache.store(path, m, header)
    if key not in _HEADER_CACHE:
        while len(_HEADER_CACHE) >= _HEADER_CACHE_SIZE:
            _HEADER_CACHE.pop(next(iter(_HEADER_CACHE)))
        _HEADER_CACHE[key] = header
    return header


def open_gguf(path: str | Path) -> GGUFModelFile:
    """Open a GGUF file, or a whole split set given any shard, memory-mapped."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a GGUF file")
    paths = split_paths(path)
    headers: list[GGUFHeader] = []
    maps: list[Any] = []
    tensors: dict[str, TensorInfo] = {}
    for shard, p in enumerate(paths):
        m = _map_file(p)
        maps.append(m)
        header = _parsed_header(m, p)
        headers.append(header)
        for t in header.tensors:
            if t.name in tensors:
                raise ModelFileError(f"{p.name}: tensor '{t.name}' appears twice")
            tensors[t.name] = TensorInfo(t.name, t.ggml_type, t.shape, t.offset, t.n_bytes, shard)
    _check_split(headers[0].metadata, paths, len(tensors))
    return GGUFModelFile(paths, headers, tensors, maps)


def _check_split(meta: dict[str, Any], paths: list[Path], n_tensors: int) -> None:
    """A split set must have as many shards and tensors as its first shard announces."""
    for key in ("split.count", "split.tensors.count"):
        if key in meta and (not isinstance(meta[key], (int, np.integer)) or isinstance(meta[key], bool)):
            raise ModelFileError(f"{paths[0].name}: metadata key '{key}' must be an integer")
    count = meta.get("split.count")
    if count is not None and int(count) != len(paths):
        raise ModelFileError(
            f"{paths[0].name}: split model has {int(count)} shards but {len(paths)} were found "
            f"(expected names like *-00001-of-{int(count):05d}.gguf)"
        )
    expected = meta.get("split.tensors.count")
    if expected is not None and int(expected) != n_tensors:
        raise ModelFileError(
            f"{paths[0].name}: split model lists {int(expected)} tensors but its shards hold {n_tensors}"
        )
