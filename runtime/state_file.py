"""A prompt cache on disk: the tokens a sequence holds, its state and checkpoints, and the caller's
own data (a conversation), so a long session resumes without prefilling it again.

A saved state is read back into a running model, so the file is treated as untrusted input. Its
layout is one flat binary file (no archive, no compression, no pickles):

    MAGIC (8 bytes) | version (u32 LE) | header length (u64 LE) | header (UTF-8 JSON)
    | arrays (little-endian float32, C order, in the header's order) | SHA-256 of all of the above

The header names the model the state came from (its size and the SHA-256 of its GGUF header), the
tokens, the checkpoints, the caller's data and every array's name, dtype and shape. A reader checks
the magic, the version, the model, every shape against the loaded model's layers and head counts
(and the context), and the file's exact length before it allocates anything, then the checksum
before it changes the cache. Anything else is refused with one line (StateFileError).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .atomic_write import atomic_file
from .engine.state import host_array, write_array
from .errors import CloverError
from .prompt_cache import Checkpoint, PromptCache

FORMAT = "clover-prompt-cache"
VERSION = 2
MAGIC = b"CLVSTATE"
DTYPE = "<f4"
_PREFIX = struct.Struct("<IQ")  # version, header length
_START = len(MAGIC) + _PREFIX.size
_DIGEST = 32
_MAX_HEADER = 64 << 20  # the header holds the token ids: 64 MiB is far past any context
_CHUNK = 1 << 20
_ZIP = b"PK\x03\x04"  # format 1 was a NumPy .npz archive


class StateFileError(CloverError):
    """A saved state that cannot be used: missing, unreadable, damaged, another format or another
    model's. `reason` is the message without the path (a server names the file its own way)."""

    def __init__(self, path: Path, reason: str, *, missing: bool = False) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.missing = missing


@dataclass(frozen=True)
class Loaded:
    """What `load` read: the caller's saved data, the tokens now held and the file's size."""

    extra: dict[str, Any]
    n_past: int
    n_bytes: int


def model_identity(model: Any) -> dict[str, Any]:
    """What ties a saved state to one model file: its size and the SHA-256 of its GGUF header."""
    file = model.file
    header = file.headers[0]
    with open(file.path, "rb") as fh:
        digest = hashlib.sha256(fh.read(header.header_size)).hexdigest()
    return {"size": int(file.file_size), "header_sha256": digest, "name": file.path.name}


