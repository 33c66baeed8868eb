"""Saved state is untrusted input and must never be lost: crafted, damaged and altered `.state`
files are refused with one line (the runtime loader), a 4xx (the real server's slot restore) or
one line and exit 1 (`clover run --prompt-cache`), before anything large is allocated; every save
goes through a fresh O_EXCL temporary file and a rename, so a planted `NAME.tmp` symlink is never
followed, concurrent saves to one name leave a whole file, and a full disk keeps the previous one."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clover_runtime import atomic_write, load_model, state_file
from clover_runtime.prompt_cache import PromptCache
from serve_helpers import chat_factory, live_server
from synth_models import tiny_model_path

from clover_cli.model_setup import COMPILING

SLOT_CTX = 512
_START = len(state_file.MAGIC) + 12
HUGE = 1 << 40  # a declared size no test machine could allocate


@pytest.fixture(scope="module")
def model():  # noqa: ANN201
    return load_model(tiny_model_path("Q8_0"), backend="numpy")


def _ids(model, n: int, seed: int) -> list[int]:  # noqa: ANN001
    return [int(t) for t in np.random.default_rng(seed).integers(10, model.config.n_tokens - 10, n)]


def _filled(model, n: int, seed: int, n_ctx: int = SLOT_CTX) -> PromptCache:  # noqa: ANN001
    cache = PromptCache(model, n_ctx, checkpoint_every=32)
    cache.prepare(_ids(model, n, seed))
    return cache


@pytest.fixture(scope="module")
def good(model, tmp_path_factory) -> bytes:  # noqa: ANN001
    """A valid saved state of the tiny model: 200 tokens, checkpoints at 64, 128 and 192 (multiples of 64)."""
    path = tmp_path_factory.mktemp("good") / "good.state"
    cache = _filled(model, 200, seed=1)
    assert [c.n_past for c in cache.checkpoints] == [64, 128, 192]
    state_file.save(cache, path, extra={"note": "kept"})
    return path.read_bytes()


# ---- the crafted files ---------------------------------------------------------------------------

def _parts(data: bytes) -> tuple[dict, bytes]:
    """The header and the array bytes of a valid file (the layout state_file's docstring gives)."""
    length = struct.unpack("<Q", data[12:20])[0]
    return json.loads(data[_START:_START + length]), data[_START + length:-32]


def _build(meta: dict | None, body: bytes, *, version: int = state_file.VERSION, header: bytes | None = None) -> bytes:
    """A file with a correct checksum, so only the checks of its content can refuse it."""
    header = json.dumps(meta).encode("utf-8") if header is None else header
    data = state_file.MAGIC + struct.pack("<IQ", version, len(header)) + header + body
    return data + hashlib.sha256(data).digest()


def _edit(good: bytes, change) -> bytes:  # noqa: ANN001
    meta, body = _parts(good)
    change(meta)
    return _build(meta, body)


def _set(*path_and_value):  # noqa: ANN002, ANN202
    *keys, value = path_and_value

    def change(meta: dict) -> None:
        target = meta
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value(target[keys[-1]]) if callable(value) else value

    return change


def _format1(good: bytes) -> bytes:
    """What clover wrote before: an .npz archive with a JSON `meta` array."""
    meta, _ = _parts(good)
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps({**meta, "version": 1}).encode(), dtype=np.uint8),
             k3=np.zeros((2, 80, 16), np.float32))
    return buf.getvalue()


def _flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0x5A]) + data[pos + 1:]


def _flip_token(good: bytes) -> bytes:
    """One token id changed in the header (same length), the checksum left as it was."""
    text = good.decode("latin-1")
    m = re.search(r'"tokens": \[(\d)', text)
    digit = "1" if m.group(1) != "1" else "2"
    return (text[:m.start(1)] + digit + text[m.end(1):]).encode("latin-1")


