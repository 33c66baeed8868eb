"""`clover pull` and remote `inspect` against a Hub-compatible server on loopback: the real
huggingface_hub HTTP stack and the real `clover` command, with the server counting every byte."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clover_runtime.hub.download import CHUNK
from hub_helpers import ROOT, blobs, clover_env, error_line, pulled_path, run_clover, sha256, split_model
from hub_server import HubServer
from synth_models import tiny_model_path

TINY, BIG, SPLIT, AMBIG = "acme/Tiny-GGUF", "acme/Big-GGUF", "acme/Split-GGUF", "acme/Unsloth-GGUF"


@pytest.fixture()
def hub(tmp_path: Path):
    q8, q4 = tiny_model_path("Q8_0"), tiny_model_path("Q4_K_M")
    with HubServer() as server:
        st = server.state
        st.add(TINY, "Tiny-Q8_0.gguf", q8)
        st.add(TINY, "Tiny-Q4_K_M.gguf", q4)
        st.add(TINY, "mmproj-Tiny-F16.gguf", q8)
        st.add(BIG, "Big-F32.gguf", tiny_model_path("F32", hidden=256, n_layer=4))
        for shard in split_model(tmp_path / "split"):
            st.add(SPLIT, f"F32/{shard.name}", shard)
        st.add(AMBIG, "Unsloth-Q4_K_M.gguf", q4)
        st.add(AMBIG, "Unsloth-UD-Q4_K_M.gguf", q8)
        yield server


def downloads(hub: HubServer, repo: str, path: str) -> list:
    """The GETs that downloaded the file (header reads ask for a closed range and are left out)."""
    sha = hub.state.repos[repo][path].sha256
    return [t for t in hub.state.file_transfers(sha) if t.range is None or t.range.endswith("-")]


def test_pull_verifies_and_places_the_file_in_the_hf_cache(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "cache dïr"
    res = run_clover(hub, cache, "pull", f"{TINY}:q8_0")
    path = pulled_path(res)
    hosted = hub.state.repos[TINY]["Tiny-Q8_0.gguf"]
    assert sha256(path) == hosted.sha256
    commit = hub.state.commits[TINY]
    assert path == cache / "models--acme--Tiny-GGUF" / "snapshots" / commit / "Tiny-Q8_0.gguf"
    assert path.resolve() == (cache / "models--acme--Tiny-GGUF" / "blobs" / hosted.sha256).resolve()
    assert (cache / "models--acme--Tiny-GGUF" / "refs" / "main").read_text(encoding="utf-8") == commit
    assert "memory fit at -c 4096" in res.stderr
    assert "Tiny-Q8_0.gguf: 100%" in res.stderr
    again = run_clover(hub, cache, "pull", f"hf.co/{TINY}:Q8_0")
    assert pulled_path(again) == path
    assert len(downloads(hub, TINY, "Tiny-Q8_0.gguf")) == 1


def test_progress_lines_when_stderr_is_not_a_terminal(hub: HubServer, tmp_path: Path) -> None:
    res = run_clover(hub, tmp_path / "c", "pull", f"{BIG}:F32")
    pulled_path(res)
    steps = [int(m) for m in re.findall(r"^Big-F32\.gguf: (\d+)% \(", res.stderr, re.MULTILINE)]
    assert steps == sorted(set(steps)) and steps[-1] == 100 and 3 <= len(steps) <= 10
    assert re.search(r"Big-F32\.gguf: \d+% \([\d.]+ MB of 6\.4 MB, [\d.]+ [kMG]?B/s, ETA \d:\d\d:\d\d\)", res.stderr)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_progress_bar_on_a_terminal(hub: HubServer, tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    env = clover_env(hub.endpoint, tmp_path / "c", {"COLUMNS": "120", "TERM": "xterm"})
    env.pop("NO_COLOR")
    child = pexpect.spawn(sys.executable, ["-m", "clover_cli", "pull", f"{BIG}:F32"], env=env, cwd=str(ROOT),
                          encoding="utf-8", timeout=60, dimensions=(30, 120))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert "Big-F32.gguf" in child.before and "━" in child.before
    assert "6.4/6.4 MB" in child.before and "100%" in child.before


def test_a_cut_connection_is_resumed_with_a_range_request(hub: HubServer, tmp_path: Path) -> None:
    hosted = hub.state.repos[BIG]["Big-F32.gguf"]
    hub.state.cut_after = hosted.size // 3
    res = run_clover(hub, tmp_path / "c", "pull", f"{BIG}:F32")
    assert sha256(pulled_path(res)) == hosted.sha256
    kept = hosted.size // 3 // CHUNK * CHUNK  # whole chunks reached the disk before the cut
    got = downloads(hub, BIG, "Big-F32.gguf")
    assert [t.range for t in got] == [None, f"bytes={kept}-"]
    assert [t.status for t in got] == [200, 206]
    assert got[0].sent == hosted.size // 3 and got[1].sent == hosted.size - kept
    assert "retrying in 2 s" in res.stderr


def test_a_killed_pull_resumes_from_the_bytes_on_disk(hub: HubServer, tmp_path: Path) -> None:
    hosted = hub.state.repos[BIG]["Big-F32.gguf"]
    cache = tmp_path / "c"
    hub.state.stall_after = hosted.size // 2
    proc = subprocess.Popen([sys.executable, "-m", "clover_cli", "pull", f"{BIG}:F32"], cwd=ROOT,
                            env=clover_env(hub.endpoint, cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert hub.state.stalled.wait(60)
        expect = hosted.size // 2 // CHUNK * CHUNK
        part = cache / "models--acme--Big-GGUF" / "blobs" / f"{hosted.sha256}.incomplete"
        for _ in range(200):
            if part.is_file() and part.stat().st_size == expect:
                break
            hub.state.release.wait(0.05)
        assert part.stat().st_size == expect
    finally:
        proc.kill()
        proc.communicate()
        hub.state.release.set()
    assert not (cache / "models--acme--Big-GGUF" / "blobs" / hosted.sha256).exists()
    assert json.loads(run_clover(hub, cache, "list", "--json").stdout) == []
    res = run_clover(hub, cache, "pull", f"{BIG}:F32")
    assert sha256(pulled_path(res)) == hosted.sha256
    got = downloads(hub, BIG, "Big-F32.gguf")
    assert [t.range for t in got] == [None, f"bytes={expect}-"]
    assert got[0].sent == hosted.size // 2 and got[1].sent == hosted.size - expect
    assert sum(t.sent for t in got) < hosted.size + CHUNK  # no second full transfer
    assert "resuming after 3.1 MB already downloaded" in res.stderr
    assert not part.exists()


def test_a_corrupted_download_is_detected_and_removed(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    hub.state.corrupt.add("Tiny-Q8_0.gguf")
    res = run_clover(hub, cache, "pull", f"{TINY}:Q8_0")
    line = error_line(res)
    assert re.fullmatch(r"downloaded file Tiny-Q8_0\.gguf is corrupt \(sha256 [0-9a-f]{16}… instead of the Hub's "
                        r"[0-9a-f]{16}…\); it was removed, run the command again", line), line
    assert blobs(cache) == [] and not list(cache.rglob("*.gguf"))
    hub.state.corrupt.clear()
    assert sha256(pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0"))) == \
        hub.state.repos[TINY]["Tiny-Q8_0.gguf"].sha256


def test_split_model_fetches_every_shard_and_returns_the_first(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    hub.state.page_size = 2  # the listing comes in pages
    path = pulled_path(run_clover(hub, cache, "pull", f"{SPLIT}:f32"))
    assert path.name == "Split-F32-00001-of-00003.gguf"
    for i in (1, 2, 3):
        name = f"F32/Split-F32-{i:05d}-of-00003.gguf"
        assert sha256(path.parent / Path(name).name) == hub.state.repos[SPLIT][name].sha256
    doc = json.loads(run_clover(hub, cache, "inspect", f"{SPLIT}:F32", "--json", extra={"HF_HUB_OFFLINE": "1"}).stdout)
    assert len(doc["summary"]["shards"]) == 3


def test_file_choice_messages(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    assert error_line(run_clover(hub, cache, "pull", f"{AMBIG}:Q4_K_M")) == \
        f"2 files match Q4_K_M in {AMBIG}: Unsloth-Q4_K_M.gguf, Unsloth-UD-Q4_K_M.gguf"
    chosen = pulled_path(run_clover(hub, cache, "pull", AMBIG, "--file", "Unsloth-UD-Q4_K_M.gguf"))
    assert chosen.name == "Unsloth-UD-Q4_K_M.gguf"
    miss = run_clover(hub, cache, "pull", f"{TINY}:Q5_K_S")
    assert error_line(miss) == f"no Q5_K_S file in repository {TINY}; available quants: Q4_K_M, Q8_0"
    assert "hint: files: Tiny-Q4_K_M.gguf, Tiny-Q8_0.gguf (pick one with :QUANT or --file NAME)" in miss.stderr
    default = run_clover(hub, cache, "pull", TINY)
    assert pulled_path(default).name == "Tiny-Q4_K_M.gguf"
    assert "no quant given, chose Q4_K_M: Tiny-Q4_K_M.gguf" in default.stderr
    assert error_line(run_clover(hub, cache, "pull", "acme/Tiny-GGUF/Q8_0")) == \
        "invalid model reference 'acme/Tiny-GGUF/Q8_0', expected <user>/<model>[:quant]"
    assert error_line(run_clover(hub, cache, "pull", "./missing.gguf")) == "model file not found: ./missing.gguf"


def test_access_denied_not_found_and_tokens(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    hub.state.deny["acme/Private-GGUF"] = (401, "RepoNotFound")
    hub.state.add("acme/Gated-GGUF", "Gated-Q8_0.gguf", tiny_model_path("Q8_0"))
    hub.state.gated["acme/Gated-GGUF"] = "hf_secret"
    denied = "access denied to {r}: set HF_TOKEN or accept the licence at " + hub.endpoint + "/{r}"
    assert error_line(run_clover(hub, cache, "pull", "acme/Private-GGUF:Q8_0")) == \
        denied.format(r="acme/Private-GGUF")
    assert error_line(run_clover(hub, cache, "pull", "acme/Gated-GGUF:Q8_0")) == denied.format(r="acme/Gated-GGUF")
    assert error_line(run_clover(hub, cache, "pull", "acme/Gated-GGUF:Q8_0", "--hf-token", "hf_wrong")) == \
        denied.format(r="acme/Gated-GGUF")
    assert error_line(run_clover(hub, cache, "pull", "acme/Nope-GGUF:Q8_0")) == "repository not found: acme/Nope-GGUF"
    pulled_path(run_clover(hub, cache, "pull", "acme/Gated-GGUF:Q8_0", "--hf-token", "hf_secret"))
    pulled_path(run_clover(hub, tmp_path / "c2", "pull", "acme/Gated-GGUF:Q8_0", extra={"HF_TOKEN": "hf_secret"}))
    sha = hub.state.repos["acme/Gated-GGUF"]["Gated-Q8_0.gguf"].sha256
    cdn = hub.state.file_transfers(sha)
    assert cdn and not any(t.auth for t in cdn)  # the token never leaves the Hub for the CDN
    assert all(t.auth for t in hub.state.transfers if "Gated" in t.path and t.status == 302)


def test_not_enough_disk_is_refused_before_downloading(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    hub.state.add("acme/Huge-GGUF", "Huge-Q8_0.gguf", tiny_model_path("Q8_0"), declared_size=10 * 2**40)
    line = error_line(run_clover(hub, cache, "pull", "acme/Huge-GGUF:Q8_0"))
    assert re.fullmatch(rf"not enough disk space in {re.escape(str(cache))}: the download needs 11\.0 TB, "
                        r"[\d.]+ [kMGT]?B is free", line), line
    assert blobs(cache) == []
    sha = hub.state.repos["acme/Huge-GGUF"]["Huge-Q8_0.gguf"].sha256
    assert all(t.range and not t.range.endswith("-") for t in hub.state.file_transfers(sha))  # header reads only


def test_a_model_that_cannot_fit_is_refused_unless_forced(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    hub.state.add("acme/Long-GGUF", "Long-Q8_0.gguf", tiny_model_path("Q8_0", context_length=2**32 - 1))
    res = run_clover(hub, cache, "pull", "acme/Long-GGUF:Q8_0", "-c", "4294967295")
    assert error_line(res) == "acme/Long-GGUF:Q8_0 does not fit this machine at -c 4294967295"
    assert "does not fit" in res.stderr and blobs(cache) == []
    assert downloads(hub, "acme/Long-GGUF", "Long-Q8_0.gguf") == []
    forced = run_clover(hub, cache, "pull", "acme/Long-GGUF:Q8_0", "-c", "4294967295", "--force")
    assert "downloading anyway (--force)" in forced.stderr
    pulled_path(forced)


def test_inspect_of_a_hub_id_reads_only_the_header(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    res = run_clover(hub, cache, "inspect", f"{BIG}:F32", "--json")
    assert res.returncode == 0, res.stderr
    hosted = hub.state.repos[BIG]["Big-F32.gguf"]
    local = json.loads(run_clover(hub, cache, "inspect", str(hosted.data_path), "--json").stdout)
    remote = json.loads(res.stdout)
    assert remote["summary"]["architecture"] == "clover-moe"
    assert remote["tensors"] == local["tensors"] and remote["metadata"] == local["metadata"]
    sent = sum(t.sent for t in hub.state.file_transfers(hosted.sha256))
    assert 0 < sent < hosted.size / 4
    assert f"read the header of {BIG}:F32 from {hub.endpoint}: {sent:,} of {hosted.size:,} bytes" in res.stderr
    assert blobs(cache) == []
    split = run_clover(hub, cache, "inspect", f"{SPLIT}:F32", "--json")
    assert split.returncode == 0, split.stderr
    assert json.loads(split.stdout)["summary"]["shards"] == [f"Split-F32-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]


def test_offline_hits_and_misses(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    path = pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0"))
    before = len(hub.state.transfers)
    hit = run_clover(hub, cache, "inspect", f"{TINY}:Q8_0", "--json", extra={"HF_HUB_OFFLINE": "1"})
    assert hit.returncode == 0, hit.stderr
    assert pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0", "--offline")) == path
    assert len(hub.state.transfers) == before  # nothing asked of the network
    assert error_line(run_clover(hub, cache, "pull", f"{TINY}:Q4_K_M", "--offline")) == \
        f"required file is not available in cache (offline mode): {TINY}:Q4_K_M"
    assert error_line(run_clover(hub, cache, "pull", TINY, "--file", "Tiny-Q4_K_M.gguf",
                                 extra={"CLOVER_OFFLINE": "1"})) == \
        f"required file is not available in cache (offline mode): {TINY}/Tiny-Q4_K_M.gguf"
    assert error_line(run_clover(hub, cache, "inspect", f"{BIG}:F32", extra={"HF_HUB_OFFLINE": "1"})) == \
        f"required file is not available in cache (offline mode): {BIG}:F32"


def test_an_unreachable_hub_uses_the_cache_or_says_there_is_none(hub: HubServer, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    path = pulled_path(run_clover(hub, cache, "pull", f"{TINY}:Q8_0"))
    hub.stop()
    res = run_clover(hub, cache, "pull", f"{TINY}:Q8_0", timeout=20)
    assert pulled_path(res) == path
    assert f"warning: cannot reach the Hub at {hub.endpoint} (" in res.stderr and "using the cached copy" in res.stderr
    line = error_line(run_clover(hub, cache, "pull", f"{TINY}:Q4_K_M", timeout=20))
    assert re.fullmatch(rf"cannot reach the Hub at {re.escape(hub.endpoint)} \(.+\); no cached copy of "
                        rf"{TINY}:Q4_K_M exists", line), line
