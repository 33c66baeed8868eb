"""`clover rm repo[:QUANT]`: delete cached models and the blobs nothing else uses."""

from __future__ import annotations

import typer

from . import console


def command(
    model: str = typer.Argument(..., help="owner/repo or owner/repo:QUANT as `clover list` shows it."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
) -> None:
    """Remove a cached model (every quant of the repo when no quant is given).

    Example:

        clover rm Diffuspace/Clover-35B-A3B-Preview-GGUF:Q8_0 -y
    """
    from runtime.errors import CloverError
    from runtime.hub import matching, remove

    found = matching(model)
    if not found:
        raise CloverError(f"no cached model matches {model}", "see what is cached with: clover list")
    for m in found:
        console.info(f"  {m.name}  {m.size / 2**30:.2f} GiB  {m.path}")
    if not yes and not typer.confirm(f"delete {len(found)} model(s)?", default=False, err=True):
        raise typer.Exit(1)
    freed = remove(found)
    console.out().print(f"deleted {len(found)} model(s), freed {freed / 2**30:.2f} GiB", markup=False)
