"""Enforcement commands: install-hooks, uninstall-hooks, verify, server-hook."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gitlease.cli.common import command, service
from gitlease.cli.options import JsonOpt, RemoteOpt, make_app
from gitlease.core import errors

app = make_app()

ServerOpt = Annotated[
    bool,
    typer.Option(
        "--server", help="The server side: pre-receive, in a bare repository (instead of pre-commit and pre-push)."
    ),
]


def _change_lines(changes) -> list[str]:
    lines = []
    for c in changes:
        extra = ""
        if c.action == "installed" and c.legacy:
            extra = f" (the hook that was there is kept as {c.legacy} and runs first)"
        elif c.action == "restored":
            extra = " (the hook it replaced is back)"
        elif c.action == "foreign":
            extra = " (not gitlease's hook: left alone)"
        lines.append(f"{c.name}: {c.action} {c.path}{extra}")
    return lines


@app.command("install-hooks")
@command("install-hooks")
def install_hooks(server: ServerOpt = False, as_json: JsonOpt = False):
    """Install gitlease's pre-commit and pre-push hooks where git looks for hooks (core.hooksPath and linked
    worktrees included); a hook already there is kept and run first. Idempotent."""
    from gitlease.enforce.install import CLIENT_HOOKS, SERVER_HOOKS, install

    changes = install(".", SERVER_HOOKS if server else CLIENT_HOOKS)
    return {"hooks": [c.to_json() for c in changes]}, _change_lines(changes)


@app.command("uninstall-hooks")
@command("uninstall-hooks")
def uninstall_hooks(server: ServerOpt = False, as_json: JsonOpt = False):
    """Remove gitlease's hooks and put back the hooks they replaced."""
    from gitlease.enforce.install import CLIENT_HOOKS, SERVER_HOOKS, uninstall

    changes = uninstall(".", SERVER_HOOKS if server else CLIENT_HOOKS)
    return {"hooks": [c.to_json() for c in changes]}, _change_lines(changes)


@app.command()
@command("verify")
def verify(
    base: Annotated[
        str | None,
        typer.Option(
            help="What the change is compared with: the pull request's base (default: the branch's upstream, "
            "or the remote's default branch when the upstream is the branch's own copy or there is none).",
            show_default=False,
        ),
    ] = None,
    lease: Annotated[
        list[str] | None,
        typer.Option(
            "--lease",
            help="The lease the change was made under "
            "(default: the commits' 'Lease:' trailers, else a lease id "
            "in the branch name); repeat for more.",
        ),
    ] = None,
    head: Annotated[
        str | None,
        typer.Option(
            help="The commit or branch to check (default: the current branch; its name may hold the lease id).",
            show_default=False,
        ),
    ] = None,
    require_lease: Annotated[
        bool,
        typer.Option(
            "--require-lease",
            help="Refuse a change that names no lease (default: check it against others' leases only).",
        ),
    ] = False,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """CI check of a pull request: every path its commits touch must lie inside the lease it was made under
    (active on the store) and outside every other active lease. Exit 4 on a violation."""
    from gitlease.enforce.verify import describe
    from gitlease.enforce.verify import verify as check

    verdict = check(service(remote), base=base, head=head, lease_ids=lease or None, require_lease=require_lease)
    lines = describe(verdict)
    if not verdict.ok:
        if not as_json:
            sys.stderr.write("".join(line + "\n" for line in lines))
        n = len(verdict.violations)
        raise errors.ScopeViolation(
            f"verify refused: {n} path{'s' if n != 1 else ''} may not be written by this change",
            **verdict.to_json(),
        )
    return verdict.to_json(), lines


@app.command("server-hook")
@command("server-hook")
def server_hook(
    hook: Annotated[str, typer.Argument(help="The hook git runs: pre-receive.")],
    as_json: JsonOpt = False,
):
    """Run as a server-side hook (refs on stdin): refuses lease ref updates that are not a proper next version
    and branch updates touching paths leased to someone else."""
    if hook != "pre-receive":
        raise errors.UsageError(f"unknown server hook {hook!r} (only pre-receive)")
    from gitlease.enforce.server import pre_receive

    refusals, notes = pre_receive(sys.stdin.buffer.read())
    if refusals:
        if not as_json:
            sys.stderr.write("".join(f"gitlease: {line}\n" for line in refusals))
        raise errors.ScopeViolation(
            f"push refused by the lease server hook ({len(refusals)} problem{'s' if len(refusals) != 1 else ''})",
            problems=refusals,
        )
    return {"notes": notes}, [f"gitlease: {n}" for n in notes]
