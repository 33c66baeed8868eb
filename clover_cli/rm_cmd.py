"""`clover rm repo[:QUANT]`: delete cached models and the blobs nothing else uses."""

from __future__ import annotations

import sys

import typer

from .completion import complete_model

IN_USE_HINT = "a running clover serve or another program has it open: stop it (clover ps, clover stop) and try again"


def _refuse_locked(found: list) -> None:
    """Refuse, before deleting anything, when a file of the models cannot be deleted now (Windows:
    a running server maps it), so a model is never left half-deleted."""
    from clover_runtime.errors import CloverError
    from clover_runtime.in_use import locked_files

    files = [p for m in found for f in m.files for p in (f, f.resolve())]
    locked = locked_files(files)
    if locked:
        more = f" (and {len(locked) - 1} more)" if len(locked) > 1 else ""
        raise CloverError(f"cannot delete {locked[0]}{more}: it is in use; nothing was deleted", IN_USE_HINT)


def command(
    model: str = typer.Argument(..., metavar="MODEL", autocompletion=complete_model,
                                help="owner/repo[:QUANT] as `clover list` shows it (every quant when none)."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
) -> None:
    """Remove cached models, then the downloaded blobs no other snapshot uses.

    Example:

        clover rm Diffuspace/Clover-35B-A3B-Preview-GGUF:Q8_0 -y
    """
    from clover_runtime.demo import is_demo
    from clover_runtime.errors import CloverError
    from clover_runtime.hub import matching, remove

    from . import console
    from .fit_table import human_bytes

    if is_demo(model):
        raise CloverError("demo is built in (it ships with clover) and cannot be removed",
                          "clover rm removes downloaded models: see them with clover list")
    found = matching(model)
    if not found:
        raise CloverError(f"no cached model matches {model}", "see what is cached with: clover list")
    for m in found:
        console.info(f"  {m.name}  {human_bytes(m.size)}  {m.path}")
    if not yes:
        if not sys.stdin.isatty():
            raise CloverError(f"not deleting {len(found)} model(s) without confirmation", "pass -y to confirm")
        if not typer.confirm(f"delete {len(found)} model(s)?", default=False, err=True):
            raise typer.Exit(1)
    _refuse_locked(found)
    try:
        freed = remove(found)
    except PermissionError as exc:  # locked after the check: say which file, never a traceback
        raise CloverError(f"cannot delete {exc.filename}: it is in use", IN_USE_HINT) from None
    console.out().print(f"deleted {len(found)} model(s), freed {human_bytes(freed)}", markup=False, highlight=False)
