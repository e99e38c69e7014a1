"""Sweeping commands: sweep-stale (alias sweep), log, and ci install."""

from __future__ import annotations

from typing import Annotated

import typer

from gitlease.cli.common import command, service
from gitlease.cli.options import JsonOpt, RemoteOpt, make_app
from gitlease.core import errors

app = make_app()
ci_app = make_app(help="CI jobs that sweep stale leases on a schedule.")
app.add_typer(ci_app, name="ci", help="CI jobs that sweep stale leases on a schedule (ci install github|gitlab).")


@command("sweep-stale")
def sweep_stale(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be reclaimed and why; change nothing.")
    ] = False,
    force: Annotated[
        str | None, typer.Option(metavar="LEASE", help="Reclaim this lease whatever its state (admin only, audited).")
    ] = None,
    limit: Annotated[int, typer.Option(help="Reclaim at most this many leases in this run (0: no limit).")] = 0,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Reclaim stale leases (expired beyond lease.skew, heartbeat missed twice, holder process gone on this
    host, progress stalled): each by one atomic CAS delete of exactly its refs, audited in the same push."""
    from gitlease.ops.sweep import Sweeper

    svc = service(remote)
    sweeper = Sweeper(svc)
    if force:
        if dry_run:
            raise errors.UsageError("--dry-run and a forced reclaim do not go together")
        results = [sweeper.force(force)]
        examined = 1
    else:
        got = sweeper.sweep(dry_run=dry_run, limit=max(limit, 0))
        results, examined = got.results, got.examined
    failed = [r for r in results if r.outcome == "failed"]
    doc = {
        "store": svc.store.name,
        "dryRun": dry_run,
        "examined": examined,
        "results": [r.to_json() for r in results],
        "auditRef": svc.audit.ref,
    }
    lines = [r.line() for r in results] or [
        f"nothing to reclaim ({examined} lease{'' if examined == 1 else 's'} examined)"
    ]
    if failed:
        raise errors.GitLeaseError("; ".join(lines), **doc)
    return doc, lines


app.command("sweep-stale")(sweep_stale)
app.command("sweep", help="Alias of sweep-stale.")(sweep_stale)


@app.command("log")
@command("log")
def log(
    since: Annotated[
        str | None,
        typer.Option(
            help="Only events at or after this: a duration back from now "
            "(30m, 2h, 7d), a time (2026-06-22T12:00:00Z; UTC unless it says) or a date (2026-06-22)."
        ),
    ] = None,
    lease: Annotated[str | None, typer.Option(help="Only events of this lease.")] = None,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """The audit log (reclaims, forced releases) with lease history (acquire, renew) where the store keeps it."""
    from gitlease.ops.sweep import history

    if lease is not None:
        from gitlease.core.record import check_lease_id

        check_lease_id(lease)
    svc = service(remote)
    cut = _since(since, svc.clock.now()) if since else None
    events = history(svc, since=cut, lease_id=lease)
    lines = [e.line() for e in events] or ["no events"]
    return {"store": svc.store.name, "events": [e.to_json() for e in events]}, lines


def _since(text: str, now: float) -> float:
    """A duration back from now (30m, 2h, 7d), or a time: 2026-06-22T12:00:00Z, 2026-06-22 12:00 (UTC unless
    an offset is given), or a date alone (its midnight, UTC)."""
    from datetime import UTC, datetime

    from gitlease.core.config import parse_duration

    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    try:
        return now - parse_duration("--since", text)
    except errors.ConfigError:
        raise errors.UsageError(
            f"--since takes a duration (30m, 2h, 7d), a time like 2026-06-22T12:00:00Z or a date like 2026-06-22, "
            f"not {text!r}"
        ) from None


@ci_app.command("install")
@command("ci")
def ci_install(
    kind: Annotated[str, typer.Argument(metavar="github|gitlab", help="Which CI to install the sweep job for.")],
    install: Annotated[
        str | None, typer.Option(help="What the job installs with pip (default: gitlease==<this version>).")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing, different file.")] = False,
    job: Annotated[
        list[str] | None,
        typer.Option(
            "--job",
            help="sweep (the scheduled sweep, the default) or verify (the pull-request check); repeat for both.",
        ),
    ] = None,
    as_json: JsonOpt = False,
):
    """Write CI jobs into this repository: the scheduled sweep (.github/workflows/gitlease-sweep.yml, or
    .gitlab/gitlease-sweep.yml included from .gitlab-ci.yml) and, with --job verify, the check of every pull
    request against the leases (gitlease-verify.yml). Both install this gitlease, pinned to its commit."""
    from gitlease.core.repo import Repo
    from gitlease.ops.templates import install as do_install

    repo = Repo.discover(".")
    if repo.worktree is None:
        raise errors.UsageError("ci install needs a work tree (this repository is bare)")
    written: list[str] = []
    unchanged: list[str] = []
    steps: list[str] = []
    for one in dict.fromkeys(job or ["sweep"]):
        got = do_install(repo.worktree, kind, install_spec=install, overwrite=overwrite, job=one)
        written += got.written
        unchanged += got.unchanged
        steps += [s for s in got.next_steps if s not in steps]
    lines = [f"wrote: {p}" for p in written] + [f"up to date: {p}" for p in unchanged]
    lines += [f"next: {s}" for s in steps]
    return {"kind": kind, "written": written, "unchanged": unchanged, "nextSteps": steps}, lines
