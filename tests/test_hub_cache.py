"""The model cache: `clover list` and `clover rm`, a cache without symlinks (Windows), sharing the
cache with huggingface_hub itself, and the Python API other commands use (`resolve_model`,
`remote_header`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clover_runtime.errors import HubError
from clover_runtime.gguf_file import open_gguf
from hub_helpers import blobs, error_line, pulled_path, run_clover, split_model
from hub_server import HubServer
from synth_models import tiny_model_path

from clover_cli.advice import hint_for

TINY, SPLIT = "acme/Tiny-GGUF", "acme/Split-GGUF"


@pytest.fixture()
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    # In this process too, huggingface_hub must not fetch its telemetry registry from the internet.
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    with HubServer() as server:
        server.state.add(TINY, "Tiny-Q8_0.gguf", tiny_model_path("Q8_0"))
        server.state.add(TINY, "Tiny-Q4_K_M.gguf", tiny_model_path("Q4_K_M"))
        for shard in split_model(tmp_path / "split"):
            server.state.add(SPLIT, f"F32/{shard.name}", shard)
        yield server


def test_list_and_rm_on_a_cache_with_two_models(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    q8 = pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0"))
    split = pulled_path(run_clover(hub, cache, "pull", f"{SPLIT}:F32"))
    listing = json.loads(run_clover(hub, cache, "list", "--json").stdout)
    assert [(m["name"], m["path"], len(m["files"])) for m in listing] == [
        (f"{SPLIT}:F32", str(split), 3), (f"{TINY}:Q8_0", str(q8), 1)]
    assert listing[1]["size"] == q8.stat().st_size
    assert listing[0]["size"] == sum(Path(f).stat().st_size for f in listing[0]["files"])
    table = run_clover(hub, cache, "list").stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "PATH"]
    assert table[2].split() == [f"{TINY}:Q8_0", "463.7", "KiB", str(q8)]
    split_blobs = blobs(cache / "models--acme--Split-GGUF")

    refused = run_clover(hub, cache, "rm", f"{TINY}:Q8_0")
    assert error_line(refused) == "not deleting 1 model(s) without confirmation"
    assert q8.exists()
    rm = run_clover(hub, cache, "rm", f"hf.co/{TINY}:q8_0", "-y")
    assert rm.returncode == 0, rm.stderr
    assert rm.stdout.strip() == "deleted 1 model(s), freed 463.7 KiB"
    assert not (cache / "models--acme--Tiny-GGUF").exists()
    assert blobs(cache / "models--acme--Split-GGUF") == split_blobs
    assert [m["name"] for m in json.loads(run_clover(hub, cache, "list", "--json").stdout)] == [f"{SPLIT}:F32"]
    assert error_line(run_clover(hub, cache, "rm", TINY, "-y")) == f"no cached model matches {TINY}"
    assert run_clover(hub, cache, "rm", SPLIT, "-y").returncode == 0
    empty = run_clover(hub, cache, "list").stdout.splitlines()
    assert empty[0] == f"no models in {cache} (get one with: clover pull)"
    assert empty[2].split()[:3] == ["demo", "(built", "in)"]  # the model that ships with clover


def test_rm_of_one_quant_keeps_the_other(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    q8 = pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0"))
    q4 = pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q4_K_M"))
    folder = cache / "models--acme--Tiny-GGUF"
    assert len(blobs(folder)) == 2
    assert run_clover(hub, cache, "rm", f"{TINY}:Q4_K_M", "-y").returncode == 0
    assert not q4.exists() and q8.is_file()
    assert blobs(folder) == [q8.resolve()]


def _copy_mode_cache(cache: Path, hub: HubServer) -> Path:
    """The layout huggingface_hub leaves on Windows without symlinks: real files in the snapshot."""
    commit = hub.state.commits[TINY]
    snap = cache / "models--acme--Tiny-GGUF" / "snapshots" / commit
    snap.mkdir(parents=True)
    (cache / "models--acme--Tiny-GGUF" / "blobs").mkdir()
    (cache / "models--acme--Tiny-GGUF" / "refs").mkdir()
    (cache / "models--acme--Tiny-GGUF" / "refs" / "main").write_text(commit, encoding="utf-8")
    shutil.copyfile(hub.state.repos[TINY]["Tiny-Q8_0.gguf"].data_path, snap / "Tiny-Q8_0.gguf")
    return snap / "Tiny-Q8_0.gguf"


def test_a_cache_without_symlinks_works(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    copy = _copy_mode_cache(cache, hub)
    assert [m["path"] for m in json.loads(run_clover(hub, cache, "list", "--json").stdout)] == [str(copy)]
    res = run_clover(hub, cache, "inspect", f"{TINY}:Q8_0", "--json", extra={"HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr
    assert pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0")) == copy  # the Hub agrees: nothing fetched
    assert hub.state.file_transfers(hub.state.repos[TINY]["Tiny-Q8_0.gguf"].sha256) == []
    rm = run_clover(hub, cache, "rm", f"{TINY}:Q8_0", "-y")
    assert rm.stdout.strip() == "deleted 1 model(s), freed 463.7 KiB"
    assert not (cache / "models--acme--Tiny-GGUF").exists()


def test_the_cache_is_shared_with_huggingface_hub(hub: HubServer, tmp_path: Path) -> None:
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi(endpoint=hub.endpoint)  # the test Hub speaks the client's own calls too
    info = api.model_info(SPLIT, files_metadata=True)
    assert info.sha == hub.state.commits[SPLIT]
    assert {(s.rfilename, s.size, s.lfs.sha256) for s in info.siblings} == \
        {(f.path, f.size, f.sha256) for f in hub.state.repos[SPLIT].values()}
    tree = [e.path for e in api.list_repo_tree(SPLIT, recursive=True)]
    assert tree == ["F32", *sorted(hub.state.repos[SPLIT])]
    assert api.list_repo_refs(SPLIT).branches[0].target_commit == hub.state.commits[SPLIT]
    cache = tmp_path / "c"
    theirs = Path(hf_hub_download(TINY, "Tiny-Q4_K_M.gguf", cache_dir=cache, endpoint=hub.endpoint))
    ours = pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0"))
    assert [m["path"] for m in json.loads(run_clover(hub, cache, "list", "--json").stdout)] == \
        [str(theirs), str(ours)]
    offline = run_clover(hub, cache, "inspect", f"{TINY}:Q4_K_M", "--json", extra={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr
    again = hf_hub_download(TINY, "Tiny-Q8_0.gguf", cache_dir=cache, endpoint=hub.endpoint, local_files_only=True)
    assert Path(again) == ours


def test_python_api(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clover_runtime.hub import find_cached, parse_model_ref, remote_header, resolve_model

    _api_env(monkeypatch, hub, tmp_path / "c")
    local = tiny_model_path("Q8_0")
    assert resolve_model(str(local)) == local
    with pytest.raises(HubError) as err:
        resolve_model(f"{TINY}:Q8_0", download=False)
    assert (err.value.message, err.value.why) == (f"{TINY}:Q8_0 is not downloaded yet", "not_downloaded")
    assert f"download it first with: clover pull {TINY}:Q8_0" in hint_for(err.value)  # the CLI words the fact
    split = remote_header(f"{SPLIT}:F32")
    with open_gguf(hub.state.repos[SPLIT]["F32/Split-F32-00001-of-00003.gguf"].data_path) as whole:
        assert split.tensors == whole.tensors
        assert split.metadata.keys() == whole.metadata.keys() and split.file_size == whole.file_size
    path = resolve_model(f"{TINY}:Q8_0")
    assert find_cached(parse_model_ref(f"{TINY}:Q8_0")) == path
    before = len(hub.state.transfers)
    assert resolve_model(f"{TINY}:Q8_0") == path and len(hub.state.transfers) == before  # cache first, no network


def _api_env(monkeypatch: pytest.MonkeyPatch, hub: HubServer, cache: Path) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("CLOVER_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for var in ("HF_HUB_OFFLINE", "CLOVER_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("links", ["hard links", "no links"])
def test_downloads_without_symlinks(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    links: str) -> None:
    """Windows without Developer Mode refuses symlinks (and FAT drives hard links too)."""
    import os

    from clover_runtime.hub import find_cached, list_cached, matching, parse_model_ref, remove, resolve_model

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(1314, "A required privilege is not held by the client")

    cache = tmp_path / "c"
    _api_env(monkeypatch, hub, cache)
    monkeypatch.setattr(os, "symlink", refuse)
    if links == "no links":
        monkeypatch.setattr(os, "link", refuse)
    path = resolve_model(f"{TINY}:Q8_0")
    hosted = hub.state.repos[TINY]["Tiny-Q8_0.gguf"]
    assert not path.is_symlink() and path.read_bytes() == hosted.data_path.read_bytes()
    blob = cache / "models--acme--Tiny-GGUF" / "blobs" / hosted.sha256
    assert blob.exists() is (links == "hard links")
    assert find_cached(parse_model_ref(f"{TINY}:Q8_0")) == path
    assert [m.path for m in list_cached()] == [path]
    assert remove(matching(TINY)) == hosted.size
    assert not (cache / "models--acme--Tiny-GGUF").exists()


def test_cache_folder_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clover_runtime.hub import cache_root

    for var in ("CLOVER_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("USERPROFILE", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cache_root() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    assert cache_root() == tmp_path / "hub-cache"
    monkeypatch.setenv("CLOVER_CACHE", str(tmp_path / "clover"))
    assert cache_root() == tmp_path / "clover"


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i: the file can be neither renamed nor deleted, as Windows treats a model a running
    server maps (needs root and a file system with the attribute)."""
    if shutil.which("chattr") is None:
        return False
    import subprocess

    return subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


def test_rm_of_a_model_in_use_deletes_nothing_and_says_so(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    q8 = pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0"))
    blob = q8.resolve()
    if not _immutable(blob, True):
        pytest.skip("chattr +i is not available here (root and ext4/xfs/btrfs)")
    try:
        rm = run_clover(hub, cache, "rm", f"{TINY}:Q8_0", "-y")
        assert rm.returncode == 1 and "Traceback" not in rm.stderr, rm.stderr
        assert error_line(rm) == f"cannot delete {blob}: it is in use; nothing was deleted"
        assert "clover stop" in rm.stderr
        assert q8.is_file() and q8.resolve() == blob  # the snapshot entry is still there
    finally:
        _immutable(blob, False)
    assert run_clover(hub, cache, "rm", f"{TINY}:Q8_0", "-y").returncode == 0
    assert not q8.exists() and not blob.exists()
