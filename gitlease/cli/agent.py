"""``git lease agent``: the per-user, per-host renewal agent (gitlease/liveness/agent.py), in the foreground."""

from __future__ import annotations

from typing import Annotated

import typer

from gitlease.cli.common import command
from gitlease.cli.options import JsonOpt, make_app

app = make_app()


@app.command()
@command("agent")
def agent(
    socket: Annotated[
        str | None,
        typer.Option(help="Unix socket (default: $GITLEASE_AGENT_SOCKET, or $XDG_RUNTIME_DIR/gitlease/agent.sock)."),
    ] = None,
    idle: Annotated[float, typer.Option(help="Stop after this many seconds with nothing registered.")] = 60.0,
    fraction: Annotated[float, typer.Option(help="Renew when this fraction of the TTL is left.")] = 0.5,
    ping: Annotated[bool, typer.Option("--ping", help="Only say whether an agent answers (exit 1 if not).")] = False,
    as_json: JsonOpt = False,
):
    """Renew the leases of every local holder that registers, one push per store and interval."""
    from gitlease.core import errors
    from gitlease.liveness import agent as agents

    path = socket or agents.socket_path()
    client = agents.AgentClient(path)
    if ping:
        if not client.available():
            raise errors.GitLeaseError(f"no agent answers on {path}", socket=path)
        ans = client.request("ping")
        return {"socket": path, "pid": ans["pid"], "leases": ans["leases"]}, [
            f"agent running: pid {ans['pid']}, {ans['leases']} leases, socket {path}"
        ]
    if client.available():
        raise errors.GitLeaseError(f"an agent already answers on {path}", socket=path)
    import os

    path = os.path.abspath(path)
    os.chdir("/")  # as the background agent: the folder it was started from may be removed while it runs
    agents.serve(agents.Agent(agents._open_service, idle=idle, fraction=fraction), path)
    return {"socket": path, "stopped": "idle"}, [f"agent stopped after {idle:g}s idle"]
