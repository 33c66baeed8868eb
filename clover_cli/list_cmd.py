"""`clover list`: the GGUF models in the local cache."""

from __future__ import annotations

import json

import typer


def command(as_json: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """List cached GGUF models: repo:QUANT, size and path (split models once, with all their shards),
    then demo, the model that ships with clover (--json lists the cache only).

    Example:

        clover list --json
    """
    from clover_runtime.hub import cache_root, list_cached

    from . import console
    from .fit_table import human_bytes, print_table

    models = list_cached()
    if as_json:
        typer.echo(json.dumps([{"name": m.name, "repo": m.repo, "quant": m.quant, "file": m.relpath,
                                "size": m.size, "path": str(m.path), "commit": m.commit,
                                "files": [str(f) for f in m.files]} for m in models], ensure_ascii=False, indent=2))
        return
    out = console.out()
    rows = [(m.name, human_bytes(m.size), str(m.path)) for m in models]
    if not models:
        out.print(f"no models in {cache_root()} (get one with: clover pull)", markup=False, highlight=False)
    demo = _demo_row()
    if demo is not None:
        rows.append(demo)
    if rows:
        print_table(out, [("NAME", "left"), ("SIZE", "right"), ("PATH", "left")], rows, plain=True)


def _demo_row() -> tuple[str, str, str] | None:
    """The model that ships with clover, listed after the cache (None when an install lost it)."""
    from clover_runtime.demo import DEMO_NAME, demo_path
    from clover_runtime.errors import ModelFileError

    from .fit_table import human_bytes

    try:
        path = demo_path()
    except ModelFileError:
        return None
    return f"{DEMO_NAME} (built in)", human_bytes(path.stat().st_size), str(path)
