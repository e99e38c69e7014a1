"""The core commands: acquire, renew, release, status, show, can-start.

Written without importing typer, so that ``gitlease.cli.fast`` can run them on a well-formed command line
without loading typer and click (most of a command's start-up). The annotations are strings (``from __future__
import annotations``) that only typer reads: ``app`` (the typer app: help, usage errors, man page, completion)
is built on first use by ``options.bind``, which puts the names they use (``typer``, ``JsonOpt``...) here.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gitlease.cli.common import echo, run, service, ttl_seconds
from gitlease.core import errors
from gitlease.core.clock import iso

if TYPE_CHECKING:  # the names the annotations use: put here at run time by options.bind
    from typing import Annotated

    import typer

    from gitlease.cli.options import JsonOpt, LeaseArg, RemoteOpt, ScopeOpt


# ----------------------------------------------------------------------------- commands


def acquire(
    scope: ScopeOpt,
    task: Annotated[str | None, typer.Option(help="Task id (default: $GITLEASE_TASK).")] = None,
    agent: Annotated[str | None, typer.Option(help="Agent id (default: $GITLEASE_AGENT, lease.agent).")] = None,
    ttl: Annotated[str | None, typer.Option(help="Time to live: 300, 300s, 5m (default: lease.ttl, 300).")] = None,
    workspace: Annotated[str | None, typer.Option(help="Workspace id recorded in the lease.")] = None,
    holder_pid: Annotated[
        int, typer.Option(help="Pid of the process that holds the lease (same-host sweep).", hidden=True)
    ] = 0,
    wait: Annotated[
        str | None,
        typer.Option(
            help="While the scope is held, retry (jittered backoff) for up "
            "to this long: 30s, 10m; exit 3 when it runs out."
        ),
    ] = None,
    replace: Annotated[
        str | None,
        typer.Option(
            help="Release this lease (held here, its task done) in the "
            "same push: moving to the next task costs one push."
        ),
    ] = None,
    remote: RemoteOpt = None,
    worktree: Annotated[
        bool, typer.Option("--worktree", help="Then attach a clean worktree bound to the lease (docs/worktrees.md).")
    ] = False,
    base: Annotated[
        str | None,
        typer.Option(
            help="With --worktree: start the task branch here (default: origin/HEAD, else origin/main, else HEAD)."
        ),
    ] = None,
    branch: Annotated[
        str | None, typer.Option(help="With --worktree: task branch name (default: lease/LEASE).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Lease path prefixes. Refused with exit 3, naming the holder, when another lease overlaps."""

    def body():
        svc = service(remote, task=task, agent=agent)
        args = dict(ttl=ttl_seconds(ttl), holder_pid=holder_pid, workspace=workspace)
        if replace:
            if worktree:
                raise errors.UsageError(
                    "--replace and --worktree do not go together (a worktree's lease is released from inside it)"
                )
            args["replace"] = replace
        att = None
        do_acquire = svc.acquire
        if worktree:
            if workspace:
                raise errors.UsageError(
                    "--workspace and --worktree do not go together: the worktree's id is the workspace"
                )
            from gitlease.worktree.manager import WorktreeManager

            manager = WorktreeManager(svc)
            args = dict(ttl=ttl_seconds(ttl), holder_pid=holder_pid, base=base, branch=branch)
            do_acquire = manager.acquire
        elif base or branch:
            raise errors.UsageError("--base and --branch need --worktree")
        if wait is not None:
            from gitlease.core.config import parse_duration
            from gitlease.liveness.wait import acquire_wait

            got = acquire_wait(
                svc,
                scope,
                wait=parse_duration("--wait", wait, 0),
                on_wait=lambda refusal, pause: echo(f"git-lease: waiting ({pause:.1f}s): {refusal.message}", err=True),
                acquire=do_acquire,
                **args,
            )
        else:
            got = do_acquire(scope, **args)
        if worktree:
            att, got = got, got.acquired
        rec = got.record
        lines = [
            f"lease acquired: {got.lease_id}",
            f"workspace: {rec.workspace_id}",
            f"ttl: {rec.ttl}s",
            f"store: {svc.store.name}" + (" (this repository's own refs)" if svc.store.kind == "local" else ""),
        ]
        lines += [f"cleared expired lease: {c}" for c in got.cleared]
        if replace:
            lines.append(f"lease released: {replace}")
        result = {
            "leaseId": got.lease_id,
            "workspaceId": rec.workspace_id,
            "ttl": rec.ttl,
            "paths": list(rec.paths),
            "version": rec.version,
            "expiresAt": rec.expires_at,
            "store": svc.store.name,
            "cleared": list(got.cleared),
        }
        if att is not None:
            from gitlease.cli.worktree import attached_lines

            lines += attached_lines(att)
            result["worktree"] = att.to_json()
        return result, lines

    run("acquire", as_json, body)


