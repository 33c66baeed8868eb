"""The model cache: the standard Hugging Face layout (`models--owner--repo/{blobs,snapshots/<commit>,
refs/main}`), shared with llama.cpp and huggingface_hub. Finding a model there (also offline), listing
what is cached (`clover list`) and removing it (`clover rm`).

Snapshot entries are symlinks into `blobs/` where the file system allows them; without symlinks
(Windows without Developer Mode) they are hard links or plain copies, and everything here works
the same because files are compared by identity (device, inode), never by link target.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import HubError
from ..paths import hf_cache_dir
from . import select
from .refs import ModelRef, parse_model_ref
from .safe_names import COMMIT_RE as _COMMIT_RE
from .safe_names import is_relative_path


def cache_root() -> Path:
    """CLOVER_CACHE, HF_HUB_CACHE, HF_HOME/hub, then the Hugging Face default (see clover_runtime.paths)."""
    return hf_cache_dir()


def repo_dir(repo: str) -> Path:
    return cache_root() / f"models--{repo.replace('/', '--')}"


def repo_of(folder: Path) -> str:
    return folder.name[len("models--"):].replace("--", "/", 1)


def snapshots(repo: str, revision: str | None = None) -> list[Path]:
    """Snapshot folders of `repo`, the one `refs/<revision>` (or the commit `revision`) names first."""
    root = repo_dir(repo) / "snapshots"
    if not root.is_dir():
        return []
    rev = revision or "main"
    if _COMMIT_RE.match(rev):
        return [root / rev] if (root / rev).is_dir() else []
    ref_file = repo_dir(repo) / "refs" / rev
    preferred = ref_file.read_text(encoding="utf-8").strip() if ref_file.is_file() else None
    if preferred is not None and not _COMMIT_RE.match(preferred):
        preferred = None  # a ref that names no commit (hand-edited, or left by an older tool) points nowhere
    others = sorted((p for p in root.iterdir() if p.is_dir() and p.name != preferred),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    return ([root / preferred] if preferred and (root / preferred).is_dir() else []) + others


def snapshot_files(snap: Path) -> list[str]:
    """Relative paths of the complete files in a snapshot (a dangling link does not count)."""
    return sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())


def find_cached(ref: ModelRef) -> Path | None:
    """The first shard of `ref` in the cache when every shard is there, else None.

    The snapshot `refs/main` points at is searched first, then older ones, so a model pulled before
    the repository moved on is still found offline.
    """
    for snap in snapshots(ref.repo, ref.revision):
        listing = snapshot_files(snap)
        try:
            first, _ = select.choose(listing, ref.repo, ref.quant, ref.file)
            shards = select.shards_of(first, listing)
        except select.Ambiguous:
            raise
        except HubError:  # not (completely) in this snapshot
            continue
        if all((snap / s).is_file() for s in shards):
            return snap / shards[0]
    return None


def partial_path(repo: str, etag: str) -> Path:
    """Where an interrupted download of blob `etag` waits to be resumed."""
    return repo_dir(repo) / "blobs" / f"{etag}.incomplete"


@dataclass(frozen=True)
class CachedModel:
    """One cached model: a single GGUF or a complete split set inside one snapshot."""

    repo: str
    relpath: str  # first shard, relative to the snapshot
    quant: str | None
    path: Path  # first shard
    files: tuple[Path, ...]
    size: int
    commit: str

    @property
    def name(self) -> str:
        return f"{self.repo}:{self.quant}" if self.quant else f"{self.repo}/{self.relpath}"


def list_cached() -> list[CachedModel]:
    """Every complete GGUF model in the cache; a file present in several snapshots is listed once."""
    root = cache_root()
    out: list[CachedModel] = []
    for folder in sorted(root.glob("models--*")) if root.is_dir() else []:
        repo = repo_of(folder)
        seen: set[str] = set()
        for snap in snapshots(repo):
            listing = snapshot_files(snap)
            for first in select.first_shards(listing):
                try:
                    shards = select.shards_of(first, listing)
                except HubError:  # an incomplete split set is not a model yet
                    continue
                if first in seen:
                    continue
                seen.add(first)
                files = tuple(snap / s for s in shards)
                out.append(CachedModel(repo, first, select.quant_of(first), files[0], files,
                                       sum(f.stat().st_size for f in files), snap.name))
    return out


def matching(text: str) -> list[CachedModel]:
    """Cached models named by `repo`, `repo:QUANT` (as `clover list` prints them) or `repo/<file>`."""
    parts = text.strip().split("/", 2)
    if len(parts) == 3 and ":" not in parts[0] and not parts[0].lower().startswith(("hf.co", "huggingface.co")):
        ref = ModelRef(parse_model_ref(f"{parts[0]}/{parts[1]}").repo, None, parts[2])
    else:
        ref = parse_model_ref(text)
    found = []
    for m in list_cached():
        if m.repo.lower() != ref.repo.lower():
            continue
        if ref.file and ref.file.lower() not in (m.relpath.lower(), m.path.name.lower()):
            continue
        if ref.quant and (m.quant or "") != ref.quant:
            continue
        found.append(m)
    return found


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def remove(models: list[CachedModel]) -> int:
    """Delete the models' snapshot entries in every snapshot, then the blobs they used that no other
    snapshot entry uses; returns the bytes freed. Partial downloads of other files are left alone."""
    freed = 0
    touched: dict[Path, set[tuple[int, int]]] = {}
    for m in models:
        folder = repo_dir(m.repo)
        ids = touched.setdefault(folder, set())
        rels = [f.relative_to(_snapshot_of(f)).as_posix() for f in m.files]
        for snap in (folder / "snapshots").glob("*"):
            for rel in rels:
                entry = snap / rel
                if not (entry.is_symlink() or entry.exists()):
                    continue
                ident = _identity(entry)
                if ident is not None:
                    ids.add(ident)
                freed += _unlink(entry)
    for folder, ids in touched.items():
        used = {_identity(p) for p in (folder / "snapshots").rglob("*") if p.is_file()}
        blobs = folder / "blobs"
        for blob in blobs.iterdir() if blobs.is_dir() else []:
            ident = _identity(blob)
            if ident in ids and ident not in used:
                freed += _unlink(blob)
        _prune(folder)
    return freed


def _snapshot_of(path: Path) -> Path:
    for parent in path.parents:
        if parent.parent.name == "snapshots":
            return parent
    raise ValueError(f"{path} is not inside a snapshot")


def _unlink(path: Path) -> int:
    """Remove one directory entry; the bytes it frees (0 for links and for data still linked elsewhere)."""
    freed = 0
    if not path.is_symlink():
        st = path.stat()
        freed = st.st_size if st.st_nlink <= 1 else 0
    path.unlink()
    return freed


def _prune(folder: Path) -> None:
    """Remove empty snapshot folders, and the whole repository folder once no file is left in it."""
    snaps = folder / "snapshots"
    for d in sorted((p for p in snaps.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    blobs = folder / "blobs"
    left = any(snaps.iterdir()) if snaps.is_dir() else False
    left = left or (blobs.is_dir() and any(blobs.iterdir()))
    if not left:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(cache_root() / ".locks" / folder.name, ignore_errors=True)


def write_ref(repo: str, revision: str, commit: str) -> None:
    """Record which commit a branch name pointed at, as huggingface_hub does (not for commit ids)."""
    if _COMMIT_RE.match(revision) or not _COMMIT_RE.match(commit) or not is_relative_path(revision):
        return
    ref_file = repo_dir(repo) / "refs" / revision
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    if not ref_file.is_file() or ref_file.read_text(encoding="utf-8").strip() != commit:
        tmp = ref_file.with_name(f"{ref_file.name}.{os.getpid()}.tmp")
        tmp.write_text(commit, encoding="utf-8")
        os.replace(tmp, ref_file)
