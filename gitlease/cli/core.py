"""The core commands: acquire, renew, release, status, show, can-start.

Written without importing typer, so that the fast path (``gitlease.cli.fast``) can run them on a well-formed
command line without loading typer and click (most of a command's start-up). The typer definitions below are
the only definition of these commands: their annotations are strings (``from __future__ import annotations``)
that only typer reads, when ``app`` (help, usage errors, the man page, completion) is built on first use by
``options.bind``; the fast path's table of options, ``gitlease/cli/fastspec.py``, is generated from that app
(``python -m gitlease.cli.fast``) and a test fails when it is out of date.

Each command returns ``(result, lines)``; ``@command`` (``cli/common.py``) renders them, or the error, and exits.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gitlease.cli.common import command, echo, seconds, service, ttl_seconds
from gitlease.core import errors
from gitlease.core.clock import iso
from gitlease.core.jsontext import Raw

if TYPE_CHECKING:  # the names the annotations use: put here at run time by options.bind
    from typing import Annotated

    import typer

    from gitlease.cli.options import JsonOpt, LeaseArg, RemoteOpt, ScopeOpt


# ----------------------------------------------------------------------------- commands


@command("acquire")
def acquire(
    scope: ScopeOpt,
    task: Annotated[str | None, typer.Option(help="Task id (default: $GITLEASE_TASK).")] = None,
    agent: Annotated[str | None, typer.Option(help="Agent id (default: $GITLEASE_AGENT, lease.agent).")] = None,
    ttl: Annotated[str | None, typer.Option(help="Time to live: 300, 300s, 5m (default: lease.ttl, 300).")] = None,
    workspace: Annotated[str | None, typer.Option(help="Workspace id recorded in the lease.")] = None,
    holder_pid: Annotated[
        int,
        typer.Option(
            help="Pid of the process that holds the lease: the sweeper reclaims the lease once that process "
            "is gone (same host; default: none)."
        ),
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
):
    """Lease path prefixes. Refused with exit 3, naming the holder, when another lease overlaps."""
    from gitlease.core import scope as scopes
    from gitlease.liveness.wait import obtain
    from gitlease.service.verdict import doctor_gate

    paths = scopes.normalize_all(scope)
    svc = service(remote, task=task, agent=agent)
    manager, args = _acquire_args(svc, ttl, holder_pid, workspace, replace, worktree, base, branch)
    doctor_gate(svc)  # before waiting: no passing doctor verdict for this server warns, or refuses (exit 1)
    got, att = obtain(
        svc,
        paths,
        wait=seconds("--wait", wait) if wait is not None else None,
        on_wait=lambda refusal, pause: echo(f"git-lease: waiting ({pause:.1f}s): {refusal.message}", err=True),
        worktree=manager,
        **args,
    )
    return _acquired(svc, got, att, replace)


def _acquire_args(svc, ttl, holder_pid: int, workspace, replace, worktree: bool, base, branch):
    """(the WorktreeManager with --worktree, else None; the acquire's arguments), the flags checked together."""
    from gitlease.core import record as records

    args: dict = dict(ttl=ttl_seconds(ttl), holder_pid=holder_pid, workspace=workspace)
    if replace:
        if worktree:
            raise errors.UsageError(
                "--replace and --worktree do not go together (a worktree's lease is released from inside it)"
            )
        args["replace"] = records.check_lease_id(replace)
    if not worktree:
        if base or branch:
            raise errors.UsageError("--base and --branch need --worktree")
        return None, args
    if workspace:
        raise errors.UsageError("--workspace and --worktree do not go together: the worktree's id is the workspace")
    from gitlease.worktree.manager import WorktreeManager

    return WorktreeManager(svc), dict(ttl=args["ttl"], holder_pid=holder_pid, base=base, branch=branch)


def _acquired(svc, got, att, replace):
    """What ``acquire`` says: its warnings (on stderr), its lines and its JSON."""
    rec = got.record
    warnings = svc.warnings + _untracked_warnings(svc, rec.paths)
    for line in warnings:
        echo(f"git-lease: warning: {line}", err=True)
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
        "warnings": warnings,
    }
    if att is not None:
        from gitlease.cli.worktree import attached_lines

        lines += attached_lines(att)
        result["worktree"] = att.to_json()
    return result, lines


