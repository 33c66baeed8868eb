"""`clover ps`: the clover servers running for this user (background or foreground)."""

from __future__ import annotations

import typer


def command(
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON (for scripts)."),
) -> None:
    """List running clover servers: port, pid, model, URL, uptime and log file.

    Example:

        clover serve demo --detach && clover ps
    """
    import json
    import time

    from rich.table import Table

    from . import console, service

    servers = service.list_servers()
    if as_json:
        rows = [{"port": r.port, "pid": r.pid, "host": r.host, "url": r.url, "model": r.model,
                 "started": r.started, "log": r.log} for r in servers]
        typer.echo(json.dumps(rows, indent=2))
        return
    if not servers:
        console.info("no clover servers are running (start one with `clover serve MODEL --detach`)")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("PORT", "PID", "MODEL", "URL", "UPTIME", "LOG"):
        table.add_column(col, no_wrap=col not in ("MODEL", "LOG"))
    now = time.time()
    for r in servers:
        table.add_row(str(r.port), str(r.pid), r.model, r.url, service.format_uptime(now - r.started),
                      r.log or "(foreground)")
    console.out().print(table)
