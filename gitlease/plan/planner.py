"""The planner: which queued tasks can start now, and what blocks the others.

The rules (docs/planning.md):

1. Tasks are considered in queue order. A task's scope is what it names (``"scope"``), or a scope suggested
   from its ``"paths"`` at the chosen granularity (``gitlease.plan.suggest``).
2. A task can start when its scope overlaps no blocking lease and no *earlier* task of the queue, whether
   that earlier task starts now or waits. Blocking leases are the active ones, those expired but still within
   the skew margin, and every invalid one (fail closed): everything but the cleanly expired.
3. So a task may jump ahead of earlier tasks it does not overlap, but never ahead of an earlier task it
   overlaps, even one that is itself blocked: the earlier one keeps its place for those paths and cannot be
   starved by a stream of later tasks that keep taking them first. Tasks that start together are pairwise
   disjoint.
4. For each task that cannot start, ``by`` lists what blocks it: the overlapping leases (ids, in store order)
   and then the overlapping earlier tasks (ids, in queue order).

``plan()`` is pure (leases in, decisions out) and uses two ``PathIndex`` tries, so each task costs the depth
of its paths and the size of its answer, not the number of leases. ``plan_queue`` / ``start_tasks`` compose a
``LeaseService`` for queue workers; ``start_tasks`` takes one lease per task and reports each refusal (another
agent may take a scope between the read and the write: the lease store's compare-and-swap decides).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gitlease.core import scope as scopes
from gitlease.core.errors import GitLeaseError, HeldError, UsageError
from gitlease.core.pathindex import PathIndex
from gitlease.plan.suggest import (
    Granularity,
    QueueIndex,
    RepoTree,
    fitting,
    lease_problem,
    parse_granularity,
    suggest,
)


@dataclass(frozen=True)
class Task:
    id: str
    scope: tuple[str, ...]  # normalised, minimal: what would be leased
    paths: tuple[str, ...] = ()  # as given (empty when the task named its scope)
    suggested: bool = False  # the scope was suggested from paths
    oversized: str | None = None  # why no lease could hold the scope named or suggested
    asked: int = 0  # with ``oversized``: how many paths that scope had
    proposed: tuple[str, ...] = ()  # with ``oversized``, for a named scope (kept as named): one that fits

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "scope": list(self.scope), "suggested": self.suggested}
        if self.oversized:
            out["oversized"] = {"paths": self.asked, "problem": self.oversized, "proposed": list(self.proposed)}
        return out


@dataclass(frozen=True)
class Blocked:
    id: str
    leases: tuple[str, ...] = ()  # blocking lease ids
    tasks: tuple[str, ...] = ()  # earlier overlapping task ids

    @property
    def by(self) -> tuple[str, ...]:
        return self.leases + self.tasks

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "by": list(self.by), "leases": list(self.leases), "tasks": list(self.tasks)}


@dataclass(frozen=True)
class Plan:
    start: tuple[str, ...]  # task ids that can start now, in queue order, pairwise disjoint
    blocked: tuple[Blocked, ...]  # in queue order
    deferred: tuple[str, ...] = ()  # not considered: the scan stopped at ``limit`` startable tasks
    tasks: dict[str, Task] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "start": list(self.start),
            "blocked": [b.to_json() for b in self.blocked],
            "deferred": list(self.deferred),
            "scopes": {tid: list(t.scope) for tid, t in self.tasks.items()},
            "oversized": [
                {"id": tid, "paths": t.asked, "problem": t.oversized, "scope": list(t.proposed or t.scope)}
                for tid, t in self.tasks.items()
                if t.oversized
            ],
        }


# ------------------------------------------------------------------------------ tasks


def make_task(
    tid: str,
    *,
    scope: Iterable[str] | None = None,
    paths: Iterable[str] | None = None,
    granularity: Granularity | str | None = None,
    tree: RepoTree | None = None,
    queue: QueueIndex | None = None,
    position: int = -1,
) -> Task:
    """A task from an explicit scope, or from paths through suggestion (``tree`` needed for package/auto;
    ``queue`` and ``position``, the queue the task is part of and its place there, let ``auto`` lease a folder
    whole only where no nearby task of the queue works: ``gitlease.plan.suggest.QueueIndex``)."""
    if scope is not None:
        return _fitted(Task(tid, scopes.normalize_all(scope), tuple(paths or ()), suggested=False))
    if paths is None:
        raise UsageError(f"task {tid} has neither scope nor paths")
    ps = tuple(paths)
    got = suggest(ps, granularity, tree or RepoTree.from_paths(()), queue=queue, position=position)
    return _fitted(Task(tid, got, ps, suggested=True))


def _fitted(task: Task) -> Task:
    """``task`` as it is when one lease can hold its scope; else flagged (``oversized``: why not) with the
    coarser scope that fits (``suggest.fitting``): a task no lease could hold would never start. A suggested
    scope is replaced by it (the granularity was the planner's choice); a scope the task names is kept and the
    fitting one ``proposed`` (``git lease work`` refuses such a line at load, naming it)."""
    problem = lease_problem(task.scope)
    if problem is None:
        return task
    fits = fitting(task.scope)
    if task.suggested:
        return replace(task, scope=fits, oversized=problem, asked=len(task.scope))
    return replace(task, oversized=problem, asked=len(task.scope), proposed=fits)


@dataclass(frozen=True)
class QueueRow:
    """One task line of a queue file, checked: its id, its scope or paths, and the whole object (``prompt`` and
    any other field a runner passes on)."""

    id: str
    scope: tuple[str, ...] | None
    paths: tuple[str, ...] | None
    where: str
    obj: dict[str, Any] = field(default_factory=dict, compare=False)

    def names(self) -> tuple[str, ...]:
        """What the task names, normalised: its scope if it gives one, else its paths."""
        return scopes.normalize_all(self.scope if self.scope is not None else self.paths or ())


def read_lines(path: str, what: str) -> tuple[list[str], str]:
    """(the lines of the file at ``path``, or of stdin for ``-``; where they came from). UsageError (exit 2)
    naming ``what`` the file is when it cannot be read or is not UTF-8."""
    if path == "-":
        import sys

        return sys.stdin.read().splitlines(), "stdin"
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines(), path
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8") from None


def read_file_rows(path: str, what: str) -> list[QueueRow]:
    """``read_rows`` of the file at ``path`` (``-``: stdin), ``what`` naming it in errors."""
    lines, source = read_lines(path, what)
    return read_rows(lines, source=source)


def read_rows(lines: Iterable[str], *, source: str = "tasks") -> list[QueueRow]:
    """JSON lines ``{"id", "scope": [...]}`` or ``{"id", "paths": [...]}`` (blank lines and ``#`` comments are
    skipped), checked. Raises UsageError naming the line for anything malformed, an invalid scope or path, or a
    repeated id."""
    out: list[QueueRow] = []
    seen: set[str] = set()
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {n}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{where}: not JSON ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(obj, dict):
            raise UsageError(f'{where}: expected an object with "id" and "scope" or "paths"')
        tid = obj.get("id")
        if isinstance(tid, int) and not isinstance(tid, bool):
            tid = str(tid)
        if not isinstance(tid, str) or not tid:
            raise UsageError(f'{where}: "id" must be a non-empty string')
        if tid in seen:
            raise UsageError(f"{where}: task id {tid!r} appears twice")
        seen.add(tid)
        sc, ps = obj.get("scope"), obj.get("paths")
        for name, val in (("scope", sc), ("paths", ps)):
            if val is not None and (not isinstance(val, list) or not all(isinstance(x, str) for x in val)):
                raise UsageError(f'{where}: "{name}" must be a list of strings')
        if sc is None and ps is None:
            raise UsageError(f'{where}: task {tid!r} has neither "scope" nor "paths"')
        row = QueueRow(tid, tuple(sc) if sc is not None else None, tuple(ps) if ps is not None else None, where, obj)
        try:
            row.names()
        except UsageError as exc:
            raise UsageError(f"{where}: task {tid!r}: {exc.message}") from None
        out.append(row)
    return out


def tasks_from_rows(
    rows: Sequence[QueueRow],
    *,
    granularity: Granularity | str | None = None,
    tree: RepoTree | None = None,
) -> list[Task]:
    """The tasks of checked rows, in queue order; ``auto`` sees the whole queue (``QueueIndex``)."""
    gran = granularity if isinstance(granularity, Granularity) else parse_granularity(granularity)
    queue = QueueIndex(r.names() for r in rows) if gran.kind == "auto" else None
    out: list[Task] = []
    for pos, r in enumerate(rows):
        try:
            out.append(
                make_task(r.id, scope=r.scope, paths=r.paths, granularity=gran, tree=tree, queue=queue, position=pos)
            )
        except UsageError as exc:
            raise UsageError(f"{r.where}: task {r.id!r}: {exc.message}") from None
    return out


def parse_tasks(
    lines: Iterable[str],
    *,
    granularity: Granularity | str | None = None,
    tree: RepoTree | None = None,
    source: str = "tasks",
) -> list[Task]:
    """``read_rows`` then ``tasks_from_rows``: the tasks of a queue file's lines, in queue order."""
    return tasks_from_rows(read_rows(lines, source=source), granularity=granularity, tree=tree)


# ---------------------------------------------------------------------------- planning


def plan(tasks: Sequence[Task], leases: Iterable[tuple[str, Sequence[str]]], *, limit: int | None = None) -> Plan:
    """Decide which tasks start now. ``leases``: (lease id, paths) of every *blocking* lease (see
    ``blocking_leases``). ``limit``: stop once that many tasks can start (the rest are ``deferred``); the
    decisions made up to there are the same as without a limit."""
    held: PathIndex[tuple[str, str], None] = PathIndex()
    for lease_id, paths in leases:
        held.add(("lease", lease_id), paths)
    earlier: PathIndex[tuple[str, str], None] = PathIndex()  # every task already considered, started or blocked
    start: list[str] = []
    blocked: list[Blocked] = []
    by_id: dict[str, Task] = {}
    deferred: list[str] = []
    for i, task in enumerate(tasks):
        if task.id in by_id:
            raise UsageError(f"task id {task.id!r} appears twice in the queue")
        if limit is not None and len(start) >= limit:
            deferred = [t.id for t in tasks[i:]]
            by_id.update((t.id, t) for t in tasks[i:])
            break
        by_id[task.id] = task
        lease_hits = held.overlapping(task.scope)
        task_hits = earlier.overlapping(task.scope)
        if lease_hits or task_hits:
            blocked.append(Blocked(task.id, tuple(k[1] for k in lease_hits), tuple(k[1] for k in task_hits)))
        else:
            start.append(task.id)
        earlier.add(("task", task.id), task.scope)
    return Plan(tuple(start), tuple(blocked), tuple(deferred), by_id)


COMPARED_GRANULARITIES = ("auto", "file", "dir", "package")


def starts_by_granularity(
    rows: Sequence[QueueRow],
    leases: Sequence[tuple[str, Sequence[str]]],
    tree: RepoTree,
    granularities: Iterable[Granularity | str] = COMPARED_GRANULARITIES,
) -> dict[str, int]:
    """How many tasks of the queue could start now at each granularity, against the same blocking leases
    (tasks that name their scope count the same at every granularity)."""
    out: dict[str, int] = {}
    for g in granularities:
        gran = g if isinstance(g, Granularity) else parse_granularity(g)
        out[str(gran)] = len(plan(tasks_from_rows(rows, granularity=gran, tree=tree), leases).start)
    return out


def blocking_leases(snapshot, now: float, skew: int) -> list[tuple[str, tuple[str, ...]]]:
    """(id, paths) of every lease in a ``Snapshot`` that blocks: all but the cleanly expired (invalid ones
    count: fail closed)."""
    return [(v.lease_id, tuple(v.paths)) for v in snapshot.leases if v.state(now, skew) != "expired"]


# -------------------------------------------------------------------- with a lease service


def plan_queue(service, tasks: Sequence[Task], *, limit: int | None = None):
    """Plan against the store's leases as they are now (a fresh read; an unreachable store raises: a stale
    listing could start tasks that are blocked). Returns (Plan, Snapshot)."""
    service.require_store()
    snap = service.snapshot(use_cache=False)
    leases = blocking_leases(snap, service.clock.now(), service.settings.skew)
    return plan(tasks, leases, limit=limit), snap


@dataclass(frozen=True)
class StartResult:
    id: str
    lease_id: str | None = None  # set when the lease was taken
    error: str | None = None  # the refusal or failure message
    kind: str | None = None  # the error's kind (held, remote-unavailable, ...)
    blockers: tuple[str, ...] = ()
    workspace: str | None = None

    @property
    def ok(self) -> bool:
        return self.lease_id is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ok": self.ok,
            "leaseId": self.lease_id,
            "error": self.error,
            "kind": self.kind,
            "blockers": list(self.blockers),
            "workspaceId": self.workspace,
        }


