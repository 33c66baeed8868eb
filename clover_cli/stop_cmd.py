"""`clover stop [PORT|--all]`: stop background servers cleanly."""

from __future__ import annotations

import typer


def command(
    port: int | None = typer.Argument(None, help="Port of the server to stop (see `clover ps`)."),
    all_: bool = typer.Option(False, "--all", help="Stop every running clover server."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait, beyond the server's --shutdown-timeout, "
                                                          "before forcing it to quit."),
) -> None:
    """Stop a running clover server: queued requests get 503, running replies get the server's
    --shutdown-timeout to finish and are then cut with a server_shutting_down error.

    Example:

        clover stop 8085          (or: clover stop --all)
    """
    from clover_runtime.errors import CloverError

    from . import console, service

    servers = service.list_servers()
    if all_:
        targets = servers
    elif port is not None:
        targets = [r for r in servers if r.port == port]
        if not targets:
            raise CloverError(f"no clover server is running on port {port}", "see `clover ps`")
    elif len(servers) > 1:
        ports = ", ".join(str(r.port) for r in servers)
        raise CloverError(f"{len(servers)} servers are running (ports {ports}); say which",
                          "clover stop PORT, or clover stop --all")
    else:
        targets = servers
    if not targets:
        console.info("no clover servers are running")
        return
    for record in targets:
        how = service.stop_server(record, timeout=timeout)
        console.info(f"{how} the server on port {record.port} (pid {record.pid})")
