"""``git lease work QUEUE -- COMMAND``: the queue runner (docs/work.md); ``git lease work --status QUEUE``."""

from __future__ import annotations

import json
import sys
import threading
from typing import Annotated

import typer

from gitlease.cli.common import command, echo, seconds, ttl_seconds
from gitlease.cli.options import JsonOpt, RemoteOpt, make_app
from gitlease.core import errors
from gitlease.core.jsontext import text_only

app = make_app()


QueueArg = Annotated[
    str | None, typer.Argument(help='JSON lines {"id", "paths": [...] or "scope": [...], ...} in queue order.')
]
CommandArgs = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[-- COMMAND...]",
        help="Run in each task's worktree; {id} and {path} are expanded; the task JSON is on stdin.",
    ),
]
WorkersOpt = Annotated[int, typer.Option(min=1, help="Tasks run at the same time (default 1).")]
VerifyOpt = Annotated[
    str | None, typer.Option(help="A shell command run in the worktree after COMMAND; non-zero re-queues.")
]
LandOpt = Annotated[
    str | None,
    typer.Option(help="Land each task on this branch (rebase, fenced push; default: its own branch work/<id>)."),
]
AttemptsOpt = Annotated[int, typer.Option(min=1, help="Attempts per task before it is failed (default 3).")]
GranularityOpt = Annotated[
    str | None, typer.Option(help="Scope suggested from a task's paths: auto (default), file, dir, package, depth:N.")
]
StatusFlag = Annotated[
    bool, typer.Option("--status", help="Show every task's state, attempts and kept work; run nothing.")
]
TtlOpt = Annotated[str | None, typer.Option(help="TTL of the tasks' leases (default: lease.ttl).")]
BackoffOpt = Annotated[
    str | None, typer.Option(help="Wait before a failed task's next attempt, doubling each time (default 5s).")
]
AgentOpt = Annotated[str | None, typer.Option(help="Agent id in the leases (default: $GITLEASE_AGENT).")]
RerunOpt = Annotated[
    list[str] | None,
    typer.Option(help="Run this task again although it is done or failed on the store (recorded); repeatable."),
]
TaskTimeoutOpt = Annotated[
    str | None,
    typer.Option(help="Stop a task's command (and verifier) after this long: 30m (default: lease.taskTimeout)."),
]
AllowExtendFlag = Annotated[
    bool, typer.Option("--allow-extend", help="Land what a task's lease was extended to, beyond the task's own scope.")
]
PruneOpt = Annotated[
    str | None,
    typer.Option(
        help="Delete the outcomes (and parked work) of tasks finished longer ago than this (30d; '' for "
        "lease.pruneAfter, default 30d), audited; run nothing."
    ),
]


