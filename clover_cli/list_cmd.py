"""`clover list`: the GGUF models in the local cache."""

from __future__ import annotations

import json

import typer


def command(as_json: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """List cached GGUF models: repo:QUANT, size and path (split models once, with all their shards).

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
    if not models:
        out.print(f"no models in {cache_root()} (get one with: clover pull)", markup=False, highlight=False)
        return
    print_table(out, [("NAME", "left"), ("SIZE", "right"), ("PATH", "left")],
                [(m.name, human_bytes(m.size), str(m.path)) for m in models], plain=True)