def _layout(config: Any, n_past: int, n_checkpoints: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every array a state of `n_past` tokens with `n_checkpoints` checkpoints holds, in file order."""
    kv_heads = int(config.n_head_kv)
    out: list[tuple[str, tuple[int, ...]]] = []
    for i in config.attention_layers:
        out += [(f"k{i}", (kv_heads, n_past, int(config.head_dim))),
                (f"v{i}", (kv_heads, n_past, int(config.head_dim_v)))]
    ring = (max(int(config.ssm_conv_kernel) - 1, 0), int(config.ssm_conv_dim))
    ssm = (int(config.ssm_v_heads), int(config.ssm_state), int(config.ssm_v_dim))
    for tag in ["s"] + [f"c{j}" for j in range(n_checkpoints)]:
        for i in config.gdn_layers:
            out += [(f"{tag}_ring{i}", ring), (f"{tag}_ssm{i}", ssm)]
    return out


def _nbytes(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=object)) * np.dtype(DTYPE).itemsize


def _host_arrays(cache: PromptCache) -> dict[str, Any]:
    state = cache.state
    n = state.n_past
    cfg = cache.model.config
    arrays: dict[str, Any] = {}
    for i in cfg.attention_layers:
        k, v = state.kv(i)
        arrays[f"k{i}"], arrays[f"v{i}"] = k[:, :n], v[:, :n]
    for tag, snap in [("s", state)] + [(f"c{j}", c.snapshot) for j, c in enumerate(cache.checkpoints)]:
        for i in cfg.gdn_layers:
            arrays[f"{tag}_ring{i}"], arrays[f"{tag}_ssm{i}"] = snap.gdn(i)
    return arrays


def save(cache: PromptCache, path: Path, extra: dict[str, Any] | None = None) -> int:
    """Write `cache` (and `extra`, any JSON data) to `path` atomically; returns the bytes written."""
    path = Path(path)
    n = cache.state.n_past
    layout = _layout(cache.model.config, n, len(cache.checkpoints))
    arrays = _host_arrays(cache)
    meta = {"format": FORMAT, "version": VERSION, "model": model_identity(cache.model), "n_ctx": cache.n_ctx,
            "n_past": n, "tokens": [int(t) for t in cache.tokens[:n]],
            "checkpoints": [c.n_past for c in cache.checkpoints], "extra": extra or {},
            "arrays": [{"name": name, "dtype": DTYPE, "shape": list(shape)} for name, shape in layout]}
    header = json.dumps(meta, ensure_ascii=False).encode("utf-8")
    digest = hashlib.sha256()
    try:
        with atomic_file(path) as fh:
            def put(data: Any) -> None:
                digest.update(data)
                fh.write(data)

            put(MAGIC + _PREFIX.pack(VERSION, len(header)))
            put(header)
            for name, shape in layout:
                data = np.ascontiguousarray(host_array(arrays[name]), dtype=DTYPE)
                if data.shape != shape:  # the engine changed its state layout: never write a file that lies
                    raise StateFileError(path, f"cannot save: array {name} has shape {list(data.shape)}, "
                                               f"expected {list(shape)}")
                put(data.reshape(-1).view(np.uint8))
            fh.write(digest.digest())
        return fh.size
    except OSError as exc:
        raise StateFileError(path, f"cannot write: {exc.strerror or exc}") from None


# -- reading --------------------------------------------------------------------------------------

def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_exact(fh: BinaryIO, n: int, path: Path) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise StateFileError(path, "is truncated")
    return data


def _header(fh: BinaryIO, size: int, path: Path) -> dict[str, Any]:
    """The header, after the magic, version and length are checked against the file's size."""
    head = fh.read(_START)
    if head[:len(_ZIP)] == _ZIP:
        raise StateFileError(path, "was saved by an older clover (format 1), which this one cannot read; "
                                   "save it again")
    if len(head) < len(MAGIC) or head[:len(MAGIC)] != MAGIC:
        raise StateFileError(path, "is not a clover saved state")
    if len(head) < _START:
        raise StateFileError(path, "is truncated")
    version, length = _PREFIX.unpack(head[len(MAGIC):])
    if version != VERSION:
        newer = "a newer" if version > VERSION else "an older"
        raise StateFileError(path, f"is a saved state of format {version} ({newer} clover); this clover reads "
                                   f"format {VERSION}")
    if length > min(size - _START - _DIGEST, _MAX_HEADER):
        raise StateFileError(path, "is truncated or damaged (its header is longer than the file)")
    try:
        meta = json.loads(_read_exact(fh, length, path).decode("utf-8"))
    except (ValueError, RecursionError):
        raise StateFileError(path, "is damaged (its header is not valid JSON)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise StateFileError(path, "is damaged (its header is not a clover saved state's)")
    return meta


def _check_model(meta: dict[str, Any], cache: PromptCache, path: Path) -> None:
    mine, saved = model_identity(cache.model), meta.get("model")
    if not isinstance(saved, dict) or not _int(saved.get("size")) or not isinstance(saved.get("name"), str):
        raise StateFileError(path, "is damaged (no model identity)")
    if (mine["size"], mine["header_sha256"]) != (saved["size"], saved.get("header_sha256")):
        raise StateFileError(path, f"was saved with another model file ({saved['name'][:200]!r}, "
                                   f"{saved['size']:,} bytes); refusing to load it into {mine['name']}")


def _check_content(meta: dict[str, Any], cache: PromptCache, path: Path) -> tuple[int, list[int], list[int]]:
    """n_past, tokens and checkpoint positions, checked against the cache's context and vocabulary."""
    n, tokens, points = meta.get("n_past"), meta.get("tokens"), meta.get("checkpoints")
    if not _int(n) or n < 0:
        raise StateFileError(path, "is damaged (bad token count)")
    if n >= cache.n_ctx:
        raise StateFileError(path, f"holds {n} tokens, more than this context ({cache.n_ctx}); raise -c")
    n_tokens = int(cache.model.config.n_tokens)  # what the tokenizer can decode (the vocabulary may be padded)
    if not isinstance(tokens, list) or len(tokens) != n or not all(_int(t) and 0 <= t < n_tokens for t in tokens):
        raise StateFileError(path, "is damaged (its token ids do not fit this model)")
    if (not isinstance(points, list) or not all(_int(p) and 0 < p <= n for p in points)
            or any(a >= b for a, b in zip(points, points[1:], strict=False))):
        raise StateFileError(path, "is damaged (bad checkpoint positions)")
    if not isinstance(meta.get("extra", {}), dict):
        raise StateFileError(path, "is damaged (bad caller data)")
    return n, tokens, points


def _check_arrays(meta: dict[str, Any], want: list[tuple[str, tuple[int, ...]]], path: Path) -> None:
    got = meta.get("arrays")
    if not isinstance(got, list) or len(got) != len(want):
        listed = len(got) if isinstance(got, list) else 0
        raise StateFileError(path, f"does not match this model (it lists {listed} arrays; this model's state "
                                   f"has {len(want)} arrays)")
    for entry, (name, shape) in zip(got, want, strict=True):
        if (not isinstance(entry, dict) or entry.get("name") != name or entry.get("dtype") != DTYPE
                or entry.get("shape") != list(shape)):
            shown = json.dumps(entry)[:200]
            raise StateFileError(path, f"does not match this model (array {shown}; expected {name} {DTYPE} "
                                       f"{list(shape)})")


def _check_digest(fh: BinaryIO, size: int, path: Path) -> None:
    fh.seek(0)
    digest = hashlib.sha256()
    left = size - _DIGEST
    while left:
        chunk = fh.read(min(_CHUNK, left))
        if not chunk:
            raise StateFileError(path, "is truncated")
        digest.update(chunk)
        left -= len(chunk)
    if fh.read(_DIGEST) != digest.digest():
        raise StateFileError(path, "is damaged (checksum mismatch)")


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise StateFileError(path, "no saved state there", missing=True) from None
    except OSError as exc:
        raise StateFileError(path, f"cannot read: {exc.strerror or exc}") from None


def load(cache: PromptCache, path: Path) -> Loaded:
    """Replace what `cache` holds with the state saved at `path`.

    Raises StateFileError when the file is missing, unreadable, damaged, was saved from another
    model file, or holds more tokens than the cache's context. A file its checks refuse leaves the
    cache as it was; a read error after them (the disk failing mid-read) leaves it empty.
    """
    path = Path(path)
    with _open(path) as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            meta = _header(fh, size, path)
            _check_model(meta, cache, path)
            n, tokens, points = _check_content(meta, cache, path)
            want = _layout(cache.model.config, n, len(points))
            _check_arrays(meta, want, path)
            offsets, pos = {}, fh.tell()
            for name, shape in want:
                offsets[name] = (pos, shape)
                pos += _nbytes(shape)
            if pos + _DIGEST != size:
                raise StateFileError(path, "is truncated" if pos + _DIGEST > size else "is damaged (trailing data)")
            _check_digest(fh, size, path)
            _fill(cache, fh, offsets, n, tokens, points, path)
        except OSError as exc:
            raise StateFileError(path, f"cannot read: {exc.strerror or exc}") from None
    return Loaded(dict(meta.get("extra") or {}), n, size)


def _fill(cache: PromptCache, fh: BinaryIO, offsets: dict[str, tuple[int, tuple[int, ...]]], n: int,
          tokens: list[int], points: list[int], path: Path) -> None:
    """Write the checked arrays into a cleared cache (the newest `max_checkpoints` checkpoints)."""
    def read(name: str) -> np.ndarray:
        pos, shape = offsets[name]
        out = np.empty(shape, dtype=DTYPE)  # writable: a device tensor is built from it
        fh.seek(pos)
        if out.size and fh.readinto(out.reshape(-1).view(np.uint8)) != out.nbytes:
            raise StateFileError(path, "is truncated")
        return out

    cfg = cache.model.config
    kept = list(enumerate(points))[len(points) - min(len(points), cache.max_checkpoints):]
    try:
        cache.clear()
        state = cache.state
        for i in cfg.attention_layers:
            k, v = state.kv(i)
            write_array(k, (slice(None), slice(0, n)), read(f"k{i}"))
            write_array(v, (slice(None), slice(0, n)), read(f"v{i}"))
        for pos, tag in [(p, f"c{j}") for j, p in kept] + [(n, "s")]:
            state.n_past = pos
            state.prepare_write()  # a checkpoint taken below shares these arrays: write into copies
            for i in cfg.gdn_layers:
                ring, s = state.gdn(i)
                write_array(ring, ..., read(f"{tag}_ring{i}"))
                write_array(s, ..., read(f"{tag}_ssm{i}"))
            if tag != "s":
                cache.checkpoints.append(Checkpoint(pos, state.copy()))
        cache.tokens = list(tokens)
    except BaseException:
        cache.clear()
        raise
