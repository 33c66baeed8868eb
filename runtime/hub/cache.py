"""The local model cache: what is there (`clover list`) and removing it (`clover rm`)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import HubError
from ..paths import hf_cache_dir
from . import select


@dataclass(frozen=True)
class CachedModel:
    repo: str
    quant: str | None
    path: Path  # first shard in the snapshot
    files: tuple[Path, ...]
    size: int

    @property
    def name(self) -> str:
        return f"{self.repo}:{self.quant}" if self.quant else f"{self.repo} ({self.path.name})"


def list_cached() -> list[CachedModel]:
    out = []
    root = hf_cache_dir()
    for repo_dir in sorted(root.glob("models--*")) if root.is_dir() else []:
        repo = repo_dir.name[len("models--"):].replace("--", "/", 1)
        for snap in sorted((repo_dir / "snapshots").glob("*")):
            rel = sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*.gguf") if p.exists())
            for first in select.first_shards(rel):
                try:
                    shards = select.shards_of(first, rel)
                except HubError:
                    shards = [first]
                files = tuple(snap / s for s in shards)
                size = sum(f.stat().st_size for f in files if f.exists())
                out.append(CachedModel(repo, select.quant_of(first), snap / first, files, size))
    return out


def matching(spec: str) -> list[CachedModel]:
    repo, _, quant = spec.partition(":")
    return [m for m in list_cached() if m.repo.lower() == repo.lower()
            and (not quant or (m.quant or "").upper() == quant.upper())]


def remove(models: list[CachedModel]) -> int:
    """Delete the models' snapshot entries, then blobs no snapshot uses any more; bytes freed."""
    freed = 0
    repos: set[Path] = set()
    for m in models:
        for f in m.files:
            repos.add(_repo_dir(f))
            if f.is_symlink() or f.exists():
                if not f.is_symlink():
                    freed += f.stat().st_size
                f.unlink()
    for repo_dir in repos:
        used = {p.resolve() for p in (repo_dir / "snapshots").rglob("*") if p.is_symlink() or p.is_file()}
        for blob in (repo_dir / "blobs").glob("*") if (repo_dir / "blobs").is_dir() else []:
            if blob.resolve() not in used:
                freed += blob.stat().st_size
                blob.unlink()
        for snap in (repo_dir / "snapshots").glob("*"):
            if not any(snap.rglob("*")):
                shutil.rmtree(snap, ignore_errors=True)
        if not any((repo_dir / "snapshots").glob("*")):
            shutil.rmtree(repo_dir, ignore_errors=True)
    return freed


def _repo_dir(path: Path) -> Path:
    for parent in path.parents:
        if parent.name.startswith("models--"):
            return parent
    raise HubError(f"{path} is not inside the model cache")
