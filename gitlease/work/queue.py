"""The queue of ``git lease work``: JSON lines, one task each (docs/work.md, "The queue").

``{"id": "t1", "paths": ["src/a.py"], "prompt": "..."}``: ``id`` (a non-empty string, unique), ``paths`` (what
the task will change) or ``scope`` (what to lease; given, it wins), and any other fields, passed through to the
command (stdin and ``$GITLEASE_TASK_FILE``). The scope of a task with only ``paths`` is suggested at the
chosen granularity (gitlease.plan.suggest). Parsing and validation are the planner's (``parse_tasks``).

Tasks may also come from Python: an iterable of dicts (or ``WorkTask``), or a callback returning the tasks
queued now (``TaskSource``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gitlease.core.errors import UsageError
from gitlease.core.refnames import encode_segment
from gitlease.plan.planner import Task, parse_tasks
from gitlease.plan.suggest import Granularity, RepoTree

MAX_ID_BYTES = 200  # a task id is one ref component (refs/leases/task/<id>): keep it well under git's limits


@dataclass(frozen=True)
class WorkTask:
    id: str
    scope: tuple[str, ...]
    paths: tuple[str, ...] = ()
    doc: dict[str, Any] = field(default_factory=dict, compare=False)  # the queue line as given

    def plan_task(self) -> Task:
        return Task(self.id, self.scope, self.paths, suggested=not self.doc.get("scope"))

    def to_json(self) -> dict[str, Any]:
        """What the command reads: the queue line, with the scope that was leased."""
        return dict(self.doc, id=self.id, scope=list(self.scope), paths=list(self.paths))

    @property
    def digest(self) -> str:
        """The task's content hash, recorded with its outcome: the queue line as given (its id included)."""
        from gitlease.service.outcomes import digest

        return digest(dict(self.doc, id=self.id))


def parse_queue(
    lines: Iterable[str],
    *,
    granularity: Granularity | str | None = None,
    tree: RepoTree | None = None,
    source: str = "queue",
) -> list[WorkTask]:
    """The queue's tasks in order (UsageError naming the line for anything malformed)."""
    lines = list(lines)
    tasks = parse_tasks(lines, granularity=granularity, tree=tree, source=source)
    docs = []
    for raw in lines:
        line = raw.strip()
        if line and not line.startswith("#"):
            docs.append(json.loads(line))
    numbers = [n for n, raw in enumerate(lines, 1) if raw.strip() and not raw.strip().startswith("#")]
    out = []
    for task, doc, number in zip(tasks, docs, numbers):
        where = f"{source}: line {number}: task {task.id!r}"
        check_id(task.id, where)
        check_scope(task.scope, where)
        out.append(WorkTask(task.id, task.scope, task.paths, doc))
    return out


def check_id(tid: str, where: str) -> None:
    """A task id the store can name: refused at load (with its line), never retried at every planning step."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in tid):
        raise UsageError(f"{where}: the id holds a control character (a newline, a NUL...)")
    if len(encode_segment(tid)) > MAX_ID_BYTES:
        raise UsageError(f"{where}: the id is too long (at most {MAX_ID_BYTES} bytes once encoded for a ref name)")
    from gitlease.core.refnames import outcome_ref, quarantine_ref, task_ref

    for ref in (task_ref(tid), outcome_ref(tid), quarantine_ref(tid, 1)):
        why = ref_name_problem(ref)
        if why:
            raise UsageError(f"{where}: the id cannot name a ref ({ref}: {why}); choose another id")


def check_scope(scope: tuple[str, ...], where: str) -> None:
    """A scope one lease can hold (the record's path limit), refused at load rather than at every claim."""
    from gitlease.core.record import MAX_PATHS

    if len(scope) > MAX_PATHS:
        raise UsageError(
            f"{where}: its scope has {len(scope)} paths, over the limit of {MAX_PATHS} per lease; give it a "
            'coarser "scope" (folders), or split it (git lease plan shows what fits)'
        )


def ref_name_problem(ref: str) -> str | None:
    """Why git would refuse ``ref`` as a ref name (git check-ref-format's rules), or None."""
    if "\\" in ref or any(c in ref for c in " ~^:?*[") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in ref):
        return "a space, a control character or one of ~^:?*[\\"
    if ".." in ref or "@{" in ref or ref.endswith((".", "/")) or ref == "@" or "//" in ref:
        return "'..', '@{', '//' or a trailing '.' or '/'"
    for part in ref.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f"a component starting with '.' or ending in '.lock' ({part!r})"
    return None


def from_items(
    items: Iterable[Any], *, granularity: Granularity | str | None = None, tree: RepoTree | None = None
) -> list[WorkTask]:
    """Tasks from Python: WorkTask values pass; dicts are read as queue lines are."""
    out: list[WorkTask] = []
    lines: list[str] = []
    for item in items:
        if isinstance(item, WorkTask):
            out.append(item)
        elif isinstance(item, dict):
            lines.append(json.dumps(item))
        else:
            raise UsageError(f"a task must be a dict or a WorkTask, not {type(item).__name__}")
    parsed = parse_queue(lines, granularity=granularity, tree=tree, source="tasks")
    seen = {t.id for t in out}
    for t in parsed:
        if t.id in seen:
            raise UsageError(f"task id {t.id!r} appears twice")
    return out + parsed


class TaskSource:
    """Where a runner gets its queue: ``tasks()`` is read at every planning step (a callback may add tasks
    while the runner works; the queue is done when every task it returned has an outcome and ``more()`` is
    false)."""

    def __init__(
        self,
        fetch: Callable[[], Iterable[Any]] | None = None,
        *,
        fixed: list[WorkTask] | None = None,
        granularity: Granularity | str | None = None,
        tree: RepoTree | None = None,
        more: Callable[[], bool] | None = None,
    ) -> None:
        self._fetch, self._fixed, self._gran, self._tree = fetch, fixed, granularity, tree
        self._more = more
        self._known: dict[str, WorkTask] = {t.id: t for t in fixed or []}
        self._order: list[str] = [t.id for t in fixed or []]

    def tasks(self) -> list[WorkTask]:
        if self._fetch is not None:
            for t in from_items(list(self._fetch()), granularity=self._gran, tree=self._tree):
                if t.id not in self._known:
                    self._known[t.id] = t
                    self._order.append(t.id)
        return [self._known[i] for i in self._order]

    def more(self) -> bool:
        """True while a callback source may still add tasks."""
        return bool(self._more and self._more())


__all__ = ["WorkTask", "TaskSource", "parse_queue", "from_items", "check_id", "check_scope", "ref_name_problem"]
