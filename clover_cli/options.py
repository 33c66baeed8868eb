"""Options that mean the same in every command that takes them (module top: typer only)."""

from __future__ import annotations

from typing import Any

import typer

DEFAULT_CTX = 16384  # equals clover_runtime.memory_fit.DEFAULT_CTX (a test checks), kept here so --help stays light

CTX_HELP = (f"Context per sequence in tokens (default {DEFAULT_CTX}, capped at the model's; "
            "0 = the largest that fits this machine, at most the model's).")


def ctx_option(help_text: str = CTX_HELP, *, annotated: bool = False) -> Any:
    """-c/--ctx-size: per-sequence context, the same default and the same 0 in run, serve, inspect,
    doctor and pull (serve's total is -c × -np). `annotated`: for `Annotated[...]` signatures, where
    the default sits after the `=` instead of first in the call."""
    first = () if annotated else (None,)
    return typer.Option(*first, "-c", "--ctx-size", min=0, envvar="CLOVER_CTX_SIZE", show_default=False,
                        help=help_text)