def start_tasks(service, the_plan: Plan, n: int, *, ttl: int | None = None) -> list[StartResult]:
    """Take a lease for each of the first ``n`` startable tasks that can get one (each task its own lease,
    its id recorded as the lease's task). A task refused (someone took an overlapping scope since the plan
    was read) is reported and the next startable task is tried. Stops at the first error that is not a
    refusal (an unreachable store): what was acquired before stays acquired and is reported."""
    from gitlease.service.leases import LeaseService

    results: list[StartResult] = []
    taken = 0
    for tid in the_plan.start:
        if taken >= n:
            break
        task = the_plan.tasks[tid]
        svc = LeaseService(
            service.repo,
            replace(service.settings, task=tid),
            store=service.store,
            clock=service.clock,
            signer=service.signer,
        )
        try:
            got = svc.acquire(task.scope, ttl=ttl)
        except GitLeaseError as exc:
            listed = exc.details.get("blockers")
            blockers = tuple(
                str(b.get("leaseId"))
                for b in (listed if isinstance(listed, list | tuple) else ())
                if isinstance(b, dict)
            )
            results.append(StartResult(tid, error=exc.message, kind=exc.kind, blockers=blockers))
            if not isinstance(exc, HeldError):
                break
            continue
        results.append(StartResult(tid, lease_id=got.lease_id, workspace=got.record.workspace_id))
        taken += 1
    return results


__all__ = [
    "Task",
    "Blocked",
    "Plan",
    "StartResult",
    "QueueRow",
    "make_task",
    "read_rows",
    "read_file_rows",
    "read_lines",
    "tasks_from_rows",
    "parse_tasks",
    "plan",
    "blocking_leases",
    "starts_by_granularity",
    "COMPARED_GRANULARITIES",
    "plan_queue",
    "start_tasks",
]
