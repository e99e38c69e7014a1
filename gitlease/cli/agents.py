"""Commands for coding agents: extend and narrow a held lease, install the edit-time guard into an agent's
hook settings (agent-hooks), and serve the Model Context Protocol (mcp). docs/agents.md."""

from __future__ import annotations

from typing import Annotated

import typer

from gitlease.cli.common import run, service, ttl_seconds
from gitlease.cli.options import JsonOpt, LeaseArg, RemoteOpt, ScopeOpt, make_app

app = make_app()

TtlOpt = Annotated[str | None, typer.Option(help="New time to live (default: the lease's own).")]


def _resized_lines(verb: str, got) -> list[str]:
    change = " ".join([f"+{p}" for p in got.added] + [f"-{p}" for p in got.removed]) or "(nothing to change)"
    rec = got.record
    return [
        f"lease {verb}: {got.lease_id} {change}",
        f"scope: {' '.join(rec.paths)}",
        f"version: {rec.version} expiresAt={rec.expires_at}",
    ]


@app.command()
def extend(lease_id: LeaseArg, scope: ScopeOpt, ttl: TtlOpt = None, remote: RemoteOpt = None, as_json: JsonOpt = False):
    """Add paths to a lease this worktree holds, in one atomic push (all or nothing). Exit 3, naming the holder,
    when a new path overlaps another lease; exit 6 when the lease was lost. It renews the lease too."""

    def body():
        got = service(remote).extend(lease_id, scope, ttl=ttl_seconds(ttl))
        return got.to_json(), _resized_lines("extended", got)

    run("extend", as_json, body)


@app.command()
def narrow(lease_id: LeaseArg, scope: ScopeOpt, ttl: TtlOpt = None, remote: RemoteOpt = None, as_json: JsonOpt = False):
    """Give paths of a lease this worktree holds back (whole scopes of the lease), in one atomic push; others
    can take them at once. It renews the lease too."""

    def body():
        got = service(remote).narrow(lease_id, scope, ttl=ttl_seconds(ttl))
        return got.to_json(), _resized_lines("narrowed", got)

    run("narrow", as_json, body)
