"""The `clover` command: a Typer app whose subcommands live one per module.

Subcommand modules import only typer and the standard library at module level (heavy imports
happen inside the command), so shell completion never pays for numpy, numba or the Hub client.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer

from . import (
    __version__,
    bench_cmd,
    completion_cmd,
    console,
    doctor_cmd,
    inspect_cmd,
    list_cmd,
    make_model_cmd,
    ps_cmd,
    pull_cmd,
    rm_cmd,
    run_cmd,
    serve_cmd,
    stop_cmd,
)
from .help_text import HelpCommand, HelpGroup

app = typer.Typer(
    name="clover",
    cls=HelpGroup,
    help="Run Clover block-diffusion GGUF models locally: pull, run, serve, bench, inspect.",
    no_args_is_help=False,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

GUIDE = """clover {version}: Clover block-diffusion models on your own machine.

Try it now, with the small model that ships with clover (no download):

  clover run demo "What is 48 + 36?" --no-think

  clover pull owner/repo:Q4_K_M     download a model into the Hugging Face cache
  clover run [MODEL]                chat in the terminal (or one-shot with a prompt)
  clover serve -c 16384             OpenAI-compatible API at /v1 and a chat page at /
  clover ps                         the servers running in the background (serve --detach)
  clover stop [PORT]                stop a background server
  clover bench [MODEL]              prefill / decode / diffusion speed, llama-bench style
  clover inspect MODEL              what a GGUF holds and whether it fits this machine
  clover list                       the models in the cache
  clover rm MODEL                   remove a model from the cache
  clover doctor                     is this machine ready, and does the default model fit
  clover make-model tiny.gguf       write a small synthetic Clover model to try things on
  clover completion powershell      print the shell completion script (bash, zsh, fish, powershell)

MODEL is demo, a .gguf path or owner/repo[:QUANT].
`clover COMMAND --help` lists the options of each command.
"""


def git_commit() -> str:
    """The short commit of a source checkout, 'release' for an installed package."""
    from clover_runtime.processes import creation_kwargs

    here = Path(__file__).resolve().parent.parent
    if not (here / ".git").exists():
        return "release"
    try:
        res = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=2,
            **creation_kwargs(),
        )
        return res.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def version_string() -> str:
    return f"clover {__version__} ({git_commit()})"


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(version_string())
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="More detail in logs and errors."),
    no_color: bool = typer.Option(False, "--no-color", help="No colours (also NO_COLOR=1)."),
) -> None:
    """Run Clover block-diffusion GGUF models locally."""
    console.set_options(verbose=verbose, no_color=no_color)
    if ctx.invoked_subcommand is None:
        typer.echo(GUIDE.format(version=__version__))
        raise typer.Exit()


for _name, _module in (("pull", pull_cmd), ("run", run_cmd), ("serve", serve_cmd), ("ps", ps_cmd),
                      ("stop", stop_cmd), ("bench", bench_cmd), ("inspect", inspect_cmd),
                      ("make-model", make_model_cmd), ("list", list_cmd), ("rm", rm_cmd), ("doctor", doctor_cmd),
                      ("completion", completion_cmd)):
    app.command(_name, cls=HelpCommand)(_module.command)


def main() -> None:
    """Entry point: one red line for errors we understand, tracebacks only with CLOVER_DEBUG=1."""
    from clover_runtime.errors import CloverError

    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(encoding="utf-8", errors="replace")
            except (ValueError, OSError):
                pass
    debug = os.environ.get("CLOVER_DEBUG") == "1"
    try:
        code = _run(sys.argv[1:])
    except CloverError as exc:
        if debug:
            raise
        from .advice import hint_for

        console.print_error(exc.message, hint_for(exc))
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if debug:
            raise
        console.print_error(f"internal error: {type(exc).__name__}: {exc}",
                            "run again with CLOVER_DEBUG=1 to see the traceback")
        sys.exit(1)
    sys.exit(code)


def _run(args: list[str]) -> int:
    """Run the app with click's standalone mode off, so usage errors come back here and print as
    one line (with a hint naming --help) like every other error; exit code 2 as click gives them."""
    from typer.main import get_command

    from .llama_flags import MissingFlag, rewrite

    group = get_command(app)
    try:
        args = rewrite(args, group, console.warn)
        result = group.main(args=args, prog_name="clover", standalone_mode=False)
    except MissingFlag as exc:
        console.print_error(exc.message, f"clover {exc.command} --help lists its options")
        return 2
    except typer.TyperException as exc:  # click's usage errors (typer vendors click under this base)
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "clover"
        message = exc.format_message()
        console.print_error(message[:1].lower() + message[1:], f"{where} --help lists the options")
        return int(getattr(exc, "exit_code", 2))
    except typer.Exit as exc:
        return exc.exit_code
    return result if isinstance(result, int) else 0
