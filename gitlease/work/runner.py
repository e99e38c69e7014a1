"""The queue runner: ``git lease work`` (docs/work.md). Each worker loops:

1. read the store (the leases, the task claims, the outcomes) and plan: queue order, skipping tasks done,
   failed, claimed anywhere or cooling down after a failed attempt (gitlease.plan.planner);
2. acquire the next startable task's scope AND its claim ``refs/leases/task/<task>`` in one atomic push
   (``LeaseService.acquire(task=...)``): two workers, on one host or many, never run one task;
3. fetch the base after the grant (what an earlier task on these paths landed is in it), attach a clean
   worktree on a task branch (gitlease.worktree.manager);
4. run the command there under heartbeats (the task as JSON on stdin and in ``$GITLEASE_TASK_FILE``;
   ``$GITLEASE_LEASE``, ``$GITLEASE_TASK``, ``$GITLEASE_SCOPE``; ``{id}`` and ``{path}`` expanded), then the
   verifier in the same worktree;
5. land: commit nothing itself; rebase the task branch onto the fresh base, then one fenced, scope-checked
   atomic push (gitlease.enforce.push.fenced_push) of the branch, the lease's renewal and the task's ``done``
   outcome (a task lands exactly once); a non-fast-forward re-fetches, rebases and retries (bounded);
6. release the lease (and the claim with it), give the worktree back to the pool.

A refused lease (exit 3) waits; a lost lease (6), a crash or a failed verifier re-queues the task with
backoff up to ``attempts`` (its work quarantined and the ref named in its outcome); a path outside the scope
refused at landing (4) fails the task at once, work kept. Outcomes live on the store
(gitlease.service.outcomes): a second runner on another clone cooperates, a restarted one resumes.

The stable entry for Python (and the fleet soak): ``run_queue``. It prints nothing: events go to ``on_event``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gitlease.core import gitcmd
from gitlease.core.clock import SYSTEM, Clock, iso
from gitlease.core.errors import (
    GitLeaseError,
    HeldError,
    LeaseLost,
    NotHeld,
    PushRejected,
    RemoteUnavailable,
    ScopeViolation,
    UsageError,
)
from gitlease.core.refnames import QUARANTINE_PREFIX, TASK_PREFIX, decode_segment, outcome_ref, quarantine_ref
from gitlease.core.store import RefUpdate, RemoteStore
from gitlease.service.leases import LeaseService
from gitlease.service.outcomes import Outcome, Outcomes
from gitlease.work.queue import TaskSource, WorkTask

ACTIVE = ("claimed", "running", "verifying", "landing")  # a worker's states while it works on a task
LAND_RETRIES = 20  # non-fast-forward retries of one landing (re-fetch, rebase, push)
BACKOFF_CAP = 300.0


@dataclass
class WorkOptions:
    command: Sequence[str]
    verify: str | None = None  # a shell command run in the worktree after COMMAND
    land: str | None = None  # the branch to land on; None: each task's own branch work/<task>
    workers: int = 1
    attempts: int = 3  # attempts per task before it is failed
    ttl: int | None = None  # the leases' TTL (default: lease.ttl)
    remote: str | None = None
    agent: str | None = None
    backoff: float = 5.0  # seconds before a failed task's next attempt, doubling each time
    poll: float = 1.0  # seconds between reads while nothing can start
    sweep_every: float = 30.0  # seconds between the runner's own sweeps of stale leases (0: never)
    grace: float = 5.0  # SIGTERM to SIGKILL when a command is stopped
    land_retries: int = LAND_RETRIES

    def check(self) -> None:
        if not self.command:
            raise UsageError("git lease work needs a command after --: git lease work QUEUE -- ./agent.sh")
        if self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.attempts < 1:
            raise UsageError("--attempts must be at least 1")


@dataclass(frozen=True)
class Event:
    kind: str  # claimed | refused | waiting | running | verifying | landing | landed | retry | failed | done
    # | released | quarantined | swept | stopping | interrupted | error
    worker: int
    at: float
    task: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        d = self.detail
        who = f"worker {self.worker}" if self.worker >= 0 else "runner"
        task = f" {self.task}" if self.task else ""
        extra = d.get("message") or " ".join(f"{k}={v}" for k, v in d.items() if v not in (None, "", [], {}))
        return f"{who}: {self.kind}{task}" + (f": {extra}" if extra else "")

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, "worker": self.worker, "at": iso(self.at), "task": self.task, **self.detail}


@dataclass
class TaskStats:
    id: str
    state: str = "pending"
    attempts: int = 0
    landed: str | None = None
    quarantine: str | None = None
    reason: str = ""
    busy: float = 0.0  # seconds a worker of this runner spent on it

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "attempts": self.attempts,
            "landed": self.landed,
            "quarantine": self.quarantine,
            "reason": self.reason,
            "busySeconds": round(self.busy, 3),
        }


@dataclass
class Summary:
    done: list[str]  # tasks done (by any runner), queue order
    failed: list[str]
    pending: list[str]  # neither (interrupted, or left to other runners)
    ran: int  # attempts this runner made
    makespan: float  # seconds from start to end
    busy: float  # worker seconds spent on tasks
    lease_waits: int  # times a task that could be next waited for a lease (planned blocked, or refused)
    retries: int  # failed attempts re-queued, and non-fast-forward landing retries
    land_retries: int
    interrupted: bool
    workers: int
    tasks: dict[str, TaskStats] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """Busy worker time over the makespan: how much faster than running the same attempts one at a time."""
        return self.busy / self.makespan if self.makespan > 0 else 0.0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.failed else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "failed": self.failed,
            "pending": self.pending,
            "attempts": self.ran,
            "makespanSeconds": round(self.makespan, 3),
            "busySeconds": round(self.busy, 3),
            "speedup": round(self.speedup, 2),
            "leaseWaits": self.lease_waits,
            "retries": self.retries,
            "landRetries": self.land_retries,
            "interrupted": self.interrupted,
            "workers": self.workers,
            "tasks": [t.to_json() for t in self.tasks.values()],
        }

    def lines(self) -> list[str]:
        out = [
            f"done {len(self.done)}, failed {len(self.failed)}"
            + (f", not finished {len(self.pending)}" if self.pending else "")
            + f"; makespan {self.makespan:.1f}s, busy worker time {self.busy:.1f}s, speed-up {self.speedup:.2f}x "
            f"over one at a time ({self.workers} worker{'s' if self.workers != 1 else ''})",
            f"waits caused by leases {self.lease_waits}, retries {self.retries} "
            f"(non-fast-forward landings {self.land_retries})",
        ]
        for tid in self.failed:
            t = self.tasks.get(tid)
            if t:
                q = f"; work kept in {t.quarantine}" if t.quarantine else ""
                out.append(f"failed: {tid} after {t.attempts} attempt{'s' if t.attempts != 1 else ''}: {t.reason}{q}")
        return out


class _Fail(Exception):
    """An attempt that did not land: ``final`` fails the task at once (a scope violation)."""

    def __init__(self, reason: str, *, final: bool = False, interrupted: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.final, self.interrupted = reason, final, interrupted


class Runner:
    """One ``git lease work``: ``workers`` threads over one queue, in the clone at ``repo_dir``."""

    def __init__(
        self,
        repo_dir: str,
        source: TaskSource,
        options: WorkOptions,
        *,
        clock: Clock = SYSTEM,
        on_event: Callable[[Event], None] | None = None,
        signer=None,
    ) -> None:
        from gitlease.service.factory import open_service

        options.check()
        self.opts, self.source, self.clock = options, source, clock
        self.on_event = on_event or (lambda ev: None)
        self.svc = open_service(repo_dir, remote=options.remote, clock=clock, signer=signer, agent=options.agent)
        self.svc.require_store()
        if not isinstance(self.svc.store, RemoteStore):
            raise UsageError(
                "git lease work lands through a fenced push: it needs the lease store on a remote "
                "(git config lease.remote origin)"
            )
        self.remote = self.svc.store.remote
        self.ttl = int(options.ttl or self.svc.settings.ttl)
        self.stop = threading.Event()  # take no more tasks
        self.kill = threading.Event()  # stop running commands too
        self._lock = threading.RLock()
        self._fetch_lock = threading.Lock()
        self._outcomes = Outcomes(self.svc)
        self._inflight: set[str] = set()
        self._granted: set[str] = set()  # every lease this runner was granted (its final sweep's concern)
        self._unreleased: dict[str, LeaseService] = {}  # leases whose release failed: the store unreachable
        # worktrees such a lease still binds: given back once its release goes through (_retry_releases)
        self._pending_back: dict[str, tuple[Any, str]] = {}
        self.stats: dict[str, TaskStats] = {}
        self.lease_waits = 0
        self._waited: set[tuple[str, str]] = set()
        self.retries = 0
        self.land_retries = 0
        self.ran = 0
        self.busy = 0.0
        self.workers_view: dict[int, dict[str, Any]] = {}
        self.head_blockers: list[str] = []
        self._last_sweep = -1e18
        self._sweep_due = float("inf")  # an earlier sweep wanted (a lease lost, maybe left on the store)
        self._base: str | None = None
        self.log_dir = os.path.join(self.svc.repo.shared_dir(), "work-logs")
        self._sigints = self._sigints_seen = 0
        self.last_outcomes: dict[str, Outcome] = {}
        self.finished: dict[str, str] = {}  # task -> done | failed, as this runner saw it (before the next read)
        self.last_tasks: list[str] = []

    def view(self) -> dict[str, Any]:
        """What a live view shows: each worker (task, its scope, state, seconds in it, last note), counts, and
        the leases blocking the queue's head."""
        now = self.clock.monotonic()
        with self._lock:
            workers = [
                {
                    "worker": n,
                    "task": v.get("task"),
                    "state": v.get("state", "starting"),
                    "elapsed": now - v.get("since", now),
                    "scope": v.get("scope", ""),
                    "note": v.get("note", ""),
                }
                for n, v in sorted(self.workers_view.items())
                if n >= 0
            ]
            outs = {t: o.state for t, o in self.last_outcomes.items()}
            outs.update(self.finished)  # what this runner finished since the store was last read
            tasks = list(self.last_tasks)
            blockers = list(self.head_blockers)
        running = sum(1 for w in workers if w["task"] and w["state"] in ACTIVE)
        done = sum(1 for t in tasks if outs.get(t) == "done")
        failed = sum(1 for t in tasks if outs.get(t) == "failed")
        return {
            "workers": workers,
            "counts": {
                "done": done,
                "running": running,
                "waiting": max(0, len(tasks) - done - failed - running),
                "failed": failed,
            },
            "blockers": blockers,
        }

    # ------------------------------------------------------------------------------ events
    def emit(self, kind: str, worker: int, task: str | None = None, **detail: Any) -> None:
        ev = Event(kind, worker, self.clock.now(), task, detail)
        with self._lock:
            if task is not None and kind in ("done", "failed"):
                self.finished[task] = kind
            view = self.workers_view.setdefault(worker, {})
            if worker >= 0:
                busy = kind in ACTIVE or (kind == "landing" and view.get("task") == task)
                note = detail.get("message", "") if kind != "waiting" else f"{task}: {detail.get('message', '')}"
                shown = task if busy or kind not in ("waiting", "done", "released") else None
                view.update(
                    state=kind if busy or kind != "waiting" else "idle",
                    task=shown,
                    since=self.clock.monotonic(),
                    note=note,
                )
                if kind == "claimed":
                    view["scope"] = str(detail.get("scope", ""))
                elif shown is None or shown != task:
                    view.pop("scope", None)
        with contextlib.suppress(Exception):
            self.on_event(ev)

    def request_stop(self) -> bool:
        """First call: take no more tasks; second: stop the running commands too. True for the second."""
        if self.stop.is_set():
            self.kill.set()
            self.emit("stopping", -1, message="stopping the running commands (their work is quarantined)")
            return True
        self.stop.set()
        self.emit("stopping", -1, message="taking no more tasks; running ones finish (Ctrl-C again stops them)")
        return False

    def _on_sigint(self, _signum, _frame) -> None:
        self._sigints += 1
        if self._sigints >= 2:
            self.kill.set()  # at once: the workers stop their commands
        self.stop.set()

    def _handle_signals(self) -> None:
        while self._sigints_seen < self._sigints:
            self._sigints_seen += 1
            if self._sigints_seen == 1:
                self.emit("stopping", -1, message="taking no more tasks; running ones finish (Ctrl-C again stops them)")
            elif self._sigints_seen == 2:
                self.emit("stopping", -1, message="stopping the running commands (their work is quarantined)")

    def _pause(self, seconds: float) -> None:
        if type(self.clock).sleep is Clock.sleep:
            self.stop.wait(seconds)
        else:
            self.clock.sleep(seconds)
            self.stop.wait(0.01)

    # --------------------------------------------------------------------------------- run
    def run(self, *, handle_signals: bool = True) -> Summary:
        start = self.clock.monotonic()
        previous = None
        if handle_signals and threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            # the handler only counts: printing from it could re-enter a lock the interrupted code holds
            signal.signal(signal.SIGINT, self._on_sigint)
        try:
            self._prune_dead(-1)
            threads = [
                threading.Thread(target=self._worker, args=(n,), name=f"gitlease-work-{n}", daemon=True)
                for n in range(self.opts.workers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.1)
                    self._handle_signals()
            self._handle_signals()
            self._final_sweep()
            with self._lock:  # worktrees whose lease's release never went through: free once it expired
                pending, self._pending_back = list(self._pending_back.values()), {}
            for manager, wt in pending:
                with contextlib.suppress(GitLeaseError):
                    manager.give_back(wt)
            self._prune_dead(-1)  # what a dead runner's command still ran in at the start is free by now
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        return self._summary(self.clock.monotonic() - start)

    def _summary(self, makespan: float) -> Summary:
        tasks = self.source.tasks()
        try:
            outs = self._outcomes.read(self.svc.store.list_refs())
        except GitLeaseError:
            outs = {}
        for t in tasks:
            st = self.stats.setdefault(t.id, TaskStats(t.id))
            o = outs.get(t.id)
            if o is not None:
                st.state, st.attempts = o.state, o.attempts
                st.landed, st.quarantine = o.landed or st.landed, o.quarantine or st.quarantine
                st.reason = o.reason or st.reason
        done = [t.id for t in tasks if self.stats[t.id].state == "done"]
        failed = [t.id for t in tasks if self.stats[t.id].state == "failed"]
        pending = [t.id for t in tasks if t.id not in done and t.id not in failed]
        return Summary(
            done,
            failed,
            pending,
            self.ran,
            makespan,
            self.busy,
            self.lease_waits,
            self.retries,
            self.land_retries,
            self.stop.is_set(),
            self.opts.workers,
            {t.id: self.stats[t.id] for t in tasks},
        )

    # ------------------------------------------------------------------------------ worker
    def _worker(self, n: int) -> None:
        from gitlease.service.factory import open_service

        svc = open_service(
            self.svc.repo.cwd, remote=self.opts.remote, clock=self.clock, signer=self.svc.signer, agent=self.opts.agent
        )
        idle = 0
        while not self.stop.is_set():
            try:
                pick = self._next(svc, n)
            except RemoteUnavailable as exc:
                self.emit("error", n, message=f"cannot read the store: {exc.message}; trying again")
                self._pause(min(30.0, self.opts.poll * 2 ** min(idle, 5)))
                idle += 1
                continue
            if pick is None:
                break
            if pick == "wait":
                self._pause(min(5.0, self.opts.poll * (1.5 ** min(idle, 4))))
                idle += 1
                continue
            idle = 0
            task, prev = pick
            try:
                self._attempt(svc, n, task, prev)
            except GitLeaseError as exc:  # the store went away mid-task, a git failure: the task is re-planned
                self.emit("error", n, task.id, message=exc.message)
                self._pause(self.opts.poll)
            finally:
                with self._lock:
                    self._inflight.discard(task.id)
        with self._lock:
            self.workers_view.setdefault(n, {}).update(state="finished", task=None)

    def _next(self, svc: LeaseService, n: int):
        """(task, its outcome so far) to start now; "wait" when nothing can start yet; None when the queue is
        finished (every task done or failed) or the runner stops."""
        from gitlease.plan.planner import blocking_leases, plan

        tasks = self.source.tasks()
        snap = svc.snapshot(use_cache=False)
        if self._unreleased:
            self._retry_releases()
            snap = svc.snapshot(use_cache=False)
        with self._lock:  # the outcomes as the same listing had them: one read of the store per step
            outs = self._outcomes.read(snap.listing)
            self.last_outcomes = outs
            self.last_tasks = [t.id for t in tasks]
        now = self.clock.now()
        skew = svc.settings.skew
        claimed: dict[str, str] = {}  # task -> lease id (a live or not yet swept claim)
        for v in snap.leases:
            for ref in v.task_refs:
                with contextlib.suppress(ValueError):
                    claimed[decode_segment(ref[len(TASK_PREFIX) :])] = v.lease_id
        unfinished = [t for t in tasks if not (t.id in outs and outs[t.id].final)]
        # first: a runner restarted after a crash sweeps what its dead predecessor left even when nothing is
        # left to run
        self._maybe_sweep(svc, snap, n)
        if not unfinished and not self.source.more():
            return None
        with self._lock:
            busy_here = set(self._inflight)
        ready = [
            t
            for t in unfinished
            if t.id not in claimed
            and t.id not in busy_here
            and not (t.id in outs and outs[t.id].state == "retrying" and outs[t.id].not_before > now)
        ]
        if not ready:
            return "wait"
        the_plan = plan([t.plan_task() for t in ready], blocking_leases(snap, now, skew))
        by_id = {t.id: t for t in ready}
        head = the_plan.blocked[0] if the_plan.blocked else None
        with self._lock:
            self.head_blockers = list(head.leases) if head and ready and head.id == ready[0].id else []
            for b in the_plan.blocked:
                if b.leases and (b.id, b.leases[0]) not in self._waited:
                    self._waited.add((b.id, b.leases[0]))
                    self.lease_waits += 1
                    self.emit("waiting", n, b.id, message=f"scope held by {' '.join(b.leases)}")
            for tid in the_plan.start:
                if tid not in self._inflight:
                    self._inflight.add(tid)
                    return by_id[tid], outs.get(tid)
        return "wait"

    def _maybe_sweep(self, svc: LeaseService, snap, n: int) -> None:
        """The runner's own sweeper: what the rules allow (gitlease.ops.sweep), at most every ``sweep_every``."""
        if not self.opts.sweep_every:
            return
        now = self.clock.monotonic()
        with self._lock:
            if now - self._last_sweep < self.opts.sweep_every and now < self._sweep_due:
                return
            self._last_sweep = now
            self._sweep_due = float("inf")
        from gitlease.ops.sweep import Sweeper

        try:
            got = Sweeper(svc).sweep()
        except GitLeaseError as exc:
            self.emit("error", n, message=f"sweep: {exc.message}")
            return
        for r in got.results:
            if r.outcome == "reclaimed":
                self.emit("swept", n, r.owner, message=r.line())
        self._prune_dead(n)

    def _final_sweep(self) -> None:
        """Leases of this runner left on the store at the end: a release whose outcome was lost (the push
        landed after the client gave up, or a renewal landed that the client counted as refused, so the
        lease was forgotten here). Nobody may run after this runner to sweep them, so wait (bounded: the
        TTL and the skew) for them to expire and sweep them (the rules of gitlease.ops.sweep)."""
        if not self.opts.sweep_every:
            return
        from gitlease.ops.sweep import Sweeper

        self._retry_releases()
        end = self.clock.now() + self.ttl + self.svc.settings.skew + 5
        while True:
            try:
                snap = self.svc.snapshot(use_cache=False)
            except GitLeaseError:
                return
            with self._lock:
                granted = set(self._granted)
            left = [v for v in snap.leases if v.record is not None and v.lease_id in granted]
            if not left:
                return
            latest = max(v.record.expires for v in left if v.record is not None) + self.svc.settings.skew + 1
            now = self.clock.now()
            if now < latest:
                if now >= end:
                    return
                self.clock.sleep(min(latest, end) - now)  # also once stopping (_pause returns at once then)
                continue
            try:
                got = Sweeper(self.svc).sweep()
            except GitLeaseError as exc:
                self.emit("error", -1, message=f"sweep: {exc.message}")
                return
            for r in got.results:
                if r.outcome == "reclaimed":
                    self.emit("swept", -1, r.owner, message=r.line())
            if self.clock.now() >= end:
                return
            self.clock.sleep(1.0)

    def _prune_dead(self, n: int) -> None:
        """Task worktrees of this clone left by a runner that died (``kill -9``): their lease released, or
        expired beyond the skew margin (swept or not), and no live process bound to them (the runner's busy
        mark, the lease's holder, a command still running in them). Clean ones go back to the pool; one
        holding work (an unlanded commit, uncommitted edits) is quarantined, nothing lost
        (``WorktreeManager.prune``: the rules of ``git lease worktree prune``, limited to task branches)."""
        from gitlease.worktree.manager import WorktreeManager

        branches: dict[str, str] = {}

        def ours(wt) -> bool:
            if wt.meta is None or not wt.meta.branch.startswith("work/"):
                return False
            branches[wt.id] = wt.meta.branch
            return True

        try:
            actions = WorktreeManager(self.svc).prune(select=ours)
        except GitLeaseError as exc:
            self.emit("error", n, message=f"worktree prune: {exc.message}")
            return
        by_branch: dict[str, str] | None = None
        for a in actions:
            if a.action not in ("pooled", "quarantined"):
                continue
            if by_branch is None:
                by_branch = {}
                with contextlib.suppress(GitLeaseError):
                    by_branch = {f"work/{_slug(t.id)}-": t.id for t in self.source.tasks()}
            branch = branches.get(a.id, "")
            task = next(
                (tid for pre, tid in by_branch.items() if branch.startswith(pre) and len(branch) == len(pre) + 8), None
            )
            what = f"quarantined: work kept in {a.ref}" if a.action == "quarantined" else "back in the pool"
            self.emit(
                "pruned", n, task, worktree=a.id, message=f"worktree {a.id} ({branch}) of a runner that is gone: {what}"
            )

    # ----------------------------------------------------------------------------- a task
    def _task_service(self, svc: LeaseService, task: WorkTask, at: str | None = None) -> LeaseService:
        if at is None:
            return LeaseService(
                svc.repo, dataclasses.replace(svc.settings, task=task.id), clock=self.clock, signer=svc.signer
            )
        from gitlease.service.factory import open_service

        return open_service(
            at, remote=self.opts.remote, clock=self.clock, signer=svc.signer, agent=self.opts.agent, task=task.id
        )

    def _attempt(self, svc: LeaseService, n: int, task: WorkTask, prev: Outcome | None) -> None:
        from gitlease.liveness.heartbeat import Timing

        attempt = (prev.attempts if prev else 0) + 1
        tsvc = self._task_service(svc, task)
        timing = Timing.for_ttl(self.ttl, timeout=min(tsvc.settings.timeout, self.ttl / 6), grace=None)
        try:
            got = tsvc.acquire(
                task.scope,
                ttl=self.ttl,
                holder_pid=os.getpid(),
                renew_every=max(1, int(timing.renew_every)),
                stop_after=timing.stop_after,
                task=task.id,
            )
        except HeldError as exc:
            with self._lock:
                self.lease_waits += 1
            self.emit("refused", n, task.id, message=exc.message)
            return
        except RemoteUnavailable:
            raise
        except GitLeaseError as exc:  # claimed by another runner at another scope, a hook refused
            self.emit("refused", n, task.id, message=exc.message)
            self._pause(self.opts.poll)
            return
        lease_id = got.lease_id
        with self._lock:
            self.ran += 1
            self._granted.add(lease_id)
        self.emit("claimed", n, task.id, lease=lease_id, scope=" ".join(got.record.paths), attempt=attempt)
        started = self.clock.monotonic()
        st = self.stats.setdefault(task.id, TaskStats(task.id))
        try:
            refs = tsvc.store.list_refs()
            with self._lock:
                fresh = self._outcomes.read(refs).get(task.id)
            if fresh is not None and (fresh.final or (prev is None or fresh.oid != prev.oid)):
                # finished (or re-queued) by another runner between our read and our claim
                self._release(tsvc, lease_id)
                self.emit("released", n, task.id, message="another runner finished it meanwhile")
                return
            self._work(svc, tsvc, n, task, prev, attempt, got, timing, st)
        finally:
            spent = self.clock.monotonic() - started
            with self._lock:
                self.busy += spent
                st.busy += spent

    def _work(self, svc, tsvc, n, task, prev, attempt, got, timing, st) -> None:
        from gitlease.liveness.heartbeat import Heartbeat, event_wait, service_attempt
        from gitlease.liveness.supervise import PROGRESS_ENV, ProgressFile, progress_file
        from gitlease.worktree.manager import WorktreeManager

        lease_id = got.lease_id
        manager = WorktreeManager(tsvc)
        att = None
        wsvc = tsvc
        hb = None
        beat = None
        progress = None
        try:
            base_ref, base_oid = self._fetch_base()
            att = manager.add(lease_id, base=base_oid, branch=_branch(task.id, lease_id))
            # bound to this process until given back (also between the release and the give-back): a
            # restarted runner prunes it only once this one is dead (_prune_dead)
            manager.mark_busy(att.id, f"git lease work: task {task.id}")
            wsvc = self._task_service(svc, task, att.path)
            beat_svc = LeaseService(wsvc.repo, wsvc.settings, clock=self.clock, signer=wsvc.signer)
            beats: list[Heartbeat] = []
            progress = ProgressFile(
                progress_file(wsvc.held.folder, lease_id), lambda note: self._progress(n, task.id, note, beats)
            )
            hb = Heartbeat(
                service_attempt(beat_svc, lease_id, stop_after=timing.stop_after),
                timing,
                got.record.expires,
                clock=self.clock,
                stop_by=got.record.stop_deadline,
                # waits in real time, also under an injected clock: a test clock then moves only when the
                # runner itself waits (backoff, polling), never in a renewal loop of its own
                wait=event_wait,
                poll=progress.poll,
            )
            beats.append(hb)
            beat = threading.Thread(target=hb.run, name=f"gitlease-work-beat-{n}", daemon=True)
            beat.start()
            env = self._env(task, lease_id, att.path, attempt)
            env[PROGRESS_ENV] = progress.path  # `git lease progress NOTE` from the command
            argv = [a.replace("{id}", task.id).replace("{path}", att.path) for a in self.opts.command]
            self.emit("running", n, task.id, worktree=att.path, attempt=attempt)
            rc = self._run(argv, att.path, env, hb, task, attempt, "command", input=json.dumps(env["__task"]))
            if hb.lost.is_set():
                raise _Fail(LeaseLost.say(lease_id, hb.reason or "no renewal confirmed"))
            if self.kill.is_set():
                raise _Fail("interrupted", interrupted=True)
            if rc != 0:
                raise _Fail(f"the command exited {rc}")
            dirt = gitcmd.run(["status", "--porcelain", "--untracked-files=all"], cwd=att.path).out.strip()
            if dirt:
                raise _Fail("the command left uncommitted changes (the runner commits nothing itself)")
            if self.opts.verify:
                self.emit("verifying", n, task.id)
                vrc = self._run(["sh", "-c", self.opts.verify], att.path, env, hb, task, attempt, "verify")
                if hb.lost.is_set():
                    raise _Fail(LeaseLost.say(lease_id, hb.reason or "no renewal confirmed"))
                if self.kill.is_set():
                    raise _Fail("interrupted", interrupted=True)
                if vrc != 0:
                    raise _Fail(f"the verifier failed (exit {vrc})")
                # what a verifier leaves untracked (build output) is not the task's work; a tracked file it
                # changed is
                dirt = gitcmd.run(["status", "--porcelain", "--untracked-files=no"], cwd=att.path).out.strip()
                if dirt:
                    raise _Fail("the verifier changed tracked files")
            self.emit("landing", n, task.id)
            landed = self._land(wsvc, n, task, prev, attempt, lease_id, att.path, base_ref, st)
        except _Fail as exc:
            if hb is not None:
                hb.stop()
            self._failed(n, task, prev, attempt, lease_id, wsvc, manager, att, exc, st)
            return
        except BaseException:
            if hb is not None:
                hb.stop()
            self._release(wsvc, lease_id)
            if att is not None:
                with contextlib.suppress(GitLeaseError):
                    manager.give_back(att.id)
            raise
        finally:
            if hb is not None:
                hb.stop()
            if beat is not None:
                beat.join(timing.timeout + 1)
            if progress is not None:
                progress.remove()
        st.state, st.attempts, st.landed = "done", attempt, landed
        self.emit("landed", n, task.id, commit=landed, branch=self._target(task).removeprefix("refs/heads/"))
        self._release(wsvc, lease_id)
        with contextlib.suppress(GitLeaseError):
            self._fetch_base()
        self._give_back(n, task.id, manager, att.id, lease_id, say=True)
        self.emit("done", n, task.id, attempt=attempt)

    def _give_back(self, n: int, task_id: str, manager: Any, wt: str, lease_id: str, *, say: bool = False) -> None:
        """The task's worktree back to the pool (quarantined when it holds work: said when ``say``). One its
        lease still binds because the release failed (the store unreachable) is given back when the release
        goes through (_retry_releases), not left bound to this live runner, which no prune would free."""
        try:
            state, ref = manager.give_back(wt)
        except GitLeaseError:
            return
        if state == "quarantined" and say:
            self.emit("quarantined", n, task_id, ref=ref)
        if state != "kept":
            return
        with self._lock:
            pending = lease_id in self._unreleased
            if pending:
                self._pending_back[lease_id] = (manager, wt)
        if not pending:  # released meanwhile by another worker's retry: free now
            with contextlib.suppress(GitLeaseError):
                manager.give_back(wt)

    def _failed(self, n, task, prev, attempt, lease_id, wsvc, manager, att, exc: _Fail, st: TaskStats) -> None:
        ref = None
        if att is not None:
            try:
                _state, ref = manager.give_back(att.id, quarantine_only=True)
            except GitLeaseError as err:
                self.emit("error", n, task.id, message=f"could not quarantine the worktree: {err.message}")
        if ref:
            if not exc.interrupted:  # an interrupted attempt runs again under the same number: kept here only
                ref = self._park(n, task.id, attempt, ref)
            self.emit("quarantined", n, task.id, ref=ref)
        if exc.interrupted:
            state, attempts, not_before = "retrying", attempt - 1, 0.0
        else:
            final = exc.final or attempt >= self.opts.attempts
            state, attempts = ("failed" if final else "retrying"), attempt
            not_before = 0.0 if final else self.clock.now() + min(BACKOFF_CAP, self.opts.backoff * 2 ** (attempt - 1))
        reason = exc.reason
        try:
            wrote = self._outcomes.write(
                task.id,
                state,
                attempts,
                parent=prev.oid if prev else None,
                reason=reason,
                quarantine=ref,
                not_before=not_before,
            )
        except GitLeaseError as err:
            wrote = None
            self.emit("error", n, task.id, message=f"outcome not recorded: {err.message}")
        st.attempts, st.reason, st.quarantine = attempts, reason, ref or st.quarantine
        if wrote is not None:
            st.state = state
        self._release(wsvc, lease_id)
        if att is not None:
            self._give_back(n, task.id, manager, att.id, lease_id)
        if exc.interrupted:
            self.emit("interrupted", n, task.id, quarantine=ref)
        elif state == "failed":
            self.emit("failed", n, task.id, message=f"{reason} (attempt {attempt}); work kept in {ref or 'nothing'}")
        else:
            with self._lock:
                self.retries += 1
            self.emit("retry", n, task.id, message=f"{reason} (attempt {attempt} of {self.opts.attempts})")

    def _park(self, n: int, task_id: str, attempt: int, ref: str) -> str:
        """Park the quarantined work of a failed attempt on the store too (``refs/leases-quarantine/<task>/<attempt>``,
        created only, never overwritten), and under the same name here, so that the ref its outcome names can
        be fetched from any clone. Returns that name; the local quarantine ref when the store is this
        repository or the push fails (said in an event: the work is still kept here)."""
        if not isinstance(self.svc.store, RemoteStore):
            return ref
        oid = gitcmd.run(["rev-parse", "--verify", "--quiet", ref], cwd=self.svc.repo.cwd, check=False).out.strip()
        target = quarantine_ref(task_id, attempt)
        if not oid:
            return ref
        try:
            out = self.svc.store.apply([RefUpdate(target, oid, None)])
            ok, why = out.ok, out.message or ", ".join(f"{r} {st}" for r, st in out.statuses.items())
        except GitLeaseError as err:
            ok, why = False, err.message
        if not ok:
            self.emit("error", n, task_id, message=f"work kept here in {ref}, not parked on the store: {why[:200]}")
            return ref
        gitcmd.run(["update-ref", target, oid], cwd=self.svc.repo.cwd, check=False)
        return target

    def _release(self, wsvc: LeaseService, lease_id: str) -> None:
        try:
            wsvc.release(lease_id)
        except (LeaseLost, NotHeld):
            # lost or gone already: nothing to give back. A lease lost to an ambiguous renewal (the server
            # died mid-push) may still be on the store: sweep once it must have expired, not a whole
            # sweep_every later
            self._sweep_soon()
        except GitLeaseError:
            # the store unreachable (a server restart): tried again at each planning step, so the task is not
            # kept claimed until the lease expires and a sweeper clears it
            with self._lock:
                self._unreleased[lease_id] = wsvc

    def _sweep_soon(self) -> None:
        due = self.clock.monotonic() + self.ttl + self.svc.settings.skew + 1
        with self._lock:
            self._sweep_due = min(self._sweep_due, due)

    def _retry_releases(self) -> None:
        with self._lock:
            todo = list(self._unreleased.items())
        for lease_id, wsvc in todo:
            try:
                wsvc.release(lease_id)
            except (LeaseLost, NotHeld):
                pass
            except GitLeaseError:
                continue
            with self._lock:
                self._unreleased.pop(lease_id, None)
                back = self._pending_back.pop(lease_id, None)
            if back is not None:
                with contextlib.suppress(GitLeaseError):
                    back[0].give_back(back[1])

    def _progress(self, n: int, task: str, note: str, beats: list[Any]) -> None:
        """A progress note from the task's command: sent with the lease's next renewal, shown in the view."""
        for hb in beats:
            hb.report(note)
        with self._lock:
            view = self.workers_view.get(n)
            if view is not None and view.get("task") == task:
                view["note"] = f"progress: {note}"

    def _env(self, task: WorkTask, lease_id: str, path: str, attempt: int) -> dict[str, Any]:
        doc = dict(task.to_json(), attempt=attempt, lease=lease_id, worktree=path)
        os.makedirs(self.log_dir, exist_ok=True)
        task_file = os.path.join(self.log_dir, f"{_slug(task.id)}-{lease_id}.json")
        with open(task_file, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        env: dict[str, Any] = {k: v for k, v in gitcmd.clean_env().items() if k != "LC_ALL" or "LC_ALL" in os.environ}
        env.update(
            GITLEASE_LEASE=lease_id,
            GITLEASE_TASK=task.id,
            GITLEASE_SCOPE=" ".join(task.scope),
            GITLEASE_TASK_FILE=task_file,
            GITLEASE_WORKTREE=path,
            GITLEASE_ATTEMPT=str(attempt),
        )
        env["__task"] = doc
        return env

    def _run(self, argv, cwd, env, hb, task: WorkTask, attempt: int, what: str, input: str | None = None) -> int:
        """Run ``argv`` in its own process group; stop the group when the lease is lost or on a second Ctrl-C.
        Its output goes to a log file (``<git dir>/gitlease/work-logs``)."""
        penv = {k: v for k, v in env.items() if k != "__task"}
        log = os.path.join(self.log_dir, f"{_slug(task.id)}-{attempt}-{what}.log")
        with open(log, "ab") as out:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=penv,
                    stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise _Fail(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
            if input is not None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.write(input.encode("utf-8"))
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            while True:
                try:
                    rc = proc.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    if hb.lost.is_set() or self.kill.is_set():
                        _stop_group(proc, self.opts.grace)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # what it left running in its group
        return 128 - rc if rc < 0 else rc

    # ----------------------------------------------------------------------------- landing
    def _base_branch(self) -> str:
        if self.opts.land:
            return self.opts.land
        if self._base is None:
            got = self.svc.store.default_head()
            if got is None or not got[0].startswith("refs/heads/"):
                raise UsageError(f"the remote {self.remote} has no default branch to start tasks from; pass --land")
            self._base = got[0].removeprefix("refs/heads/")
        return self._base

    def _fetch_base(self) -> tuple[str, str]:
        """Fetch the base branch now (after a grant: what landed before on these paths is in it)."""
        branch = self._base_branch()
        tracking = f"refs/remotes/{self.remote}/{branch}" if re.fullmatch(r"[\w.-]+", self.remote) else None
        dst = tracking or f"refs/gitlease/work-base/{branch}"
        with self._fetch_lock:
            res = gitcmd.run(
                ["fetch", "--quiet", "--no-tags", self.remote, f"+refs/heads/{branch}:{dst}"],
                cwd=self.svc.repo.cwd,
                check=False,
                timeout=self.svc.settings.timeout * 4,
            )
            if res.returncode != 0:
                raise RemoteUnavailable(f"cannot fetch {branch} from {self.remote}: {res.err.strip()[-300:]}")
            oid = gitcmd.run(["rev-parse", "--verify", dst], cwd=self.svc.repo.cwd).out.strip()
        return branch, oid

    def _target(self, task: WorkTask) -> str:
        return f"refs/heads/{self.opts.land}" if self.opts.land else f"refs/heads/work/{_slug(task.id)}"

    def _land(self, wsvc, n, task, prev, attempt, lease_id, path, base_ref, st) -> str | None:
        from gitlease.enforce.push import fenced_push

        target = self._target(task)
        for i in range(self.opts.land_retries + 1):
            _branch_name, fresh = self._fetch_base()
            ahead = gitcmd.run(["rev-list", "--count", f"{fresh}..HEAD"], cwd=path).out.strip()
            if ahead == "0":
                parent = prev.oid if prev else None
                if self._outcomes.write(task.id, "done", attempt, parent=parent, reason="nothing to land") is None:
                    raise _Fail("the task's outcome changed meanwhile (another runner)")
                return None
            reb = gitcmd.run(["rebase", "--quiet", fresh], cwd=path, check=False)
            if reb.returncode != 0:
                gitcmd.run(["rebase", "--abort"], cwd=path, check=False)
                raise _Fail(f"rebase onto {base_ref} failed: {(reb.err or reb.out).strip().splitlines()[-1:]}")
            head = gitcmd.run(["rev-parse", "HEAD"], cwd=path).out.strip()
            oid, _ = self._outcomes.make(task.id, "done", attempt, parent=prev.oid if prev else None, landed=head)
            try:
                fenced_push(wsvc, self.remote, [f"HEAD:{target}"], lease_id, also=[f"{oid}:{outcome_ref(task.id)}"])
                return head
            except ScopeViolation as exc:  # a lease lost meanwhile is LeaseLost (check_landing), not this
                raise _Fail(exc.message, final=True) from None
            except LeaseLost as exc:
                raise _Fail(exc.message) from None
            except PushRejected as exc:
                if i >= self.opts.land_retries:
                    raise _Fail(f"landing refused {i + 1} times: {exc.message}") from None
                with self._lock:
                    self.land_retries += 1
                    self.retries += 1
                self.emit(
                    "landing", n, task.id, message=f"not landed ({_shortened(exc.message)}); re-fetching, retrying"
                )
        raise _Fail("landing retries exhausted")


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _slug(task_id: str) -> str:
    """A task id as a branch and file name component (readable, and unique enough with a short hash)."""
    import hashlib

    base = re.sub(r"[^A-Za-z0-9._-]+", "-", task_id).strip(".-")[:60] or "task"
    if base == task_id:
        return base
    return f"{base}-{hashlib.sha1(task_id.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def _branch(task_id: str, lease_id: str) -> str:
    return f"work/{_slug(task_id)}-{lease_id[-8:]}"


# --------------------------------------------------------------------------- entry points


def run_queue(
    repo: str,
    tasks: Iterable[Any] | Callable[[], Iterable[Any]] | TaskSource,
    *,
    command: Sequence[str],
    verify: str | None = None,
    land: str | None = None,
    workers: int = 1,
    attempts: int = 3,
    granularity: str | None = None,
    ttl: int | None = None,
    remote: str | None = None,
    agent: str | None = None,
    backoff: float = 5.0,
    poll: float = 1.0,
    sweep_every: float = 30.0,
    clock: Clock = SYSTEM,
    on_event: Callable[[Event], None] | None = None,
    handle_signals: bool = False,
    runner_hook: Callable[[Runner], None] | None = None,
) -> Summary:
    """Run a queue to the end in the clone at ``repo`` and return the Summary (stable entry; docs/work.md).

    ``tasks``: a path to a JSON-lines queue file (str), an iterable of task dicts (``{"id", "paths" or
    "scope", ...}``), a callback returning the tasks queued now (called at each planning step), or a
    TaskSource. ``command``: argv run in each task's worktree. ``clock``: injected time (backoff, timings,
    leases). ``on_event``: called with each Event. ``runner_hook``: called with the Runner before it starts
    (``request_stop`` from another thread, the live view)."""
    source = make_source(repo, tasks, granularity=granularity, remote=remote)
    opts = WorkOptions(
        command=list(command),
        verify=verify,
        land=land,
        workers=workers,
        attempts=attempts,
        ttl=ttl,
        remote=remote,
        agent=agent,
        backoff=backoff,
        poll=poll,
        sweep_every=sweep_every,
    )
    runner = Runner(repo, source, opts, clock=clock, on_event=on_event)
    if runner_hook is not None:
        runner_hook(runner)
    return runner.run(handle_signals=handle_signals)


def make_source(repo: str, tasks, *, granularity: str | None = None, remote: str | None = None) -> TaskSource:
    from gitlease.core.repo import Repo
    from gitlease.plan.suggest import parse_granularity, read_tree
    from gitlease.work.queue import parse_queue

    if isinstance(tasks, TaskSource):
        return tasks
    gran = parse_granularity(granularity)
    tree = read_tree(Repo.discover(repo).cwd) if gran.kind in ("package", "auto") else None
    if isinstance(tasks, (str, os.PathLike)):
        lines, source = read_queue_file(str(tasks))
        return TaskSource(fixed=parse_queue(lines, granularity=gran, tree=tree, source=source))
    if callable(tasks):
        return TaskSource(tasks, granularity=gran, tree=tree)
    from gitlease.work.queue import from_items

    return TaskSource(fixed=from_items(list(tasks), granularity=gran, tree=tree))


def read_queue_file(path: str) -> tuple[list[str], str]:
    if path == "-":
        import sys

        return sys.stdin.read().splitlines(), "stdin"
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines(), path
    except OSError as exc:
        raise UsageError(f"cannot read queue {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"queue {path} is not UTF-8") from None


# ------------------------------------------------------------------------------ --status


@dataclass
class TaskState:
    id: str
    state: str  # done | failed | retrying | running | waiting | pending
    attempts: int = 0
    reason: str = ""
    quarantine: str | None = None
    landed: str | None = None
    lease: str | None = None
    holder: str | None = None
    scope: tuple[str, ...] = ()
    host: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "attempts": self.attempts,
            "reason": self.reason,
            "quarantine": self.quarantine,
            "landed": self.landed,
            "lease": self.lease,
            "holder": self.holder,
            "scope": list(self.scope),
            "host": self.host,
        }

    def line(self) -> str:
        bits = [f"{self.state:<8} {self.id}", f"attempts={self.attempts}"]
        if self.landed:
            bits.append(f"landed={self.landed[:12]}")
        if self.lease:
            bits.append(f"lease={self.lease} by {self.holder}")
        if self.quarantine:
            local = self.host and not self.quarantine.startswith(QUARANTINE_PREFIX)  # parked: on the store
            bits.append(f"quarantine={self.quarantine}" + (f" on {self.host}" if local else ""))
        if self.reason and self.state != "done":
            bits.append(f"reason: {self.reason}")
        return "  ".join(bits)


def queue_status(repo: str, tasks, *, granularity: str | None = None, remote: str | None = None, clock: Clock = SYSTEM):
    """Every task's state from the store: done / failed / retrying (outcome), running (claimed by a live
    lease), waiting (its scope is held), pending. Returns (list of TaskState, counts)."""
    from gitlease.plan.planner import blocking_leases
    from gitlease.service.factory import open_service

    source = make_source(repo, tasks, granularity=granularity, remote=remote)
    svc = open_service(repo, remote=remote, clock=clock)
    snap = svc.snapshot(use_cache=False)
    outs = Outcomes(svc).read(snap.listing)
    now = clock.now()
    claims: dict[str, Any] = {}
    for lv in snap.leases:
        for ref in lv.task_refs:
            with contextlib.suppress(ValueError):
                claims[decode_segment(ref[len(TASK_PREFIX) :])] = lv
    held = blocking_leases(snap, now, svc.settings.skew)
    from gitlease.core import scope as scopes

    out = []
    for t in source.tasks():
        o = outs.get(t.id)
        st = TaskState(t.id, "pending", scope=t.scope)
        if o is not None:
            st.state, st.attempts, st.reason = o.state, o.attempts, o.reason
            st.quarantine, st.landed, st.host = o.quarantine, o.landed, o.host
        v = claims.get(t.id)
        if v is not None and not (o is not None and o.final):
            st.state, st.lease = "running", v.lease_id
            st.holder = f"{v.record.owner.agent_id}@{v.record.owner.host}" if v.record else "?"
        elif st.state in ("pending", "retrying") and any(scopes.sets_overlap(p, t.scope) for _l, p in held):
            st.state = "waiting" if st.state == "pending" else st.state
        out.append(st)
    counts: dict[str, int] = {}
    for s in out:
        counts[s.state] = counts.get(s.state, 0) + 1
    return out, counts


def _shortened(text: str, limit: int = 160) -> str:
    """``text`` cut to about ``limit`` characters at a word's end, never inside a word ("..." says so)."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > 0 else limit].rstrip(" ;,:") + " ..."


__all__ = [
    "Runner",
    "WorkOptions",
    "Event",
    "Summary",
    "TaskStats",
    "TaskState",
    "run_queue",
    "queue_status",
    "make_source",
    "read_queue_file",
]
