"""A prompt cache on disk: the tokens a sequence holds, its state and checkpoints, and the caller's
own data (a conversation), so a long session resumes without prefilling it again.

The file is a NumPy `.npz` archive (no pickles): K/V rows up to the held length, the GDN conv
rings and recurrent states of the state and of every checkpoint, and one JSON document. A state
only means something to the model it came from, so the file records that model's size and a hash
of its GGUF header and is refused (StateFileError, one line) for any other model.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .engine.state import host_array, write_array
from .errors import CloverError
from .prompt_cache import Checkpoint, PromptCache

FORMAT = "clover-prompt-cache"
VERSION = 1


class StateFileError(CloverError):
    """A saved state that cannot be used: unreadable, another format, or another model's."""


def model_identity(model: Any) -> dict[str, Any]:
    """What ties a saved state to one model file: its size and the SHA-256 of its GGUF header."""
    file = model.file
    header = file.headers[0]
    with open(file.path, "rb") as fh:
        digest = hashlib.sha256(fh.read(header.header_size)).hexdigest()
    return {"size": int(file.file_size), "header_sha256": digest, "name": file.path.name}


def save(cache: PromptCache, path: Path, extra: dict[str, Any] | None = None) -> int:
    """Write `cache` (and `extra`, any JSON data) to `path`; returns the bytes written."""
    state = cache.state
    n = state.n_past
    cfg = cache.model.config
    meta = {"format": FORMAT, "version": VERSION, "model": model_identity(cache.model), "n_ctx": cache.n_ctx,
            "n_past": n, "tokens": cache.tokens[:n], "checkpoints": [c.n_past for c in cache.checkpoints],
            "extra": extra or {}}
    arrays: dict[str, np.ndarray] = {"meta": np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)}
    for i in cfg.attention_layers:
        k, v = state.kv(i)
        arrays[f"k{i}"], arrays[f"v{i}"] = host_array(k[:, :n]), host_array(v[:, :n])
    for tag, snap in [("s", state)] + [(f"c{j}", c.snapshot) for j, c in enumerate(cache.checkpoints)]:
        for i in cfg.gdn_layers:
            ring, s = snap.gdn(i)
            arrays[f"{tag}_ring{i}"], arrays[f"{tag}_ssm{i}"] = host_array(ring), host_array(s)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StateFileError(f"cannot write {path}: {exc.strerror}") from None
    return path.stat().st_size


def _read(path: Path) -> tuple[dict[str, Any], Any]:
    try:
        data = np.load(path, allow_pickle=False)
        meta = json.loads(bytes(data["meta"]).decode("utf-8"))
    except FileNotFoundError:
        raise StateFileError(f"no saved state at {path}") from None
    except OSError as exc:
        raise StateFileError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        raise StateFileError(f"{path} is not a clover saved state") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise StateFileError(f"{path} is not a clover saved state (or from a newer clover)")
    return meta, data


def load(cache: PromptCache, path: Path) -> dict[str, Any]:
    """Replace what `cache` holds with the state saved at `path`; returns the saved `extra` data.

    Raises StateFileError when the file is unreadable, was saved from another model file, or
    holds more tokens than the cache's context.
    """
    path = Path(path)
    meta, data = _read(path)
    mine, saved = model_identity(cache.model), meta["model"]
    if (mine["size"], mine["header_sha256"]) != (saved.get("size"), saved.get("header_sha256")):
        raise StateFileError(f"{path} was saved with another model file ({saved.get('name')}, "
                             f"{saved.get('size'):,} bytes); refusing to load it into {mine['name']}")
    n = int(meta["n_past"])
    if n >= cache.n_ctx:
        raise StateFileError(f"{path} holds {n} tokens, more than this context ({cache.n_ctx}); raise -c")
    cfg = cache.model.config
    try:
        cache.clear()
        state = cache.state
        for i in cfg.attention_layers:
            k, v = state.kv(i)
            write_array(k, (slice(None), slice(0, n)), data[f"k{i}"])
            write_array(v, (slice(None), slice(0, n)), data[f"v{i}"])
        points = [(int(c), f"c{j}") for j, c in enumerate(meta["checkpoints"])] + [(n, "s")]
        for pos, tag in points:
            state.n_past = pos
            state.prepare_write()  # a checkpoint taken below shares these arrays: write into copies
            for i in cfg.gdn_layers:
                ring, s = state.gdn(i)
                write_array(ring, ..., data[f"{tag}_ring{i}"])
                write_array(s, ..., data[f"{tag}_ssm{i}"])
            if tag != "s":
                cache.checkpoints.append(Checkpoint(pos, state.copy()))
        cache.tokens = [int(t) for t in meta["tokens"]]
    except (KeyError, ValueError) as exc:
        cache.clear()
        raise StateFileError(f"{path} is damaged ({exc})") from None
    return dict(meta.get("extra") or {})
