"""`clover pull`, `list`, `rm` and remote `inspect` against a Hub-compatible server on loopback,
through the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub_server import HubServer
from runtime.hub import parse_model_ref
from runtime.hub.select import choose
from synth_models import tiny_model_path

REPO = "acme/Tiny-GGUF"


def _clover(hub: HubServer, cache: Path, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "CLOVER_CACHE": str(cache), "HF_HUB_DISABLE_TELEMETRY": "1",
           **(extra or {})}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "clover_cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture()
def hub(tmp_path: Path):
    q8 = tiny_model_path("Q8_0")
    q4 = tiny_model_path("Q4_K_M")
    with HubServer() as server:
        server.state.add(REPO, "Tiny-Q8_0.gguf", q8)
        server.state.add(REPO, "Tiny-Q4_K_M.gguf", q4)
        server.state.add(REPO, "mmproj-Tiny-F16.gguf", q8)
        server.state.add("acme/Split-GGUF", "Q8_0/Split-Q8_0-00001-of-00002.gguf", q8)
        server.state.add("acme/Split-GGUF", "Q8_0/Split-Q8_0-00002-of-00002.gguf", q4)
        server.state.add("acme/Huge-GGUF", "Huge-Q4_K_M.gguf", None, declared_size=10 * 2**40)
        yield server


def test_identifier_forms() -> None:
    assert parse_model_ref("a/b:q4_k_m").quant == "Q4_K_M"
    assert parse_model_ref("hf.co/a/b:Q8_0").repo == "a/b"
    assert parse_model_ref("huggingface.co/a/b").quant is None
    url = parse_model_ref("https://huggingface.co/a/b/blob/main/sub/x-Q8_0.gguf")
    assert (url.repo, url.file, url.revision) == ("a/b", "sub/x-Q8_0.gguf", "main")
    assert parse_model_ref("a/b", file="x.gguf").file == "x.gguf"
    default = parse_model_ref(None)
    assert (default.repo, default.quant) == ("Diffuspace/Clover-35B-A3B-Preview-GGUF", "Q4_K_M")
    for bad in ("noslash", "a/b/c", "a/b:", "a b/c"):
        with pytest.raises(Exception, match="invalid model reference"):
            parse_model_ref(bad)


def test_tag_matching_rules() -> None:
    files = ["m-Q4_K_M.gguf", "m-UD-Q4_K_M.gguf", "m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf",
             "mmproj-m-F16.gguf"]
    assert choose(files, "r", "Q8_0", None)[0] == "m-Q8_0-00001-of-00002.gguf"
    assert choose(files, "r", "q4_k_m", None)[0] == "m-Q4_K_M.gguf"
    assert choose(files, "r", "UD-Q4_K_M", None)[0] == "m-UD-Q4_K_M.gguf"
    with pytest.raises(Exception, match="no Q5_K_M file in repository r; available: "):
        choose(files, "r", "Q5_K_M", None)
    with pytest.raises(Exception, match="several files match Q4_K_M"):
        choose(["a-Q4_K_M.gguf", "b-Q4_K_M.gguf"], "r", "Q4_K_M", None)
    assert choose(["x-F16.gguf", "x-Q8_0.gguf"], "r", None, None)[0] == "x-Q8_0.gguf"


def test_pull_verifies_sha256_then_list_and_rm(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "cache dïr"
    res = _clover(hub, cache, "pull", f"{REPO}:Q8_0")
    assert res.returncode == 0, res.stderr
    path = Path(res.stdout.strip().removeprefix("done: "))
    want = hub.state.repos[REPO]["Tiny-Q8_0.gguf"].sha256()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == want
    assert _clover(hub, cache, "pull", "acme/Split-GGUF:Q8_0").returncode == 0
    listing = json.loads(_clover(hub, cache, "list", "--json").stdout)
    names = {m["name"] for m in listing}
    assert names == {f"{REPO}:Q8_0", "acme/Split-GGUF:Q8_0"}
    split = next(m for m in listing if m["repo"] == "acme/Split-GGUF")
    assert len(split["files"]) == 2
    rm = _clover(hub, cache, "rm", f"{REPO}:Q8_0", "-y")
    assert rm.returncode == 0, rm.stderr
    left = json.loads(_clover(hub, cache, "list", "--json").stdout)
    assert [m["name"] for m in left] == ["acme/Split-GGUF:Q8_0"]
    assert not (cache / "models--acme--Tiny-GGUF").exists()


def test_cut_download_resumes_without_a_second_full_transfer(hub: HubServer, tmp_path: Path) -> None:
    size = hub.state.repos[REPO]["Tiny-Q4_K_M.gguf"].size
    hub.state.cut_after = size // 3
    res = _clover(hub, tmp_path / "c", "pull", f"{REPO}:Q4_K_M")
    assert res.returncode == 0, res.stderr
    path = Path(res.stdout.strip().removeprefix("done: "))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hub.state.repos[REPO]["Tiny-Q4_K_M.gguf"].sha256()
    ranged = [r for r in hub.state.requests if r.startswith("GET") and "resolve" in r]
    assert len(ranged) >= 2
    # header read (≤ the whole tiny file) + cut part + the rest: well under two full transfers of data
    assert hub.state.bytes_sent < 2.5 * size


def test_corrupted_blob_is_detected_and_removed(hub: HubServer, tmp_path: Path) -> None:
    hub.state.corrupt.add("Tiny-Q8_0.gguf")
    res = _clover(hub, tmp_path / "c", "pull", f"{REPO}:Q8_0", "--force")
    assert res.returncode == 1
    assert "is corrupt" in res.stderr and "Traceback" not in res.stderr
    assert not list((tmp_path / "c").rglob("Tiny-Q8_0.gguf"))


def test_offline_hit_and_miss(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    assert _clover(hub, cache, "pull", f"{REPO}:Q8_0").returncode == 0
    hit = _clover(hub, cache, "inspect", f"{REPO}:Q8_0", "--json", extra={"HF_HUB_OFFLINE": "1"})
    assert hit.returncode == 0, hit.stderr
    miss = _clover(hub, cache, "pull", f"{REPO}:Q4_K_M", "--offline")
    assert miss.returncode == 1
    assert "required file is not available in cache (offline mode)" in miss.stderr


def test_unreachable_hub_falls_back_to_the_cache(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    assert _clover(hub, cache, "pull", f"{REPO}:Q8_0").returncode == 0
    endpoint = hub.endpoint
    hub.stop()
    env = {"HF_ENDPOINT": endpoint}
    res = subprocess.run([sys.executable, "-m", "clover_cli", "pull", f"{REPO}:Q8_0"], capture_output=True, text=True,
                         env={**os.environ, "CLOVER_CACHE": str(cache), **env}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "using the cached copy" in res.stderr
    miss = subprocess.run([sys.executable, "-m", "clover_cli", "pull", f"{REPO}:Q4_K_M"], capture_output=True,
                          text=True, env={**os.environ, "CLOVER_CACHE": str(cache), **env}, timeout=120)
    assert miss.returncode == 1 and "cannot reach the Hub" in miss.stderr and "no cached copy" in miss.stderr
    hub.thread = type(hub.thread)(target=lambda: None)  # already stopped; the fixture's exit must not fail


def test_401_and_404_messages(hub: HubServer, tmp_path: Path) -> None:
    hub.state.status_override["acme/Gated-GGUF"] = 401
    gated = _clover(hub, tmp_path / "c", "pull", "acme/Gated-GGUF:Q8_0")
    assert gated.returncode == 1
    assert "access denied to acme/Gated-GGUF: set HF_TOKEN or accept the licence" in gated.stderr
    missing = _clover(hub, tmp_path / "c", "pull", "acme/Nope-GGUF:Q8_0")
    assert missing.returncode == 1 and "repository not found: acme/Nope-GGUF" in missing.stderr
    nofile = _clover(hub, tmp_path / "c", "pull", f"{REPO}:Q5_K_S")
    assert nofile.returncode == 1 and f"no Q5_K_S file in repository {REPO}; available: Q4_K_M, Q8_0" in nofile.stderr


def test_not_enough_disk(hub: HubServer, tmp_path: Path) -> None:
    res = _clover(hub, tmp_path / "c", "pull", "acme/Huge-GGUF:Q4_K_M", "--force")
    assert res.returncode == 1
    assert "not enough disk space" in res.stderr


def test_inspect_of_a_remote_id_reads_only_the_header(tmp_path: Path) -> None:
    big = tiny_model_path("F32", hidden=256, n_layer=4)
    with HubServer() as hub:
        hub.state.add("acme/Big-GGUF", "Big-F32.gguf", big)
        res = _clover(hub, tmp_path / "c", "inspect", "acme/Big-GGUF:F32", "--json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["summary"]["architecture"] == "clover-moe"
        assert hub.state.bytes_sent < big.stat().st_size
        assert "read the header remotely" in res.stderr