def crafted(good: bytes, n_tokens: int) -> dict[str, tuple[bytes, str]]:
    """Every hostile or damaged variant of `good`: name -> (file bytes, a word its refusal names)."""
    meta, body = _parts(good)
    n_arrays = len(meta["arrays"])
    k0 = meta["arrays"][0]
    return {
        "empty": (b"", "not a clover saved state"),
        "magic only": (state_file.MAGIC, "truncated"),
        "wrong magic": (b"NOTSTATE" + good[8:], "not a clover saved state"),
        "a JSON text": (b'{"messages": []}', "not a clover saved state"),
        "format 1 (npz)": (_format1(good), "older clover"),
        "newer version": (_build(meta, body, version=3), "format 3"),
        "version 0": (_build(meta, body, version=0), "format 0"),
        "header length 2**63": (good[:12] + struct.pack("<Q", 1 << 63) + good[20:], "header is longer"),
        "header length past the end": (good[:12] + struct.pack("<Q", len(good)) + good[20:], "header is longer"),
        "truncated in the arrays": (good[:len(good) * 2 // 3], "truncated"),
        "truncated checksum": (good[:-5], "truncated"),
        "trailing data": (_build(meta, body + b"\0" * 8), "trailing data"),
        "header not JSON": (_build(None, body, header=b"{not json"), "not valid JSON"),
        "header not UTF-8": (_build(None, body, header=b'"\xff\xfe"'), "not valid JSON"),
        "header nested 100k deep": (_build(None, body, header=b"[" * 100_000 + b"]" * 100_000), "not valid JSON"),
        "header a list": (_build(None, body, header=b"[]"), "header is not"),
        "header of another format": (_edit(good, _set("format", "npz")), "header is not"),
        "another model": (_edit(good, _set("model", "size", lambda s: s + 1)), "another model file"),
        "another model's header": (_edit(good, _set("model", "header_sha256", "0" * 64)), "another model file"),
        "no model": (_edit(good, lambda m: m.pop("model")), "no model identity"),
        "model size a string": (_edit(good, _set("model", "size", "12")), "no model identity"),
        "model name a number": (_edit(good, _set("model", "name", 5)), "no model identity"),
        "n_past 10**12": (_edit(good, _set("n_past", 10 ** 12)), "more than this context"),
        "n_past -1": (_edit(good, _set("n_past", -1)), "bad token count"),
        "n_past a string": (_edit(good, _set("n_past", "80")), "bad token count"),
        "n_past true": (_edit(good, _set("n_past", True)), "bad token count"),
        "n_past 80.0": (_edit(good, _set("n_past", 80.0)), "bad token count"),
        "a token short": (_edit(good, _set("tokens", lambda t: t[:-1])), "token ids"),
        "a token past the vocabulary": (_edit(good, _set("tokens", 0, n_tokens)), "token ids"),
        "a negative token": (_edit(good, _set("tokens", 0, -1)), "token ids"),
        "a token a string": (_edit(good, _set("tokens", 0, "7")), "token ids"),
        "tokens null": (_edit(good, _set("tokens", None)), "token ids"),
        "checkpoints out of order": (_edit(good, _set("checkpoints", lambda c: c[::-1])), "checkpoint"),
        "a checkpoint past n_past": (_edit(good, _set("checkpoints", 2, 500)), "checkpoint"),
        "a checkpoint at 0": (_edit(good, _set("checkpoints", 0, 0)), "checkpoint"),
        "checkpoints a dict": (_edit(good, _set("checkpoints", {})), "checkpoint"),
        "a checkpoint at every token": (_edit(good, _set("checkpoints", list(range(1, 80)))), "arrays"),
        "extra a list": (_edit(good, _set("extra", [1])), "caller data"),
        "an array of 2**40 rows": (_edit(good, _set("arrays", 0, "shape", [k0["shape"][0], HUGE, k0["shape"][2]])),
                                   "does not match this model"),
        "an array of 2**40 heads": (_edit(good, _set("arrays", 0, "shape", 0, HUGE)), "does not match this model"),
        "a negative shape": (_edit(good, _set("arrays", 0, "shape", 1, -80)), "does not match this model"),
        "an array one head more": (_edit(good, _set("arrays", 0, "shape", 0, lambda h: h + 1)),
                                   "does not match this model"),
        "float64 arrays": (_edit(good, _set("arrays", 0, "dtype", "<f8")), "does not match this model"),
        "object arrays": (_edit(good, _set("arrays", 0, "dtype", "|O")), "does not match this model"),
        "an array renamed": (_edit(good, _set("arrays", 0, "name", "k99")), "does not match this model"),
        "an array missing": (_edit(good, _set("arrays", lambda a: a[:-1])), f"{n_arrays} arrays"),
        "an array too many": (_edit(good, _set("arrays", lambda a: a + [a[-1]])), f"{n_arrays} arrays"),
        "arrays a string": (_edit(good, _set("arrays", "x")), f"{n_arrays} arrays"),
        "an array entry a number": (_edit(good, _set("arrays", 0, 5)), "does not match this model"),
        "a token altered": (_flip_token(good), "checksum"),
        "a byte of K flipped": (_flip(good, len(good) - 32 - len(body) + 17), "checksum"),
        "a byte of the last state flipped": (_flip(good, len(good) - 40), "checksum"),
        "the checksum flipped": (_flip(good, len(good) - 1), "checksum"),
        "the caller data altered": (good.replace(b'"kept"', b'"kegt"'), "checksum"),
    }


def _write_cases(folder: Path, cases: dict[str, tuple[bytes, str]]) -> dict[str, Path]:
    out = {}
    for i, (name, (data, _)) in enumerate(cases.items()):
        out[name] = folder / f"case{i}.state"
        out[name].write_bytes(data)
    return out


# ---- the runtime loader -------------------------------------------------------------------------

def test_good_file_round_trips(model, good, tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "g.state"
    path.write_bytes(good)
    cache = PromptCache(model, SLOT_CTX, checkpoint_every=32)
    loaded = state_file.load(cache, path)
    assert (loaded.extra, loaded.n_past, loaded.n_bytes) == ({"note": "kept"}, 199, len(good))
    assert cache.tokens == _ids(model, 200, seed=1)[:199] and [c.n_past for c in cache.checkpoints] == [64, 128, 192]
    fewer = PromptCache(model, SLOT_CTX, max_checkpoints=2)
    state_file.load(fewer, path)
    assert [c.n_past for c in fewer.checkpoints] == [128, 192]  # the newest that fit the bound
    ref = _filled(model, 200, seed=1)
    tail = _ids(model, 3, seed=2)
    np.testing.assert_array_equal(model.forward(tail, fewer.state), model.forward(tail, ref.state))


def test_every_crafted_file_is_refused_with_one_line_before_any_allocation(model, good, tmp_path) -> None:  # noqa: ANN001
    cases = crafted(good, model.config.n_tokens)
    paths = _write_cases(tmp_path, cases)
    cache = _filled(model, 20, seed=3)
    held = list(cache.tokens)
    tracemalloc.start()
    try:
        for name, path in paths.items():
            tracemalloc.reset_peak()
            with pytest.raises(state_file.StateFileError) as err:
                state_file.load(cache, path)
            peak = tracemalloc.get_traced_memory()[1]
            msg = err.value.message
            assert "\n" not in msg and msg.startswith(str(path)), (name, msg)
            assert cases[name][1] in msg, (name, msg)
            assert peak < 8 << 20, (name, peak)  # nothing near a declared size was allocated
            assert cache.tokens == held and cache.n_cached == 19, name  # a refused file leaves the cache alone
    finally:
        tracemalloc.stop()
    missing = tmp_path / "none.state"
    with pytest.raises(state_file.StateFileError) as err:
        state_file.load(cache, missing)
    assert err.value.missing and "no saved state" in err.value.message


def test_any_flipped_byte_or_cut_is_refused(model, good, tmp_path) -> None:  # noqa: ANN001
    """The checksum covers the whole file: no single changed byte loads, whichever it is."""
    rng = np.random.default_rng(7)
    cache = PromptCache(model, SLOT_CTX)
    path = tmp_path / "f.state"
    positions = sorted(set(rng.integers(0, len(good), 150).tolist()) | set(range(24)) | {len(good) - 1})
    for pos in positions:
        path.write_bytes(_flip(good, pos))
        with pytest.raises(state_file.StateFileError):
            state_file.load(cache, path)
    for cut in sorted(set(rng.integers(0, len(good), 40).tolist())):
        path.write_bytes(good[:cut])
        with pytest.raises(state_file.StateFileError):
            state_file.load(cache, path)
    assert cache.n_cached == 0


def test_a_directory_or_unreadable_path_is_one_line(model, tmp_path) -> None:  # noqa: ANN001
    cache = PromptCache(model, SLOT_CTX)
    folder = tmp_path / "d"
    folder.mkdir()
    with pytest.raises(state_file.StateFileError, match="cannot read"):
        state_file.load(cache, folder)
    with pytest.raises(state_file.StateFileError, match="cannot write"):
        state_file.save(_filled(model, 10, seed=4), folder)  # a folder is where the file would go
    assert [p.name for p in tmp_path.iterdir()] == ["d"] and folder.is_dir()  # and no temporary file is left


# ---- writes ---------------------------------------------------------------------------------------

def _symlinks_work(tmp_path: Path) -> bool:
    try:
        (tmp_path / ".probe").symlink_to(tmp_path / "nowhere")
    except (OSError, NotImplementedError):
        return False
    (tmp_path / ".probe").unlink()
    return True


def test_a_planted_tmp_symlink_is_never_followed(model, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    if os.name != "posix" or not _symlinks_work(tmp_path):
        pytest.skip("needs POSIX symlinks")
    outside = tmp_path / "outside.txt"
    outside.write_text("precious", encoding="utf-8")
    folder = tmp_path / "saves"
    folder.mkdir()
    target = folder / "s.state"
    (folder / "s.state.tmp").symlink_to(outside)  # the old fixed temporary name
    # and one at the exact name the writer draws first: O_EXCL refuses it, the writer draws again
    draws = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(atomic_write.secrets, "token_hex", lambda n: next(draws))
    (folder / ".s.state.aaaaaaaaaaaa.tmp").symlink_to(outside)
    state_file.save(_filled(model, 30, seed=5), target)
    assert outside.read_text(encoding="utf-8") == "precious"
    assert not target.is_symlink() and state_file.load(PromptCache(model, SLOT_CTX), target).n_past == 29
    assert sorted(p.name for p in folder.iterdir()) == [".s.state.aaaaaaaaaaaa.tmp", "s.state", "s.state.tmp"]
    # a symlink at the target itself is replaced, not written through
    link = folder / "t.state"
    link.symlink_to(outside)
    monkeypatch.undo()
    atomic_write.write_text(link, "new")
    assert outside.read_text(encoding="utf-8") == "precious" and not link.is_symlink()


def test_concurrent_saves_to_one_name_leave_a_whole_file(model, tmp_path) -> None:  # noqa: ANN001
    caches = [_filled(model, 20 + 9 * i, seed=10 + i) for i in range(6)]
    held = {tuple(c.tokens) for c in caches}
    target = tmp_path / "shared.state"
    for _ in range(12):
        assert _at_once([lambda c=c: state_file.save(c, target) for c in caches])
        back = PromptCache(model, SLOT_CTX)
        state_file.load(back, target)
        assert tuple(back.tokens) in held
        assert [p.name for p in tmp_path.iterdir()] == ["shared.state"]  # no temporary file left behind


def _at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run `calls` in threads released together; their results (an exception fails the test)."""
    start = threading.Barrier(len(calls))

    def call(f: Callable[[], Any]) -> Any:
        start.wait()
        return f()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(call, calls))


def _full_disk_after(monkeypatch, n_bytes: int) -> None:  # noqa: ANN001
    """os.write fails with ENOSPC once `n_bytes` have been written (a full disk at the OS boundary)."""
    real = os.write
    written = [0]

    def write(fd: int, data) -> int:  # noqa: ANN001
        if written[0] + len(data) > n_bytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written[0] += len(data)
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_keeps_the_previous_file(model, good, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    target = tmp_path / "s.state"
    target.write_bytes(good)
    chat = tmp_path / "chat.json"
    chat.write_text('{"messages": []}', encoding="utf-8")
    cache = _filled(model, 60, seed=6)
    _full_disk_after(monkeypatch, 4096)
    with pytest.raises(state_file.StateFileError) as err:
        state_file.save(cache, target)
    assert err.value.message == f"{target}: cannot write: {os.strerror(errno.ENOSPC)}"
    with pytest.raises(OSError) as exc:
        atomic_write.write_text(chat, json.dumps({"messages": ["x" * 10_000]}))
    assert exc.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert target.read_bytes() == good and chat.read_text(encoding="utf-8") == '{"messages": []}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.json", "s.state"]


# ---- the real server -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(slot_dir):  # noqa: ANN001
    with live_server(chat_factory(tiny_model_path("Q8_0"), SLOT_CTX), model_id="m", n_ctx_slot=2 * SLOT_CTX,
                     n_parallel=2, slot_save_path=str(slot_dir)) as live:
        yield live


def _error(r, status: int, folder: Path) -> str:  # noqa: ANN001
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] and "\n" not in err["message"]
    assert str(folder) not in err["message"]  # the server's folders stay its own
    return err["message"]


def _max_rss_mb() -> float:
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024 / 1024 if sys.platform == "darwin" else rss / 1024


def test_server_refuses_every_crafted_file_with_a_4xx(server, model, good, slot_dir) -> None:  # noqa: ANN001
    cases = crafted(good, model.config.n_tokens)
    paths = _write_cases(slot_dir, cases)
    before = _max_rss_mb() if os.name == "posix" else 0.0
    with server.client() as c:
        (slot_dir / "good.state").write_bytes(good)
        ok = c.post("/slots/0?action=restore", json={"filename": "good.state"})
        assert ok.status_code == 200 and ok.json()["n_restored"] == 199 and ok.json()["n_read"] == len(good)
        for name, path in paths.items():
            r = c.post("/slots/0?action=restore", json={"filename": path.name})
            msg = _error(r, 400, slot_dir)
            assert msg.startswith(f"slot file {path.name!r}: ") and cases[name][1] in msg, (name, msg)
        assert c.get("/slots").json()[0]["n_cached_tokens"] == 199  # no refused file touched the slot
        gone = c.post("/slots/1?action=restore", json={"filename": "never-saved.state"})
        _error(gone, 404, slot_dir)
    if os.name == "posix":
        assert _max_rss_mb() - before < 256  # no crafted size was allocated


def test_server_slot_names_stay_inside_the_folder(server, slot_dir, tmp_path) -> None:  # noqa: ANN001
    outside = tmp_path / "outside.state"
    outside.write_bytes(b"precious")
    names = ["../x.state", "/etc/passwd", str(outside), "a/b.state", "a\\b.state", "C:x.state", "..", ".",
             "a\x00b", "tab\there", "é" * 200, "x:stream"]
    links = []
    if os.name == "posix" and _symlinks_work(slot_dir):
        (slot_dir / "link.state").symlink_to(outside)
        (slot_dir / "loop.state").symlink_to(slot_dir / "loop.state")
        links = ["link.state", "loop.state"]
    with server.client() as c:
        for name in names + links:
            for action in ("save", "restore"):
                r = c.post(f"/slots/0?action={action}", json={"filename": name})
                assert _error(r, 400, slot_dir) == "filename must be a plain file name inside --slot-save-path", name
    assert outside.read_bytes() == b"precious"


def test_server_saves_past_a_planted_tmp_symlink(server, model, slot_dir, tmp_path) -> None:  # noqa: ANN001
    if os.name != "posix" or not _symlinks_work(slot_dir):
        pytest.skip("needs POSIX symlinks")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    (slot_dir / "planted.state.tmp").symlink_to(outside)
    state_file.save(_filled(model, 50, seed=8), slot_dir / "planted-src.state")
    with server.client() as c:
        assert c.post("/slots/1?action=restore", json={"filename": "planted-src.state"}).status_code == 200
        r = c.post("/slots/1?action=save", json={"filename": "planted.state"})
        assert r.status_code == 200 and r.json()["n_saved"] == 49
    assert outside.read_bytes() == b"precious"
    assert (slot_dir / "planted.state.tmp").is_symlink() and (slot_dir / "planted.state").read_bytes() != b"precious"


def _save_slot(server, slot: int, name: str) -> int:  # noqa: ANN001
    with server.client() as c:
        return c.post(f"/slots/{slot}?action=save", json={"filename": name}).status_code


def test_server_two_slots_saved_to_one_name_at_once(server, model, slot_dir) -> None:  # noqa: ANN001
    """Each round: slot 0 and slot 1 hold different states and save to one name together; both
    answer 200, and the file then restores as one of them (12 rounds)."""
    for i, n in enumerate((40, 70)):
        state_file.save(_filled(model, n, seed=20 + i), slot_dir / f"src{i}.state")
    with server.client() as c:
        for slot in (0, 1):
            assert c.post(f"/slots/{slot}?action=restore", json={"filename": f"src{slot}.state"}).status_code == 200
        counts = set()
        for _ in range(12):
            assert _at_once([lambda s=s: _save_slot(server, s, "race.state") for s in (0, 1)]) == [200, 200]
            r = c.post("/slots/0?action=restore", json={"filename": "race.state"})
            assert r.status_code == 200, r.text
            counts.add(r.json()["n_restored"])
            assert c.post("/slots/0?action=restore", json={"filename": "src0.state"}).status_code == 200
        assert counts <= {39, 69}
    assert not [p.name for p in slot_dir.iterdir() if p.name.startswith(".race.state")]


# ---- clover run --prompt-cache ------------------------------------------------------------------

RUN_CASES = ["wrong magic", "format 1 (npz)", "truncated in the arrays", "another model", "n_past 10**12",
             "a token past the vocabulary", "an array of 2**40 rows", "a byte of K flipped"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", "COLUMNS": "200"}
    env.pop("CLOVER_DEBUG", None)
    return env


def _run(args: list[str], home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clover_cli", "run", str(tiny_model_path("Q8_0")), *args],
                          input="", capture_output=True, text=True, env=_env(home), timeout=180)


def test_run_prompt_cache_refuses_crafted_files_with_one_line(model, good, tmp_path) -> None:  # noqa: ANN001
    cases = crafted(good, model.config.n_tokens)
    for name in RUN_CASES:
        path = tmp_path / "p.state"
        path.write_bytes(cases[name][0])
        r = _run(["Hello", "-n", "2", "--no-think", "--decode", "ar", "--prompt-cache", str(path)], tmp_path)
        lines = [line for line in r.stderr.strip().splitlines() if line != COMPILING]  # a cold kernel cache says so
        assert r.returncode == 1 and len(lines) == 1, (name, r.stderr)
        assert lines[0].startswith(f"error: {path}: ") and cases[name][1] in lines[0], (name, lines)
        assert path.read_bytes() == cases[name][0]  # a refused file is left for the user to look at


def test_run_prompt_cache_saves_past_a_planted_tmp_symlink(tmp_path) -> None:
    if os.name != "posix" or not _symlinks_work(tmp_path):
        pytest.skip("needs POSIX symlinks")
    outside = tmp_path / "outside.txt"
    outside.write_text("precious", encoding="utf-8")
    path = tmp_path / "p.state"
    Path(f"{path}.tmp").symlink_to(outside)
    r = _run(["Hello", "-n", "2", "--no-think", "--decode", "ar", "--prompt-cache", str(path)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert outside.read_text(encoding="utf-8") == "precious" and path.stat().st_size > 0


# ---- the REPL's /save on a really full disk -----------------------------------------------------

def _tiny_disk_prefix(mount: Path) -> list[str] | None:
    """`unshare` into a private mount namespace (as mapped root) where a 64 KiB tmpfs is mounted on
    `mount`; None where that is not possible (not Linux, no unshare, user namespaces off)."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=64k none "{mount}"'],
                           capture_output=True, timeout=30)
    return ["unshare", "-rm"] if probe.returncode == 0 else None


def test_repl_save_on_a_full_disk_keeps_the_previous_save(model, tmp_path) -> None:  # noqa: ANN001
    import pexpect

    disk, prev, out = tmp_path / "disk", tmp_path / "prev", tmp_path / "out"
    for d in (disk, prev, out):
        d.mkdir()
    prefix = _tiny_disk_prefix(disk)
    if prefix is None:
        pytest.skip("no tiny tmpfs here (needs Linux user namespaces); the full-disk write is covered above")
    conversation = {"system": None, "messages": [{"role": "user", "content": "Hello"},
                                                 {"role": "assistant", "content": "Hi there."}]}
    (prev / "chat.json").write_text(json.dumps(conversation), encoding="utf-8")
    state_file.save(_filled(model, 30, seed=30, n_ctx=4096), prev / "chat.json.state")
    before = {p.name: p.read_bytes() for p in prev.iterdir()}
    script = (f'mount -t tmpfs -o size=1m none "{disk}" && cp "{prev}"/* "{disk}"/ '
              f'&& (head -c 4194304 /dev/zero > "{disk}/filler" 2>/dev/null; true) '
              f'&& "{sys.executable}" -m clover_cli run "{tiny_model_path("Q8_0")}" -n 4 --no-think --decode ar '
              f'-c 4096; '
              f'rc=$?; rm -f "{disk}/filler"; cp -a "{disk}"/. "{out}"/; exit $rc')
    child = pexpect.spawn(prefix[0], [*prefix[1:], "sh", "-c", script], env=_env(tmp_path), encoding="utf-8",
                          timeout=120, dimensions=(40, 200))
    try:
        child.expect(">>> ")
        child.sendline(f"/load {disk / 'chat.json'}")
        child.expect(r"Loaded 2 messages and 29 tokens of state\.")
        child.expect(">>> ")
        child.sendline("/system " + "Answer briefly. " * 320)  # the new save outgrows the old one's pages
        child.expect("System prompt set.")
        child.expect(">>> ")
        child.sendline(f"/save {disk / 'chat.json'}")
        child.expect(r"cannot save [^\r\n]*chat\.json: No space left on device\r\n")
        child.expect(">>> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous save, whole; no temporary file
