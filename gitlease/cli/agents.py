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


hooks_app = typer.Typer(
    name="agent-hooks",
    help="Install gitlease's edit-time guard into a coding agent's hook settings (docs/agents.md).",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(hooks_app, name="agent-hooks")

AgentArg = Annotated[str, typer.Argument(help="claude, codex or gemini (any other agent: docs/agents.md).")]
UserOpt = Annotated[
    bool,
    typer.Option("--user", help="The agent's settings in your home folder (all projects), not this project's."),
]


def _hook_lines(change) -> list[str]:
    lines = [f"{change.agent}: {change.action} {change.path}"]
    if change.note and change.action in ("installed", "updated"):
        lines.append(f"note: {change.note}")
    return lines


@hooks_app.command("install")
def hooks_install(
    agent: AgentArg,
    user: UserOpt = False,
    portable: Annotated[
        bool,
        typer.Option(
            "--portable",
            help="Run git-lease-hook from PATH instead of this Python's absolute path (for a settings file you "
            "commit; slower start).",
        ),
    ] = False,
    as_json: JsonOpt = False,
):
    """Merge gitlease's hooks into the agent's settings, keeping every other hook: a pre-tool hook on its file
    edits (git-lease-hook pre-edit: an edit outside the leases is refused before it is written) and a post-tool
    hook on its shell tool (git-lease-hook post-shell). Idempotent."""

    def body():
        from gitlease.enforce.agenthooks import install

        change = install(agent, user=user, portable=portable)
        return change.to_json(), _hook_lines(change)

    run("agent-hooks install", as_json, body)


@hooks_app.command("uninstall")
def hooks_uninstall(agent: AgentArg, user: UserOpt = False, as_json: JsonOpt = False):
    """Remove gitlease's hooks from the agent's settings; every other hook stays."""

    def body():
        from gitlease.enforce.agenthooks import uninstall

        change = uninstall(agent, user=user)
        return change.to_json(), _hook_lines(change)

    run("agent-hooks uninstall", as_json, body)


@hooks_app.command("status")
def hooks_status(
    agent: Annotated[str | None, typer.Argument(help="claude, codex or gemini (default: all three).")] = None,
    as_json: JsonOpt = False,
):
    """Whether gitlease's hooks will run for the agent as it starts here: installed (project or user), current,
    and not switched off by the client's trust gates or settings. Exit 1 when one would run unfenced."""

    def body():
        from gitlease.core.errors import GitLeaseError
        from gitlease.enforce.agenthooks import AGENTS, status

        got = [status(a) for a in ([agent] if agent else list(AGENTS))]
        lines = []
        for st in got:
            head = "active" if st.active else "NOT ACTIVE"
            lines.append(f"{st.agent}: {head}" + (f" ({st.where})" if st.where else ""))
            lines += [f"  {p}" for p in st.problems]
        if not all(st.active for st in got):
            if not as_json:
                from gitlease.cli.common import echo

                for line in lines:
                    echo(line)
            off = [st.agent for st in got if not st.active]
            raise GitLeaseError(
                f"{', '.join(off)} would run without gitlease's hooks", agents=[st.to_json() for st in got]
            )
        return [st.to_json() for st in got], lines

    run("agent-hooks status", as_json, body)


@app.command("mcp")
def mcp_cmd(
    remote: RemoteOpt = None,
    on_exit: Annotated[
        str,
        typer.Option(
            "--on-exit",
            help="What happens to the leases this session acquired when it ends: release (default), or keep "
            "(left to expire).",
        ),
    ] = "release",
):
    """Serve the Model Context Protocol over stdio (for an MCP client: Claude Code, Codex CLI, Cursor, Gemini
    CLI, an orchestrator): lease tools and a resource with this worktree's leases."""
    import sys

    from gitlease.cli.common import echo
    from gitlease.core import errors
    from gitlease.mcp.server import serve

    try:
        problems = serve(".", remote=remote, on_exit=on_exit)
    except errors.GitLeaseError as exc:
        echo(f"git-lease: {exc.message}", err=True)
        raise SystemExit(exc.exit_code) from None
    except Exception as exc:  # a bug, or an SDK we do not know: one line, never a traceback
        import os

        if os.environ.get("GITLEASE_DEBUG"):
            raise
        echo(f"git-lease: mcp: internal error: {type(exc).__name__}: {exc}", err=True)
        raise SystemExit(errors.ERROR) from None
    for line in problems:
        echo(f"git-lease: mcp: {line}", err=True)
    sys.stderr.flush()
    raise SystemExit(1 if problems else 0)
