"""Set-up commands: ``doctor`` (can this remote host leases?) and ``budget`` (how many pushes a fleet makes)."""

from __future__ import annotations

import signal
from typing import Annotated

import typer

from gitlease.cli.common import command, run, seconds
from gitlease.cli.options import JsonOpt, RemoteOpt, make_app

app = make_app()


@app.command()
def doctor(
    remote: RemoteOpt = None,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            help="Rounds of the concurrency probe (4 racing pushes each): more rounds rule out rarer races "
            "(30: a race in more than 15% of rounds shows with 99% confidence).",
        ),
    ] = 30,
    as_json: JsonOpt = False,
) -> None:
    """Probe the lease store with throw-away refs under refs/leases/doctor/ and check this set-up.

    Each check prints pass, fail, warn or skip with a one-line explanation. Exit 1 when any check fails (the
    remote cannot safely host leases, git is too old, or the configured key is unreadable); warnings do not
    change the exit code. The probe refs are deleted afterwards, also on failure and interrupt."""

    def body():
        from gitlease.core.config import resolve
        from gitlease.core.errors import DoctorFailed
        from gitlease.core.repo import Repo
        from gitlease.ops.doctor import diagnose

        repo = Repo.discover(".")
        settings = resolve(repo.config, remote=remote)
        if not as_json:
            typer.echo(f"gitlease doctor: {settings.remote or 'local store (this repository)'}")
        report = diagnose(repo, settings, on_check=None if as_json else lambda c: typer.echo(c.line()), rounds=rounds)
        result = report.to_json()
        if not report.ok:
            names = ", ".join(c.name for c in report.failed())
            raise DoctorFailed(
                f"{len(report.failed())} check(s) failed ({names}): {report.store} cannot safely host leases as set up",
                **result,
            )
        warns = sum(1 for c in report.checks if c.status == "warn")
        return result, [f"ok: {report.store} can host leases" + (f" ({warns} warning(s))" if warns else "")]

    previous = signal.signal(signal.SIGTERM, _interrupt)  # so the probe refs are cleaned up on SIGTERM too
    try:
        run("doctor", as_json, body)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@app.command()
@command("budget")
def budget(
    agents: Annotated[int, typer.Option(help="Agents holding leases at once.")] = 10,
    hosts: Annotated[
        int, typer.Option(help="Machines they run on (one renewal push per host per interval with batched renewals).")
    ] = 1,
    ttl: Annotated[str | None, typer.Option(help="Lease time to live: 300, 5m (default: lease.ttl or 300).")] = None,
    renew_every: Annotated[str | None, typer.Option(help="Renewal interval (default: half the TTL).")] = None,
    tasks_per_hour: Annotated[
        float, typer.Option(help="Tasks each agent starts per hour (each costs an acquire and a release).")
    ] = 2.0,
    limit: Annotated[float, typer.Option(help="The host's recommended pushes per minute (GitHub: 6).")] = 6.0,
    as_json: JsonOpt = False,
):
    """Pushes per minute a fleet makes on the lease remote, against the host's recommendation, and the largest
    fleet that fits: each holder renewing its own lease, and one renewal push per host (the per-host renewal
    agent, the default of hold() and git lease run)."""
    from gitlease.core.config import DEFAULT_TTL
    from gitlease.ops.budget import Fleet, plan

    ttl_s = seconds("--ttl", ttl, 5) if ttl is not None else _configured_ttl(DEFAULT_TTL)
    every = seconds("--renew-every", renew_every, 1) if renew_every is not None else None
    result = plan(Fleet(agents=agents, hosts=hosts, ttl=ttl_s, renew_every=every, tasks_per_hour=tasks_per_hour), limit)
    return result.to_json(), result.lines()


def _configured_ttl(default: int) -> int:
    try:
        from gitlease.core.config import resolve
        from gitlease.core.repo import Repo

        return resolve(Repo.discover(".").config).ttl
    except Exception:  # outside a repository: the default
        return default
