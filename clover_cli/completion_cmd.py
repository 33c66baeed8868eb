"""`clover completion SHELL`: print the completion script, so an installed clover (pip, clover.exe)
carries the scripts of `completions/` without a checkout."""

from __future__ import annotations

import typer

from .completion import SHELL_FILES

_SHELLS = ", ".join(sorted(SHELL_FILES))


def command(
    shell: str = typer.Argument(..., metavar="SHELL", help=f"One of: {_SHELLS}."),
) -> None:
    """Print the shell completion script (the same as completions/ in the source).

    Example (PowerShell, in $PROFILE):

        clover completion powershell | Out-String | Invoke-Expression
    """
    from clover_runtime.errors import CloverError

    from .completion import render

    name = shell.strip().lower()
    if name == "pwsh":
        name = "powershell"
    if name not in SHELL_FILES:
        raise CloverError(f"no completion for shell {shell!r}", f"choose one of: {_SHELLS}")
    typer.echo(render(name), nl=False)
