"""``git lease plan TASKS``: which queued tasks can start now, what blocks the others; ``--acquire N``."""

from __future__ import annotations

from typing import Annotated

import typer

from gitlease.cli.common import command, service, ttl_seconds
from gitlease.cli.options import JsonOpt, RemoteOpt, make_app

app = make_app()


@app.command("plan")
@command("plan")
def plan_cmd(
    tasks: Annotated[
        str,
        typer.Argument(
            help='JSON lines {"id", "scope": [...]} or {"id", "paths": [...]}, in queue order; \'-\' reads stdin.'
        ),
    ],
    granularity: Annotated[
        str | None,
        typer.Option(help="Scope suggested from a task's paths: auto (default), file, dir, package, depth:N."),
    ] = None,
    acquire: Annotated[
        int,
        typer.Option(
            "--acquire", min=0, help="Take leases for up to N startable tasks (one lease each, the task id recorded)."
        ),
    ] = 0,
    ttl: Annotated[str | None, typer.Option(help="TTL of the leases --acquire takes (default: lease.ttl).")] = None,
    agent: Annotated[str | None, typer.Option(help="Agent id recorded in the leases --acquire takes.")] = None,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Which tasks of the queue can start now (no overlap with active leases or with each other, never ahead
    of an earlier overlapping task), and what blocks each of the others.

    TASKS: a file of JSON lines in queue order, {"id": ..., "scope": [...]} or {"id": ..., "paths": [...]};
    '-' reads stdin. Rules: docs/planning.md."""
    from gitlease.plan.planner import (
        COMPARED_GRANULARITIES,
        blocking_leases,
        plan_queue,
        read_file_rows,
        start_tasks,
        starts_by_granularity,
        tasks_from_rows,
    )
    from gitlease.plan.suggest import parse_granularity, read_tree

    gran = parse_granularity(granularity)
    rows = read_file_rows(tasks, "tasks file")
    svc = service(remote, agent=agent)
    tree = read_tree(svc.repo.cwd)
    queue = tasks_from_rows(rows, granularity=gran, tree=tree)
    the_plan, snap = plan_queue(svc, queue)
    leases = blocking_leases(snap, svc.clock.now(), svc.settings.skew)
    compared = [*COMPARED_GRANULARITIES, *([str(gran)] if str(gran) not in COMPARED_GRANULARITIES else [])]
    by_gran = starts_by_granularity(rows, leases, tree, compared)
    started = start_tasks(svc, the_plan, acquire, ttl=ttl_seconds(ttl)) if acquire else []
    result = dict(
        the_plan.to_json(),
        granularity=str(gran),
        startByGranularity=by_gran,
        store=svc.store.name,
        leases=len(snap.leases),
        acquired=[s.to_json() for s in started],
    )
    scope_of = {t.id: " ".join(t.scope) for t in queue}
    lines_out = [f"start: {tid}  {scope_of[tid]}" for tid in the_plan.start]
    lines_out += [f"blocked: {b.id}  {scope_of[b.id]}  by {' '.join(b.by)}" for b in the_plan.blocked]
    lines_out += [
        f"oversized: {t.id}  {t.asked} paths: {t.oversized}; "
        + (
            f"a scope that fits: {' '.join(t.proposed)}"
            if t.proposed
            else f"leasing the coarser {len(t.scope)}-path scope instead"
        )
        for t in queue
        if t.oversized
    ]
    if not queue:
        lines_out.append("no tasks")
    else:
        lines_out.append("could start now by granularity: " + ", ".join(f"{g} {n}" for g, n in by_gran.items()))
    for s in started:
        if s.ok:
            lines_out.append(f"lease acquired: {s.lease_id} for {s.id}")
        else:
            lines_out.append(f"refused: {s.id}: {s.error}")
    return result, lines_out
