"""``git lease worktree add | list | prune | remove``: worktrees bound to leases (gitlease.worktree.manager)."""

from __future__ import annotations

from typing import Annotated

import typer

from gitlease.cli.common import command, service
from gitlease.cli.options import JsonOpt, LeaseArg, RemoteOpt, make_app

app = make_app()
worktree_app = make_app(help="Worktrees bound to leases: attach, list, prune, remove.")
app.add_typer(
    worktree_app, name="worktree", help="Worktrees bound to leases: attach, list, prune, remove (docs/worktrees.md)."
)

BaseOpt = Annotated[
    str | None,
    typer.Option("--base", help="Start the task branch here (default: origin/HEAD, else origin/main, else HEAD)."),
]
BranchOpt = Annotated[str | None, typer.Option("--branch", help="Task branch name (default: lease/LEASE).")]
WorkspaceArg = Annotated[str, typer.Argument(help="The worktree's id (its workspace: line), or its path.")]


def manager(remote: str | None):
    from gitlease.worktree.manager import WorktreeManager

    return WorktreeManager(service(remote))


def attached_lines(att) -> list[str]:
    """The lines after 'workspace:' shared with ``acquire --worktree``."""
    lines = [
        f"worktree: {att.path}",
        f"branch: {att.branch} (from {att.base} {att.base_oid[:12]})",
        f"reused: {'yes' if att.reused else 'no'}",
    ]
    lines += [f"not reused: {wid}: {'; '.join(reasons)}" for wid, reasons in att.skipped]
    return lines


@worktree_app.command("add")
@command("worktree add")
def add(
    lease_id: LeaseArg,
    base: BaseOpt = None,
    branch: BranchOpt = None,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Attach a worktree to a lease this worktree holds: a clean pool worktree reset to the base, or a new one.
    The lease moves into it (renew and release it there)."""
    from gitlease.core.record import check_lease_id

    att = manager(remote).add(check_lease_id(lease_id), base=base, branch=branch)
    return att.to_json(), [
        f"worktree attached: {att.path}",
        f"workspace: {att.id}",
        f"lease: {att.lease_id}",
    ] + attached_lines(att)


@worktree_app.command("list")
@command("worktree list")
def list_(remote: RemoteOpt = None, as_json: JsonOpt = False):
    """Each worktree with its lease, lease state (active, expired, released, none), cleanliness and age."""
    entries = manager(remote).list()
    lines = []
    for e in entries:
        wt = e.worktree
        insp = e.inspection
        clean = (
            "; ".join(
                ([f"dirty: {'; '.join(insp.dirt)}"] if insp.dirt else [])
                + ([f"busy: {'; '.join(insp.busy)}"] if insp.busy else [])
            )
            or "clean"
        )
        age = f"{e.age}s" if e.age is not None else "-"
        lines.append(f"{wt.id}  {e.state}  lease={e.lease or '-'} ({e.lease_state})  {clean}  age={age}  {wt.path}")
    return {"worktrees": [e.to_json() for e in entries]}, lines or ["no linked worktrees"]


@worktree_app.command("prune")
@command("worktree prune")
def prune(
    remove: Annotated[
        bool,
        typer.Option(
            "--remove",
            help="Remove clean worktrees of released or expired leases (and free pool ones) instead of pooling them.",
        ),
    ] = False,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Clean worktrees of released or expired leases go back to the pool (or are removed); dirty ones are
    quarantined: kept, unlocked, out of the pool, their changes saved to a ref, and reported."""
    actions = manager(remote).prune(remove=remove)
    lines = []
    for a in actions:
        why = f" ({'; '.join(a.reasons)})" if a.reasons else ""
        saved = f" -> {a.ref}" if a.ref else ""
        lines.append(f"{a.action}: {a.id}{why}{saved}")
    return {"actions": [a.to_json() for a in actions]}, lines or ["nothing to prune"]


@worktree_app.command("remove")
@command("worktree remove")
def remove(
    workspace: WorkspaceArg,
    save: Annotated[
        bool,
        typer.Option(
            "--save", help="Save uncommitted work (ignored files included) to a quarantine ref first, then remove."
        ),
    ] = False,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Remove a worktree. Refuses when it has uncommitted work (unless --save) or a live process in it.
    Its lease is not released: it is handed back to the worktree running this command."""
    wt, ref, handed = manager(remote).remove(workspace, save=save)
    lines = [f"worktree removed: {wt.id} ({wt.path})"]
    if ref:
        lines.append(f"saved: {ref}")
    if handed:
        lines.append(f"lease still held, now by this worktree: {handed} (git lease release {handed})")
    return {"workspaceId": wt.id, "path": wt.path, "savedRef": ref, "leasesHandedBack": handed}, lines
