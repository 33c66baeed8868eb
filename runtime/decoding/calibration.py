"""This machine's decode costs per model file, thread count and device, kept beside the kernel cache.

`--decode auto` starts each reply from what earlier replies measured (`auto.Costs`): the seconds of
a decode step and of a preview pass, and how diffusion's seconds per token compared with AR's.
Each reply measures them again as it runs; the record is rewritten when a figure drifts by more
than `DRIFT`, so a new thread count, a busier machine or a GPU soon shows. The rewrite (atomic,
so fsynced) runs on a writer thread of its own: a reply never waits on the disk. A missing,
unreadable or read-only record only means the next reply measures from scratch.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..atomic_write import write_bytes
from ..paths import cache_dir
from .auto import Costs

DRIFT = 0.10
FILE_NAME = "decode-costs.json"
_lock = threading.Lock()
_memory: dict[str, Costs] = {}
_written: dict[str, Costs] = {}  # what the file holds for a key, as this process last read or wrote it
_waited: dict[str, float] = {}  # AR seconds since diffusion was last tried, across this process's replies
_pending: dict[Path, dict[str, Costs]] = {}  # figures waiting for the writer thread, by record file
_writer: ThreadPoolExecutor | None = None  # one thread: writes land in the order they were asked
_last_write: Future | None = None


def record_path() -> Path:
    return cache_dir() / FILE_NAME


def model_key(model: Any) -> str:
    """The file (path, size, modification time), the kernels' thread count and the device."""
    path = Path(model.file.path)
    try:
        st = path.stat()
        stamp = f"{st.st_size}-{st.st_mtime_ns}"
    except OSError:
        stamp = "?"
    threads = getattr(model.weights, "n_threads", None)
    if threads is None:
        import numba

        threads = numba.get_num_threads()
    device = "cpu" if getattr(model, "device_layers", None) is None else "device"
    return f"{path.resolve()}|{stamp}|{model.backend}|{threads}|{device}"


def _read(path: Path | None = None) -> dict[str, Any]:
    try:
        data = json.loads((path or record_path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _costs(entry: Any) -> Costs | None:
    try:
        step, pas = float(entry["step_s"]), float(entry["pass_s"])
        rel, tokens = entry.get("relative"), entry.get("block_tokens")
        rel = None if rel is None else float(rel)
        tokens = None if tokens is None else float(tokens)
    except (TypeError, KeyError, ValueError, AttributeError):
        return None
    if not (step > 0 and pas > 0) or (rel is not None and not rel > 0):
        return None
    return Costs(step, pas, rel, tokens if tokens is not None and tokens > 0 else None, *_coreset(entry))


def _coreset(entry: dict) -> tuple[int | None, float | None]:
    """The coreset a record chose and its pass share; (None, None) when unmeasured or unreadable."""
    try:
        size, share = int(entry["coreset"]), float(entry["coreset_share"])
    except (TypeError, KeyError, ValueError):
        return None, None
    return (size, share) if size >= 0 and share > 0 else (None, None)


def load(model: Any) -> Costs | None:
    """The costs recorded for this model on this machine, or None before the first measurement."""
    key = model_key(model)
    with _lock:
        if key in _memory:
            return _memory[key]
        costs = _costs(_read().get(key))
        if costs is not None:
            _memory[key] = _written[key] = costs
        return costs


def _drifted(old: Costs | None, new: Costs) -> bool:
    if old is None:
        return True
    pairs = [(old.step_s, new.step_s), (old.pass_s, new.pass_s)]
    if new.relative is not None:
        if old.relative is None:
            return True
        pairs.append((old.relative, new.relative))
    if (old.coreset, old.coreset_share) != (new.coreset, new.coreset_share):
        return True
    return any(abs(b - a) > DRIFT * a for a, b in pairs)


def update(model: Any, costs: Costs) -> None:
    """Remember what a reply measured; the file is rewritten only when a figure drifted from what
    it holds (against the last reply's figures, a slow drift rewrote it after every reply), and
    then by the writer thread: the demo waited on 28 atomic writes (56 fsyncs) in 40 replies,
    4 % of its decode time."""
    global _writer, _last_write
    key = model_key(model)
    with _lock:
        _memory[key] = costs
        if not _drifted(_written.get(key), costs):
            return
        _written[key] = costs
        _pending.setdefault(record_path(), {})[key] = costs
        if _writer is None:
            _writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clover-costs")
        _last_write = _writer.submit(_write_pending)


def _write_pending() -> None:
    """Merge the pending figures into the records on disk (the writer thread)."""
    with _lock:
        todo = dict(_pending)
        _pending.clear()
    for path, entries in todo.items():
        data = _read(path)
        for key, costs in entries.items():
            data[key] = {"step_s": costs.step_s, "pass_s": costs.pass_s, "relative": costs.relative,
                         "block_tokens": costs.block_tokens, "coreset": costs.coreset,
                         "coreset_share": costs.coreset_share}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes(path, json.dumps(data, indent=1).encode("utf-8"))
        except OSError:
            pass  # a read-only cache: the next process measures again


def flush() -> None:
    """Wait until the record holds every figure `update` asked to write (the interpreter's exit
    waits for the writer thread too)."""
    job = _last_write
    if job is not None:
        job.result()


def waited(model: Any) -> float:
    """AR seconds written since diffusion was last tried on this model, over this process's replies:
    short replies add up to the next probe instead of each starting the wait again."""
    with _lock:
        return _waited.get(model_key(model), 0.0)


def note_waited(model: Any, seconds: float) -> None:
    with _lock:
        _waited[model_key(model)] = seconds