def renew(
    lease_id: LeaseArg,
    ttl: Annotated[str | None, typer.Option(help="New time to live (default: the lease's own).")] = None,
    progress: Annotated[str | None, typer.Option(help="A short progress note recorded in the lease.")] = None,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Extend a lease this worktree holds. Exit 6 ("lease lost or replaced") is a stop signal."""

    def body():
        got = service(remote).renew(lease_id, ttl=ttl_seconds(ttl), progress=progress)
        rec = got.record
        return (
            {"leaseId": got.lease_id, "version": rec.version, "expiresAt": rec.expires_at},
            [f"lease renewed: version={rec.version} expiresAt={rec.expires_at}"],
        )

    run("renew", as_json, body)


def release(
    lease_id: LeaseArg,
    force: Annotated[
        bool, typer.Option(help="Release a lease this worktree does not hold, live or invalid: admin only, audited.")
    ] = False,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give a lease back (its worktree stays)."""

    def body():
        if force:
            from gitlease.ops.sweep import Sweeper

            svc = service(remote)
            got = Sweeper(svc).force(lease_id, action="force-release")
            if got.outcome != "reclaimed":
                raise errors.GitLeaseError(
                    f"forced release of {lease_id} did not happen: {got.line()}", **got.to_json()
                )
            return (
                dict(got.to_json(), auditRef=svc.audit.ref),
                [f"lease released: {lease_id}", f"audited: {got.reason} in {svc.audit.ref}"],
            )
        service(remote).release(lease_id)
        return {"leaseId": lease_id}, [f"lease released: {lease_id}"]

    run("release", as_json, body)


_MARKS = {"verified": "", "unsigned": " [unsigned]", "untrusted": " [signed, unverified: no trust file]"}


def _invalid(problems) -> str:
    return f"  INVALID (scope stays blocked; only a gitlease-admin key can clear it): {'; '.join(problems)}"


def _snapshot_lines(snap, now: float, skew: int) -> list[str]:
    lines = []
    if snap.stale:
        age = int(now - snap.fetched_at)
        lines.append(
            f"warning: store unreachable ({snap.error}); showing state fetched {age}s ago ({iso(snap.fetched_at)})"
        )
    lines.append(snap.trust)
    if not snap.leases:
        lines.append("no active leases")
    for v in snap.leases:
        st = v.state(now, skew)
        mark = _MARKS.get(v.verification, "") if v.valid else ""
        if v.record is None:
            lines.append(f"{v.lease_id}  {' '.join(v.paths)}" + _invalid(v.problems or ["unreadable"]))
            continue
        r = v.record
        left = int(r.expires - now)
        flag = _invalid(v.problems) if v.problems else ""
        lines.append(
            f"{v.lease_id}  {' '.join(r.paths)}  task={r.owner.task_id} agent={r.owner.agent_id}  "
            f"{st} {left}s left  v{r.version}{mark}{flag}"
        )
    return lines


def _signature_text(h: dict) -> str:
    who = f"signed by {h['signer']}" if h["signer"] else ("signed" if h["signed"] else "unsigned")
    if h["verification"] == "verified":
        return f"{who} (agent {h['principal']}): verified"
    if h["verification"] == "untrusted":
        return f"{who}: signature good, key not checked (no trust file)"
    if h["verification"] == "unsigned":
        return "unsigned"
    return who


def status(remote: RemoteOpt = None, as_json: JsonOpt = False) -> None:
    """Every lease on the store: id, scope, owner, time left. Answers from the last fetched state (and says
    how old it is) when the store cannot be reached."""

    def body():
        svc = service(remote)
        snap = svc.status()
        now, skew = svc.clock.now(), svc.settings.skew
        held = svc.held_here()
        result = {
            "store": svc.store.name,
            "stale": snap.stale,
            "fetchedAt": iso(snap.fetched_at),
            "error": snap.error,
            "trust": snap.trust,
            "signed": snap.signed_store,
            "leases": [dict(v.to_json(now, skew), heldHere=v.lease_id in held) for v in snap.leases],
            "foreign": snap.foreign,
        }
        lines = _snapshot_lines(snap, now, skew)
        lines += [f"foreign ref (not a lease; it blocks nothing): {ref}" for ref in snap.foreign]
        overlaps = snap.overlaps(now, skew)
        if overlaps:  # everything above is printed, then exit 5 naming both leases of each pair
            if not as_json:
                for line in lines:
                    echo(line)
            pairs = "; ".join(
                f"{a.lease_id} ({' '.join(a.paths)}) and {b.lease_id} ({' '.join(b.paths)})" for a, b in overlaps
            )
            raise errors.InvalidRecord(
                f"store fault: live leases overlap: {pairs}; the store granted both (a server that does not "
                "serialise ref updates: run git lease doctor)",
                overlaps=[[a.lease_id, b.lease_id] for a, b in overlaps],
                **result,
            )
        return result, lines

    run("status", as_json, body)


def _gone(svc, lease_id: str) -> str:
    """Why ``show`` finds no lease: reclaimed (the audit log says by whom and when) or released/never there."""
    from gitlease.service.audit import read_log

    try:
        entries = [e for e in read_log(svc.store) if e.lease_id == lease_id]
    except errors.GitLeaseError:
        entries = []
    if entries:
        d = entries[-1].doc
        return (
            f"lease {lease_id} is gone from store {svc.store.name}: {d.get('action')} by {d.get('by')} at "
            f"{d.get('at')} (rule {d.get('rule')}); see 'git lease log --lease {lease_id}'"
        )
    return f"no lease {lease_id} on store {svc.store.name} (released, or never there: a release leaves no trace)"


def show(lease_id: LeaseArg, remote: RemoteOpt = None, as_json: JsonOpt = False) -> None:
    """One lease in full: its record, its history, and whether each version verifies."""

    def body():
        svc = service(remote)
        view, history, snap = svc.show(lease_id)
        if view is None:
            raise errors.GitLeaseError(_gone(svc, lease_id), leaseId=lease_id)
        now, skew = svc.clock.now(), svc.settings.skew
        hist = [
            {
                "oid": h.oid,
                "version": h.record.version if h.record else None,
                "renewedAt": h.record.renewed_at if h.record else None,
                "problem": h.problem,
                "signed": h.signed,
                "verification": h.verification,
                "signer": h.signer,
                "principal": h.principal,
            }
            for h in history
        ]
        verification = view.verification if view.valid else "invalid"
        by = f", signed by {view.signer}" if view.signer else ""
        lines = [f"lease {view.lease_id}: {view.state(now, skew)} ({verification}{by})", snap.trust]
        if view.record:
            lines.append(json.dumps(view.record.to_json(), indent=2, sort_keys=True))
        if view.problems:
            lines.append("INVALID: its scope stays blocked; only a gitlease-admin key can clear it")
        lines += [f"problem: {p}" for p in view.problems]
        lines.append("history:")
        for h in hist:
            lines.append(
                f"  v{h['version']}  {h['oid'][:12]}  {h['renewedAt']}  {_signature_text(h)}"
                + (f"  INVALID: {h['problem']}" if h["problem"] else "")
            )
        result = dict(
            view.to_json(now, skew),
            record=view.record.to_json() if view.record else None,
            history=hist,
            stale=snap.stale,
            trust=snap.trust,
        )
        if not view.valid:  # everything above is printed, then exit 5 with the reason
            if not as_json:
                for line in lines:
                    echo(line)
            raise errors.InvalidRecord(f"lease {view.lease_id} does not verify: {'; '.join(view.problems)}", **result)
        return result, lines

    run("show", as_json, body)


def can_start(scope: ScopeOpt, remote: RemoteOpt = None, as_json: JsonOpt = False) -> None:
    """Read-only: exit 0 if the scope is free now, 3 if not (naming the blockers)."""

    def body():
        from gitlease.service.views import held_error

        svc = service(remote)
        paths, blockers, _ = svc.can_start(scope)
        if blockers:
            raise held_error(paths, blockers, svc.clock.now(), svc.settings.skew)
        return {"paths": list(paths), "free": True}, [f"free: {' '.join(paths)}"]

    run("can-start", as_json, body)


COMMANDS = {
    "acquire": acquire,
    "renew": renew,
    "release": release,
    "status": status,
    "show": show,
    "can-start": can_start,
}


def __getattr__(name: str):
    if name == "app":
        from gitlease.cli.options import bind

        app = bind(globals(), COMMANDS)
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
