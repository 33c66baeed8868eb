"""A Hub mirror must not decide where files are written: the real `clover pull` against a loopback Hub
that lies (listing paths that climb out, absolute, backslash and drive paths, an ETag or a commit that
is a path) refuses with one line before anything touches the disk, inside or outside the cache."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hub_helpers import error_line, pulled_path, run_clover
from hub_server import HubServer, Lie
from synth_models import tiny_model_path

EVIL = "acme/Evil-GGUF"
MODEL = "Evil-Q8_0.gguf"
# From snapshots/<commit>/ four '..' reach tmp_path, from blobs/ three: each lie lands in tmp_path/outside.
UP4, UP3 = "../../../../", "../../../"
SENTINELS = ("pwned.gguf", "pwned", MODEL)


def _tree(root: Path, skip: Path) -> dict[str, tuple[bool, str]]:
    """Every entry under `root` but `skip`: (is a link, sha256 of its bytes or its link target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p == skip or skip in p.parents:
            continue
        if p.is_symlink():
            out[p.relative_to(root).as_posix()] = (True, str(p.readlink()))
        elif p.is_file():
            out[p.relative_to(root).as_posix()] = (False, hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            out[p.relative_to(root).as_posix()] = (False, "dir")
    return out


@pytest.fixture()
def hub():
    with HubServer() as server:
        server.state.add(EVIL, MODEL, tiny_model_path("Q8_0"))
        yield server


def _absolute(tmp: Path) -> str:
    return (tmp / "outside" / "pwned.gguf").as_posix()


CASES = {
    "listing path with ..": ("file path", lambda tmp: Lie(MODEL, path=UP4 + "outside/pwned.gguf")),
    "absolute listing path": ("file path", lambda tmp: Lie(MODEL, path=_absolute(tmp))),
    "backslash listing path": ("file path", lambda tmp: Lie(MODEL, path="..\\..\\..\\..\\outside\\pwned.gguf")),
    "drive listing path": ("file path", lambda tmp: Lie(MODEL, path="C:/outside/pwned.gguf")),
    "dot segment": ("file path", lambda tmp: Lie(MODEL, path="./Evil-Q8_0.gguf")),
    "empty segment": ("file path", lambda tmp: Lie(MODEL, path="F32//Evil-Q8_0.gguf")),
    "an unchosen file's path": ("file path", lambda tmp: Lie("README.md", path=UP4 + "outside/pwned")),
    "etag that is a path": ("etag", lambda tmp: Lie(MODEL, etag=UP3 + "outside/pwned")),
    "etag that is no digest": ("etag", lambda tmp: Lie(MODEL, etag="not-a-digest")),
    "commit that is a path": ("commit", UP3 + "outside"),
    "ref to a non-hex commit": ("commit", "not-a-commit"),
    "ref to a short commit": ("commit", "deadbeef"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_mirror_is_refused_before_anything_is_written(hub: HubServer, tmp_path: Path, case: str) -> None:
    what, lie = CASES[case]
    shown: str
    if what == "commit":
        hub.state.commits[EVIL] = shown = lie
    else:
        made = lie(tmp_path)
        if made.real not in hub.state.repos[EVIL]:
            hub.state.add(EVIL, made.real, tiny_model_path("Q8_0"))
        hub.state.lies[EVIL] = made
        shown = made.path if made.path is not None else made.etag
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in SENTINELS:
        (outside / name).write_text(f"sentinel {name}", encoding="utf-8")
    cache = tmp_path / "c"
    before = _tree(tmp_path, cache)
    res = run_clover(hub, cache, "pull", EVIL)
    assert error_line(res) == f"the Hub at {hub.endpoint} sent an unsafe {what} for {EVIL}: {shown!r}; " \
                              "nothing was written"
    assert _tree(tmp_path, cache) == before
    assert [p for p in cache.rglob("*") if not p.is_dir()] == []
    assert not any(t.path.startswith("/cdn/") for t in hub.state.transfers)  # not one byte was fetched


def test_the_same_mirror_telling_the_truth_is_pulled(hub: HubServer, tmp_path: Path) -> None:
    path = pulled_path(run_clover(hub, tmp_path / "c", "pull", EVIL))
    assert path == tmp_path / "c" / "models--acme--Evil-GGUF" / "snapshots" / hub.state.commits[EVIL] / MODEL


def test_a_cached_ref_that_names_no_commit_points_nowhere(hub: HubServer, tmp_path: Path) -> None:
    """A refs/main left by an older tool (or edited) with a path in it is not followed out of the cache."""
    cache = tmp_path / "c"
    pulled_path(run_clover(hub, cache, "pull", EVIL))
    folder = cache / "models--acme--Evil-GGUF"
    stray = tmp_path / "outside" / "Other-Q4_K_M.gguf"
    stray.parent.mkdir()
    stray.write_bytes(tiny_model_path("Q4_K_M").read_bytes())
    (folder / "refs" / "main").write_text(UP3 + "outside", encoding="utf-8")
    listed = json.loads(run_clover(hub, cache, "list", "--json").stdout)
    assert [(m["file"], m["commit"]) for m in listed] == [(MODEL, hub.state.commits[EVIL])]


def test_a_revision_that_is_a_path_is_not_a_model_reference(hub: HubServer, tmp_path: Path) -> None:
    url = f"https://huggingface.co/{EVIL}/tree/..%2F..%2F..%2Foutside"
    assert error_line(run_clover(hub, tmp_path / "c", "pull", url)) == \
        f"invalid model reference '{url}', expected <user>/<model>[:quant]"
