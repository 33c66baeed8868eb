"""Choosing the GGUF file a quant tag means, from a repository listing (llama.cpp's rules, plus
refusing to guess between several matching files)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import HubError

SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_SKIP = ("mmproj", "imatrix", "mtp-")
DEFAULT_ORDER = ("Q4_K_M", "Q8_0")


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and not any(s in name for s in _SKIP)


def first_shards(paths: Sequence[str]) -> list[str]:
    """Model GGUFs, one entry per model (the first shard of a split set)."""
    out = []
    for p in paths:
        if not is_model_file(p):
            continue
        m = SPLIT_RE.match(p.rsplit("/", 1)[-1])
        if m and int(m.group("no")) != 1:
            continue
        out.append(p)
    return out


def shards_of(path: str, paths: Sequence[str]) -> list[str]:
    """Every part of the split set `path` belongs to (or just `path`)."""
    folder, _, name = path.rpartition("/")
    m = SPLIT_RE.match(name)
    if not m:
        return [path]
    count = int(m.group("count"))
    want = [f"{m.group('prefix')}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    full = [f"{folder}/{w}" if folder else w for w in want]
    missing = [f for f in full if f not in set(paths)]
    if missing:
        raise HubError(f"split model {name} is incomplete on the Hub: missing {', '.join(missing)}")
    return full


def quant_of(path: str) -> str | None:
    """The quant tag a file name carries (`…-Q4_K_M.gguf`, `…Q8_0-00001-of-00003.gguf`, `Q4_K_M/…`)."""
    stem = path[: -len(".gguf")] if path.lower().endswith(".gguf") else path
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", stem)
    m = re.search(r"[-._/]((?:UD-)?(?:I?Q\d_[A-Z0-9_]+|Q\d_\d|BF16|F16|F32|MXFP4))$", stem, re.IGNORECASE)
    if m:
        return m.group(1).upper()
    folder = path.rsplit("/", 1)[0] if "/" in path else ""
    return folder.rsplit("/", 1)[-1].upper() if folder else None


def _matches(path: str, tag: str) -> bool:
    return re.search(rf"(^|[-._/]){re.escape(tag)}([-._/]|$)", path[: -len(".gguf")], re.IGNORECASE) is not None


def choose(paths: Sequence[str], repo: str, quant: str | None, file: str | None) -> tuple[str, str]:
    """(first shard path, note saying why) for a tag or exact file; HubError listing what exists."""
    models = first_shards(paths)
    if not models:
        raise HubError(f"no GGUF files found in repository {repo}")
    listing = "; available: " + ", ".join(sorted({quant_of(p) or p for p in models})) + \
        " (files: " + ", ".join(models) + ")"
    if file:
        hits = [p for p in paths if p.lower() == file.lower() or p.rsplit("/", 1)[-1].lower() == file.lower()]
        if not hits:
            raise HubError(f"file '{file}' not found in repository {repo}" + listing)
        return hits[0], f"file {hits[0]}"
    tags = [quant] if quant else list(DEFAULT_ORDER)
    for tag in tags:
        hits = [p for p in models if _matches(p, tag)]
        exact = [p for p in hits if (quant_of(p) or "").upper() == tag.upper()]
        if len(hits) > 1 and len(exact) == 1:
            hits = exact
        if len(hits) > 1:
            raise HubError(f"several files match {tag} in {repo}: {', '.join(hits)}",
                           hint="choose one with --file NAME")
        if hits:
            why = f"quant {tag}" if quant else f"no quant given: chose {tag}"
            return hits[0], why
    if quant:
        raise HubError(f"no {quant} file in repository {repo}" + listing)
    return models[0], f"no quant given and no {' or '.join(DEFAULT_ORDER)} file: chose {models[0]}"
