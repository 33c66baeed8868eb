"""Which GGUF file a quant tag means, from a repository listing: llama.cpp's candidate rules, an exact
match on the quant part of the name, and a refusal to guess between several matching files."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import HubError

SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
DEFAULT_ORDER = ("Q4_K_M", "Q8_0")
_SKIP = ("mmproj", "imatrix", "mtp-")
_KNOWN_QUANT = re.compile(r"[-._]((?:UD-|I-)?(?:I?Q\d_[A-Z0-9_]+|Q\d_\d|TQ\d_\d|BF16|F16|F32|MXFP4(?:_MOE)?))$",
                          re.IGNORECASE)


class Ambiguous(HubError):
    """Several files match one tag: the user has to name one (`needs` "file")."""


def is_model_file(path: str) -> bool:
    """A model GGUF: not a projector, importance matrix or MTP head."""
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and not any(s in name for s in _SKIP)


def split_index(path: str) -> tuple[int, int] | None:
    """(shard number, shard count) for `…-0000N-of-0000M.gguf`, else None."""
    m = SPLIT_RE.match(path.rsplit("/", 1)[-1])
    return (int(m.group("no")), int(m.group("count"))) if m else None


def first_shards(paths: Sequence[str]) -> list[str]:
    """Model GGUFs, one entry per model (the first shard of a split set), in listing order."""
    return [p for p in paths if is_model_file(p) and (split_index(p) or (1, 1))[0] == 1]


def shards_of(path: str, paths: Sequence[str]) -> list[str]:
    """Every part of the split set `path` belongs to, in order (or just `path`)."""
    folder, _, name = path.rpartition("/")
    m = SPLIT_RE.match(name)
    if not m:
        return [path]
    count = int(m.group("count"))
    names = [f"{m.group('prefix')}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    full = [f"{folder}/{n}" if folder else n for n in names]
    listed = set(paths)
    missing = [f for f in full if f not in listed]
    if missing:
        raise HubError(f"split model {names[0]} is incomplete: missing {', '.join(missing)}")
    return full


def _stem(path: str) -> str:
    stem = path[: -len(".gguf")] if path.lower().endswith(".gguf") else path
    return re.sub(r"-\d{5}-of-\d{5}$", "", stem)


def quant_of(path: str) -> str | None:
    """The quant a file name carries (`…-Q4_K_M.gguf`, `…-UD-Q4_K_XL-00001-of-00002.gguf`, `Q8_0/…`)."""
    stem = _stem(path)
    m = _KNOWN_QUANT.search(stem.rsplit("/", 1)[-1])
    if m:
        return m.group(1).upper()
    folder = stem.rsplit("/", 1)[0] if "/" in stem else ""
    return folder.rsplit("/", 1)[-1].upper() if folder else None


def matches(path: str, tag: str) -> bool:
    """The tag is a whole part of the name (between '-', '.', '/' or the ends), case-insensitively:
    `Q4_K_M` matches `m-Q4_K_M.gguf`, `m-UD-Q4_K_M.gguf` and `Q4_K_M/m-00001-of-00002.gguf`, never
    `m-Q4_K_M_L.gguf`, and `Q4_K` does not match `m-Q4_K_M.gguf`."""
    return re.search(rf"(^|[-./]){re.escape(tag)}($|[-./])", _stem(path), re.IGNORECASE) is not None


def _available(models: Sequence[str]) -> tuple[str, str]:
    quants = sorted({q for q in (quant_of(p) for p in models) if q})
    return ", ".join(quants) or "none recognised", ", ".join(models)


def choose(paths: Sequence[str], repo: str, quant: str | None, file: str | None) -> tuple[str, str]:
    """(first shard path, a note saying why it was chosen) for a tag, an exact file or no choice."""
    models = first_shards(paths)
    if not models and not file:
        raise HubError(f"no GGUF files found in repository {repo}")
    quants, files = _available(models)
    if file:
        want = file.strip("/").lower()
        hits = [p for p in paths if p.lower() == want] or \
               [p for p in paths if p.rsplit("/", 1)[-1].lower() == want.rsplit("/", 1)[-1]]
        if not hits:
            raise HubError(f"file '{file}' not found in repository {repo}", hint=f"GGUF files there: {files}")
        if len(hits) > 1:
            raise HubError(f"several files are named {file} in {repo}: {', '.join(hits)}",
                           needs="file_path")
        hit = hits[0]
        m = SPLIT_RE.match(hit.rsplit("/", 1)[-1])
        if m and int(m.group("no")) != 1:
            folder, _, _ = hit.rpartition("/")
            first = f"{m.group('prefix')}-{1:05d}-of-{m.group('count')}.gguf"
            hit = f"{folder}/{first}" if folder else first
        return hit, f"file {hit}"
    for tag in [quant.upper()] if quant else list(DEFAULT_ORDER):
        hits = [p for p in models if matches(p, tag)]
        if len(hits) > 1:
            raise Ambiguous(f"{len(hits)} files match {tag} in {repo}: {', '.join(hits)}",
                           needs="file")
        if hits:
            return hits[0], (f"{tag}: {hits[0]}" if quant else f"no quant given, chose {tag}: {hits[0]}")
    if quant:
        raise HubError(f"no {quant.upper()} file in repository {repo}; available quants: {quants}",
                       hint=f"files: {files}", needs="quant_or_file")
    return models[0], f"no quant given and no {' or '.join(DEFAULT_ORDER)} file, chose {models[0]}"