@app.command("work")
@command("work")
def work(
    queue: QueueArg = None,
    cmd: CommandArgs = None,
    workers: WorkersOpt = 1,
    verify: VerifyOpt = None,
    land: LandOpt = None,
    attempts: AttemptsOpt = 3,
    granularity: GranularityOpt = None,
    status: StatusFlag = False,
    ttl: TtlOpt = None,
    backoff: BackoffOpt = None,
    agent: AgentOpt = None,
    rerun: RerunOpt = None,
    task_timeout: TaskTimeoutOpt = None,
    allow_extend: AllowExtendFlag = False,
    prune: PruneOpt = None,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Run a queue of tasks to landed commits: each worker claims the next startable task (its scope and the
    task itself, in one atomic push), runs COMMAND in a clean worktree under heartbeats, then --verify, then
    lands (rebase onto the fresh base, fenced scope-checked push, bounded non-fast-forward retries) and
    releases. Outcomes are kept on the lease store, so runners on several hosts share one queue and a
    restarted runner resumes. Exit 0 when every task is done, 1 when some failed, 130 after Ctrl-C (a second
    Ctrl-C, SIGTERM or SIGHUP also stops running commands, their work quarantined; then 130, 143 or 129)."""
    if prune is not None:
        return _prune(prune, remote)
    if queue is None:
        raise errors.UsageError("git lease work needs a queue: git lease work QUEUE -- ./agent.sh")
    if status:
        return _status(queue, granularity, remote)
    if not cmd:
        raise errors.UsageError("git lease work needs a command after --: git lease work QUEUE -- ./agent.sh")
    from gitlease.work.runner import WorkOptions

    opts = WorkOptions(
        command=list(cmd),
        verify=verify,
        land=land,
        workers=workers,
        attempts=attempts,
        ttl=ttl_seconds(ttl),
        remote=remote,
        agent=agent,
        backoff=float(seconds("--backoff", backoff)) if backoff is not None else 5.0,
        allow_extend=allow_extend,
        rerun=list(rerun or []),
        task_timeout=float(seconds("--task-timeout", task_timeout, 1)) if task_timeout is not None else None,
    )
    return _run(queue, opts, granularity, as_json)


def _run(queue: str, opts, granularity: str | None, as_json: bool):
    """The run itself: the runner, its live view on a terminal, and the summary or the failure it ends with."""
    from gitlease.cli.common import service
    from gitlease.work.runner import Runner, make_source

    svc = service(opts.remote)
    source = make_source(svc.repo.cwd, queue, granularity=granularity, remote=opts.remote)
    view = _LiveView() if sys.stdout.isatty() and not as_json else None
    runner = Runner(svc.repo.cwd, source, opts, on_event=_printer(as_json, view), signer=svc.signer)
    if view is not None:
        view.start(runner)
    try:
        summary = runner.run()
    finally:
        if view is not None:
            view.stop()
    result = summary.to_json()
    lines = summary.lines()
    if not (summary.interrupted or summary.failed):
        return result, lines
    if not as_json:
        for line in lines:
            echo(line)
    if summary.interrupted:
        err = errors.Interrupted(
            f"interrupted: {len(summary.done)} done, {len(summary.pending)} not finished; every lease released",
            summary=result,
        )
        err.exit_code = summary.exit_code  # 130 after Ctrl-C; 143 after SIGTERM, 129 after SIGHUP
        raise err
    raise errors.TasksFailed(
        f"{len(summary.failed)} task{'s' if len(summary.failed) != 1 else ''} failed: "
        f"{' '.join(summary.failed[:10])} (git lease work --status {queue})",
        summary=result,
    )


def _prune(age: str, remote: str | None):
    from gitlease.cli.common import service
    from gitlease.service.outcomes import prune

    svc = service(remote)
    svc.require_store()
    older = float(seconds("--prune", age, 1)) if age else float(svc.settings.prune_after)
    got = prune(svc, older, now=svc.clock.now())
    lines = [f"pruned {len(got.tasks)} task outcome{'s' if len(got.tasks) != 1 else ''} ({got.refs} refs)"]
    if got.audit:
        lines.append(f"audited: {got.audit[:12]} in {svc.audit.ref}")
    return {"tasks": got.tasks, "refs": got.refs, "audit": got.audit}, lines


def _status(queue: str, granularity: str | None, remote: str | None):
    from gitlease.cli.common import service
    from gitlease.work.runner import queue_status

    svc = service(remote)
    states, counts = queue_status(svc.repo.cwd, queue, granularity=granularity, remote=remote)
    lines = [s.line() for s in states]
    lines.append(", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no tasks")
    return {"tasks": [s.to_json() for s in states], "counts": counts}, lines


def _printer(as_json: bool, view):
    lock = threading.Lock()

    def on_event(ev) -> None:
        with lock:
            if as_json:
                sys.stdout.write(json.dumps(text_only(ev.to_json()), sort_keys=True) + "\n")
                sys.stdout.flush()
            elif view is not None:
                if ev.kind in (
                    "landed",
                    "failed",
                    "retry",
                    "quarantined",
                    "refused",
                    "swept",
                    "pruned",
                    "stopping",
                    "error",
                    "warning",
                    "rerun",
                ):
                    view.note(ev.line())
                else:  # a state change (claimed, running, done...): the view shows it now, not at the next tick
                    view.refresh()
            else:
                echo(ev.line())

    return on_event


class _LiveView:
    """On a terminal: one line per worker, the tasks landing after their worker went on, the counts and the
    leases blocking the queue head, redrawn at every event and twice a second; notable events scroll above it."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._drawn = 0
        self._runner = None
        self._thread: threading.Thread | None = None

    def start(self, runner) -> None:
        self._runner = runner
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self._draw(final=True)

    def note(self, line: str) -> None:
        v = self._state()  # read before the view's lock: the runner's own lock is never taken under it
        with self._lock:
            self._clear()
            sys.stdout.write(line + "\n")
            self._render(v)

    def refresh(self) -> None:
        self._draw()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._draw()

    def _draw(self, final: bool = False) -> None:
        v = None if final else self._state()
        with self._lock:
            self._clear()
            if v is not None:
                self._render(v)
            sys.stdout.flush()

    def _state(self) -> dict | None:
        return self._runner.view() if self._runner is not None else None

    def _clear(self) -> None:
        if self._drawn:
            sys.stdout.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0

    def _render(self, v: dict | None) -> None:
        if v is None:
            return
        rows = [
            f"  worker {w['worker']}: {w['state']:<10} {w['task'] or '-':<20} {w['scope'][:40] or '-':<20} "
            f"{w['elapsed']:6.1f}s  {w['note'][:60]}"
            for w in v["workers"]
        ]
        if v.get("landing"):
            behind = ", ".join(f"{t['task']} ({t['state']}, {t['elapsed']:.1f}s)" for t in v["landing"])
            rows.append(f"  landing: {behind[:160]}")
        c = v["counts"]
        rows.append(f"  done {c['done']}  running {c['running']}  waiting {c['waiting']}  failed {c['failed']}")
        if v["blockers"]:
            rows.append(f"  queue head blocked by: {' '.join(v['blockers'])}")
        sys.stdout.write("".join(r + "\n" for r in rows))
        sys.stdout.flush()
        self._drawn = len(rows)
