"""`clover list`: the GGUF models in the local cache."""

from __future__ import annotations

import json

import typer

from . import console


def command(as_json: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """List cached GGUF models as repo:QUANT with size and path.

    Example:

        clover list --json
    """
    from runtime.hub import list_cached
    from runtime.paths import hf_cache_dir

    models = list_cached()
    if as_json:
        typer.echo(json.dumps([{"name": m.name, "repo": m.repo, "quant": m.quant, "size": m.size,
                                "path": str(m.path), "files": [str(f) for f in m.files]} for m in models], indent=2))
        return
    out = console.out()
    if not models:
        out.print(f"no models in {hf_cache_dir()} (get one with: clover pull)", markup=False)
        return
    width = max(len(m.name) for m in models)
    for m in models:
        out.print(f"{m.name:<{width}}  {m.size / 2**30:8.2f} GiB  {m.path}", markup=False, highlight=False)