def _untracked_warnings(svc, paths) -> list[str]:
    """A scope that names nothing in this repository (a typo: ``servics/billing``) is granted, and said."""
    from gitlease.core.repo import absent_paths

    missing = absent_paths(svc.repo, paths)
    return [
        f"scope {_quote(p)} matches no path in HEAD or the work tree (a typo?); it is leased all the same"
        for p in missing
    ]


@command("renew")
def renew(
    lease_id: LeaseArg,
    ttl: Annotated[str | None, typer.Option(help="New time to live (default: the lease's own).")] = None,
    progress: Annotated[str | None, typer.Option(help="A short progress note recorded in the lease.")] = None,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Extend a lease this worktree holds. Exit 6 ("lease lost or replaced") is a stop signal."""
    lifetime = ttl_seconds(ttl)
    got = service(remote).renew(lease_id, ttl=lifetime, progress=progress)
    rec = got.record
    return (
        {"leaseId": got.lease_id, "version": rec.version, "expiresAt": rec.expires_at},
        [f"lease renewed: version={rec.version} expiresAt={rec.expires_at}"],
    )


@command("release")
def release(
    lease_id: Annotated[
        str | None, typer.Argument(help="The lease id (lease_...); none with --all.", show_default=False)
    ] = None,
    all_: Annotated[
        bool,
        typer.Option("--all", help="Release every lease this worktree holds (a restarted agent's clean-up)."),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Release a lease this worktree does not hold, live or invalid: admin only, audited."
        ),
    ] = False,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Give a lease back (its worktree stays), recorded in the audit log in the same push. A lease already gone
    (released before, or reclaimed) is not an error: "already released". With --all every lease is tried and
    reported ("not released: ID: why" for those that failed), and the exit code is the worst failure's (1: one
    is still held, the store unreachable or refusing; 5: invalid; 6: lost meanwhile)."""
    if all_ == (lease_id is not None):
        raise errors.UsageError("give a lease id, or --all (every lease this worktree holds), not both")
    svc = service(remote)
    if force:
        if all_:
            raise errors.UsageError("--force takes one lease id, not --all")
        from gitlease.core import record as records
        from gitlease.ops.sweep import Sweeper

        got = Sweeper(svc).force(records.check_lease_id(lease_id), action="force-release")
        if got.outcome != "reclaimed":
            raise errors.GitLeaseError(f"forced release of {lease_id} did not happen: {got.line()}", **got.to_json())
        return (
            dict(got.to_json(), auditRef=svc.audit.ref),
            [f"lease released: {lease_id}", f"audited: {got.reason} in {svc.audit.ref}"],
        )
    ids = (
        [lease_id]
        if lease_id is not None
        else sorted(h.lease_id for h in svc.held_here().values() if h.store == svc.store.name)
    )
    if not all_:
        got = svc.release(ids[0])
        line = f"already released: {ids[0]} ({got.note})" if got.already else f"lease released: {ids[0]}"
        return {"leaseId": ids[0], "already": got.already, "note": got.note, "audit": got.audit}, [line]
    return _release_all(svc, ids, as_json)


# Which failure of ``release --all`` decides its exit code: a lease still held (the store unreachable, a refusal)
# is worse than an invalid one, and that worse than one lost meanwhile (nothing left to give back).
_RELEASE_SEVERITY = {errors.LOST: 1, errors.INVALID: 2}


def _release_all(svc, ids: list[str], as_json: bool):
    """Every lease this worktree holds released, each reported; the exit code of the worst failure."""
    done, failed, lines = [], [], []
    for lid in ids:
        try:
            got = svc.release(lid)
        except errors.GitLeaseError as exc:
            failed.append((lid, exc))
            done.append({"leaseId": lid, "released": False, "error": exc.message, "exitCode": exc.exit_code})
            lines.append(f"not released: {lid}: {exc.message}")
            continue
        done.append({"leaseId": lid, "released": True, "already": got.already, "note": got.note, "audit": got.audit})
        lines.append(f"already released: {lid} ({got.note})" if got.already else f"lease released: {lid}")
    if not failed:
        return {"released": done}, lines or ["no leases held by this worktree"]
    if not as_json:
        for line in lines:
            echo(line)
    worst = max(failed, key=lambda f: _RELEASE_SEVERITY.get(f[1].exit_code, 3))[1]
    n = len(failed)
    err = errors.GitLeaseError(
        f"{n} of {len(ids)} lease{'s' if len(ids) != 1 else ''} not released (the others were): {worst.message}",
        released=done,
    )
    err.exit_code, err.kind = worst.exit_code, worst.kind
    raise err


@command("progress")
def progress(
    note: Annotated[str, typer.Argument(help="A short note, e.g. 'tests 40/120' (its first number is the counter).")],
    lease: Annotated[
        str | None, typer.Option("--lease", help="The lease (default: $GITLEASE_LEASE, or the only one held here).")
    ] = None,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Report progress. Inside `git lease run`: for the run's lease, sent with its next renewal (and what
    lease.progressTimeout measures); exit 6 once that lease is lost or past its stop deadline: stop, write
    nothing. Elsewhere: renew the lease now, with the note."""
    import os

    from gitlease.core import record as records

    if not note.strip():
        raise errors.UsageError("git lease progress needs a note, e.g. git lease progress 'tests 40/120'")
    path = os.environ.get("GITLEASE_PROGRESS_FILE")
    lease_id = lease or os.environ.get("GITLEASE_LEASE")
    if lease_id is not None:
        records.check_lease_id(lease_id)
    if path and lease_id and lease_id == os.environ.get("GITLEASE_LEASE"):
        from gitlease.core.clock import SYSTEM
        from gitlease.liveness.supervise import report_progress

        stop = report_progress(path, lease_id, note, SYSTEM.now())
        return (
            {"leaseId": lease_id, "note": note, "sent": "with the next renewal", "stopBy": iso(stop)},
            [f"progress: {note} (sent with the next renewal of {lease_id})"],
        )
    svc = service(remote)
    if lease_id is None:
        held = [h.lease_id for h in svc.held_here().values() if h.store == svc.store.name]
        if len(held) != 1:
            raise errors.UsageError(
                "name the lease: --lease ID (this worktree holds "
                + (f"{len(held)} leases)" if held else "no lease on the lease store)")
            )
        lease_id = held[0]
    got = svc.renew(lease_id, progress=note)
    rec = got.record
    return (
        {"leaseId": lease_id, "note": note, "version": rec.version, "expiresAt": rec.expires_at},
        [f"lease renewed: version={rec.version} expiresAt={rec.expires_at} progress: {note}"],
    )


_MARKS = {"verified": "", "unsigned": " [unsigned]", "untrusted": " [signed, unverified: no trust file]"}


def _invalid(problems) -> str:
    return f"  INVALID (scope stays blocked; only a gitlease-admin key can clear it): {'; '.join(problems)}"


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")


def _quote(path: str) -> str:
    """A scope as a shell would need it (``'my dir/x'``); plain ones as they are (shlex only when needed)."""
    if path and all(c in _PLAIN for c in path):
        return path
    import shlex

    return shlex.quote(path)


def _scope_text(paths) -> str:
    return " ".join(_quote(p) for p in paths)


def _time_text(state: str, left: int) -> str:
    """ "active 120s left", "expired 105s ago", "grace: expired 5s ago" (within the skew margin: still blocks)."""
    if left > 0:
        return f"{state} {left}s left"
    return ("grace: " if state == "grace" else "") + f"expired {-left}s ago"


def _snapshot_lines(snap, now: float, skew: int, held=()) -> list[str]:
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
        here = "  [held here]" if v.lease_id in held else ""
        if v.record is None:
            lines.append(f"{v.lease_id}  {_scope_text(v.paths)}" + _invalid(v.problems or ["unreadable"]) + here)
            continue
        r = v.record
        flag = _invalid(v.problems) if v.problems else ""
        lines.append(
            f"{v.lease_id}  {_scope_text(r.paths)}  task={r.owner.task_id} agent={r.owner.agent_id}  "
            f"{_time_text(st, int(r.expires - now))}  v{r.version}{mark}{flag}{here}"
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


def leases_json(views, now: float, skew: int, held) -> Raw:
    """``status --json``'s array of leases (views.leases_json_text), put in the document as written."""
    from gitlease.service.views import leases_json_text

    return Raw(leases_json_text(views, now, skew, set(held)))


@command("status")
def status(
    mine: Annotated[bool, typer.Option("--mine", help="Only the leases this worktree holds.")] = False,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Never answer from the last fetched state: exit 1 when the store cannot be read (for scripts).",
        ),
    ] = False,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Every lease on the store: id, scope, owner, time left; [held here] marks this worktree's. When the store
    cannot be reached it answers from the last fetched state (saying how old it is; "stale": true), or with
    --fresh exits 1."""
    import gc

    gc.disable()  # a process that ends with this command: the collector would only walk its many views again
    svc = service(remote)
    snap = svc.status(use_cache=not fresh)
    now, skew = svc.clock.now(), svc.settings.skew
    held = {k for k, h in svc.held_here().items() if h.store == svc.store.name}
    overlaps = snap.overlaps(now, skew)  # of the whole store: --mine reports those that involve a lease held here
    if mine:
        snap.leases = [v for v in snap.leases if v.lease_id in held]
        overlaps = [(a, b) for a, b in overlaps if a.lease_id in held or b.lease_id in held]
    result = {
        "store": svc.store.name,
        "stale": snap.stale,
        "fetchedAt": iso(snap.fetched_at),
        "error": snap.error,
        "trust": snap.trust,
        "signed": snap.signed_store,
        "leases": leases_json(snap.leases, now, skew, held) if as_json or overlaps else [],  # JSON only
        "foreign": snap.foreign,
    }
    lines = []  # --json prints the result only
    if not as_json:
        lines = _snapshot_lines(snap, now, skew, held)
        lines += [f"foreign ref (not a lease; it blocks nothing): {ref}" for ref in snap.foreign]
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


def _gone(svc, lease_id: str) -> str:
    """Why ``show`` finds no lease: the audit log says how it left (released, reclaimed: by whom and when)."""
    note = svc.gone_note(lease_id)
    if note:
        return f"lease {lease_id} is gone from store {svc.store.name}: {note}; see 'git lease log --lease {lease_id}'"
    return f"no lease {lease_id} on store {svc.store.name}, and no trace of it in the audit log (a typo?)"


@command("show")
def show(lease_id: LeaseArg, remote: RemoteOpt = None, as_json: JsonOpt = False):
    """One lease in full: its record, its history, and whether each version verifies."""
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


@command("can-start")
def can_start(scope: ScopeOpt, remote: RemoteOpt = None, as_json: JsonOpt = False):
    """Read-only: exit 0 if the scope is free now, 3 if not (naming the blockers)."""
    from gitlease.service.views import held_error

    svc = service(remote)
    paths, blockers, _ = svc.can_start(scope)
    if blockers:
        raise held_error(paths, blockers, svc.clock.now(), svc.settings.skew)
    return {"paths": list(paths), "free": True}, [f"free: {' '.join(paths)}"]


# The commands of this module, by name (the fast path calls them; ``app`` registers them for typer).
COMMANDS = {
    "acquire": acquire,
    "renew": renew,
    "progress": progress,
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
