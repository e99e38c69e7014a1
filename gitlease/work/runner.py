"""The queue runner: ``git lease work`` (docs/work.md). Each worker loops:

1. read the store (the leases, the task claims, the outcomes) and plan: queue order, skipping tasks done,
   failed, claimed anywhere or cooling down after a failed attempt (gitlease.plan.planner);
2. acquire the next startable task's scope AND its claim ``refs/leases/task/<task>`` in one atomic push
   (``LeaseService.acquire(task=...)``): two workers, on one host or many, never run one task; the claims of
   this runner's workers that meet go in one push (``claims``, gitlease/core/pushgroup.py);
3. fetch the base after the grant (what an earlier task on these paths landed is in it), attach a clean
   worktree on a task branch (gitlease.worktree.manager);
4. run the command there under heartbeats (the task as JSON on stdin and in ``$GITLEASE_TASK_FILE``;
   ``$GITLEASE_LEASE``, ``$GITLEASE_TASK``, ``$GITLEASE_SCOPE``; ``{id}`` and ``{path}`` expanded), then the
   verifier in the same worktree;
5. land on the runner's landing train (gitlease/work/landing.py): commit nothing itself; the ready tasks'
   commits, scope-checked and rebased onto the fresh base, land in one atomic push with each task's lease
   release (its claim with it) and its ``done`` outcome (a task lands exactly once); a non-fast-forward
   backs off, re-fetches, rebases and retries (bounded);
6. give the worktree back to the pool.

Each attempt runs in a thread of its own; its worker waits for it only until the task is verified, then plans
its next task while this one lands (a worker is one agent at a time; the landing keeps the task's lease).

A refused lease (exit 3) waits; a lost lease (6), a crash or a failed verifier re-queues the task with
backoff up to ``attempts`` (its work quarantined and the ref named in its outcome); a path outside the scope
refused at landing (4) fails the task at once, work kept. Outcomes live on the store
(gitlease.service.outcomes): a second runner on another clone cooperates, a restarted one resumes.

This module schedules; one task's attempt is gitlease/work/attempt.py, its landing gitlease/work/landing.py,
what is reported gitlease/work/report.py, ``--status`` gitlease/work/status.py. Signals
(gitlease/liveness/interrupts.py): the first Ctrl-C takes no more tasks and lets the running ones finish; a
second one, or SIGTERM / SIGHUP, stops the running commands (their work quarantined); every lease is released
and the exit code is 128 + the signal.

The stable entry for Python (and the fleet soak): ``run_queue``. It prints nothing: events go to ``on_event``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gitlease.core import gitq
from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.errors import GitLeaseError, LeaseLost, NotHeld, RemoteUnavailable, UsageError
from gitlease.core.pushgroup import PushGroup
from gitlease.core.refnames import TASK_PREFIX, decode_segment
from gitlease.liveness.interrupts import Interrupts
from gitlease.service.leases import LeaseService
from gitlease.service.outcomes import Outcome, Outcomes
from gitlease.work.attempt import TaskAttempt, slug
from gitlease.work.landing import Lander
from gitlease.work.queue import TaskSource, WorkTask
from gitlease.work.report import Event, Summary, TaskStats
from gitlease.work.status import TaskState, queue_status

ACTIVE = ("claimed", "running", "verifying", "landing")  # a worker's states while it works on a task
LAND_RETRIES = 20  # non-fast-forward retries of one landing (re-fetch, rebase, push)


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
    allow_extend: bool = False  # land paths a task's lease was extended to beyond the task's own scope
    task_timeout: float | None = None  # stop a task's command (and verifier) after this long (lease.taskTimeout)
    rerun: Sequence[str] = ()  # tasks to reopen first (a final outcome: done or failed), recorded on the store

    def check(self) -> None:
        if not self.command:
            raise UsageError("git lease work needs a command after --: git lease work QUEUE -- ./agent.sh")
        if self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.attempts < 1:
            raise UsageError("--attempts must be at least 1")


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
        if not self.svc.store.capabilities.branches:
            raise UsageError(
                "git lease work lands through a fenced push: it needs the lease store on a remote "
                "(git config lease.remote origin)"
            )
        self.remote: str = self.svc.settings.remote or ""  # a store that carries branches is a git remote
        from gitlease.enforce.agenthooks import unfenced
        from gitlease.service.verdict import doctor_gate

        doctor_gate(self.svc)  # the server's doctor verdict: a warning (run() says it), or refused at once

        why = unfenced(list(options.command), cwd=self.svc.repo.cwd)  # a coding agent whose hooks would not run
        if why:
            raise UsageError(f"git lease work will not start an unfenced agent: {why}")
        self.ttl = int(options.ttl or self.svc.settings.ttl)
        self.task_timeout = options.task_timeout or self.svc.settings.task_timeout
        self.stop = threading.Event()  # take no more tasks
        self.kill = threading.Event()  # stop running commands too
        self._lock = threading.RLock()
        self._fetch_lock = threading.Lock()
        self._fetches_started = 0  # fetches of the base begun (numbered from 1), and the last one done: (number, oid)
        self._fetched: tuple[int, str] | None = None
        self._outcomes = Outcomes(self.svc)
        self.claims = PushGroup()  # the workers' claims, pushed together when they meet (_task_service)
        self._inflight: set[str] = set()
        self._granted: set[str] = set()  # every lease this runner was granted (its final sweep's concern)
        self._attempting: set[str] = set()  # the leases of attempts not ended yet
        self._unreleased: dict[str, LeaseService] = {}  # leases whose release failed: the store unreachable
        self._refused_releases: set[str] = set()  # leases whose release the store refused: left to the sweep
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
        self._signals_seen = 0
        self._interrupts: Interrupts | None = None
        self.signal = 0  # the signal that interrupted the run, 0: none
        self.lander = Lander(self)
        # tasks whose worker went on to its next task once they were verified: landing in their own thread
        # (task -> what the live view shows of it); and the threads of every attempt begun
        self._landing: dict[str, dict[str, Any]] = {}
        self._attempt_threads: list[threading.Thread] = []
        self._changed = threading.Condition()  # told when an attempt ends or the runner stops taking tasks
        self._generation = 0
        self.last_outcomes: dict[str, Outcome] = {}
        self.finished: dict[str, str] = {}  # task -> done | failed, as this runner saw it (before the next read)
        self.last_tasks: list[str] = []
        self.conflicts: dict[str, str] = {}  # task -> why it was refused (final on the store, other content)
        self._said: set[tuple[str, str]] = set()  # what was reported once

    def view(self) -> dict[str, Any]:
        """What a live view shows: each worker (task, its scope, state, seconds in it, last note), the tasks
        landing after their worker went on, counts, and the leases blocking the queue's head."""
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
            landing = [
                {"task": t, "state": v["state"], "elapsed": now - v["since"], "worker": v["worker"]}
                for t, v in sorted(self._landing.items())
            ]
            outs = {t: o.state for t, o in self.last_outcomes.items()}
            outs.update(self.finished)  # what this runner finished since the store was last read
            tasks = list(self.last_tasks)
            blockers = list(self.head_blockers)
        running = sum(1 for w in workers if w["task"] and w["state"] in ACTIVE) + len(landing)
        done = sum(1 for t in tasks if outs.get(t) == "done")
        failed = sum(1 for t in tasks if outs.get(t) == "failed")
        return {
            "workers": workers,
            "landing": landing,
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
            behind = self._landing.get(task) if task is not None else None
            if behind is not None:  # its worker went on to another task: the live view lists it apart
                behind.update(state=kind, since=self.clock.monotonic())
            elif worker >= 0:
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
        self._poke(everyone=True)
        self.emit("stopping", -1, message="taking no more tasks; running ones finish (Ctrl-C again stops them)")
        return False

    def _handle_signals(self, interrupts: Interrupts | None) -> None:
        """Act on the signals counted since the last look (in the main thread, never in a handler): the first
        Ctrl-C stops taking tasks; a second one, SIGTERM or SIGHUP stops the running commands too."""
        if interrupts is None or interrupts.seq == self._signals_seen:
            return
        self._signals_seen = interrupts.seq
        if interrupts.any and not self.stop.is_set():
            self.stop.set()
            self._poke(everyone=True)
            self.emit("stopping", -1, message="taking no more tasks; running ones finish (Ctrl-C again stops them)")
        if interrupts.stop_now and not self.kill.is_set():
            self.kill.set()
            self.emit("stopping", -1, message="stopping the running commands (their work is quarantined)")
        code = interrupts.exit_code()
        self.signal = code - 128 if code else 0

    def _poke(self, everyone: bool = False) -> None:
        """Something changed for the workers waiting on this runner's own tasks (an attempt ended, a task was
        taken, the runner stops): one of them plans again (``everyone``: all). A worker that then takes a task, or
        finds the queue finished, passes the word on; one that finds nothing to start waits again, so an ended
        attempt costs one read of the store, not one per idle worker."""
        with self._changed:
            self._generation += 1
            if everyone:
                self._changed.notify_all()
            else:
                self._changed.notify(1)

    def _wait_change(self, generation: int, seconds: float) -> None:
        """Wait, in real time (an injected clock does not move), until told of a change (``_poke``) or for
        ``seconds``; at once when one came since ``generation`` was read: a worker whose next task waits for
        this runner's own tasks (landing, or blocking it) starts it as soon as they end."""
        with self._changed:
            if self._generation == generation and not self.stop.is_set():
                self._changed.wait(timeout=seconds)

    def _pause(self, seconds: float) -> None:
        if type(self.clock).sleep is Clock.sleep:
            self.stop.wait(seconds)
        else:
            self.clock.sleep(seconds)
            self.stop.wait(0.01)

    # --------------------------------------------------------------------------------- run
    def run(self, *, handle_signals: bool = True) -> Summary:
        start = self.clock.monotonic()
        for line in self.svc.warnings:  # the doctor's verdict, said once (gitlease/service/verdict.py)
            self.emit("warning", -1, message=line)
        if not self.opts.land:  # no default branch to start from: a usage error now, before any task is claimed
            with contextlib.suppress(RemoteUnavailable):  # the store away: each attempt asks again (and retries)
                self._base_branch()
        # counts only (gitlease/liveness/interrupts.py); acted on below, in this thread
        interrupts = self._interrupts = Interrupts().install() if handle_signals else None
        try:
            self._reopen(self.opts.rerun)
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
                    self._handle_signals(interrupts)
            while True:  # the attempts still landing (their workers stopped taking tasks)
                with self._lock:
                    alive = [t for t in self._attempt_threads if t.is_alive()]
                if not alive:
                    break
                alive[0].join(0.1)
                self._handle_signals(interrupts)
            self._handle_signals(interrupts)
            self._final_sweep()
            with self._lock:  # worktrees whose lease's release never went through: free once it expired
                pending, self._pending_back = list(self._pending_back.values()), {}
            for manager, wt in pending:
                with contextlib.suppress(GitLeaseError):
                    manager.give_back(wt)
            self._prune_dead(-1)  # what a dead runner's command still ran in at the start is free by now
        finally:
            if interrupts is not None:
                interrupts.restore()
        return self._summary(self.clock.monotonic() - start)

    def _reopen(self, ids: Sequence[str]) -> None:
        """``--rerun ID``: each task's final outcome replaced by a ``rerun`` child (its attempts start again),
        written on the store before anything runs: the outcome's history records who reopened it and when."""
        if not ids:
            return
        outs = self._outcomes.read(self.svc.store.list_refs())
        by_id = {t.id: t for t in self.source.tasks()}
        for tid in ids:
            o, task = outs.get(tid), by_id.get(tid)
            if task is None:
                raise UsageError(f"--rerun {tid}: no task {tid!r} in this queue")
            if o is None or not o.final:
                self.emit("rerun", -1, tid, message=f"{tid} is not done or failed on the store: it runs as queued")
                continue
            why = f"reopened by {self.svc.settings.agent} (git lease work --rerun; it was {o.state})"
            got = self._outcomes.write(tid, "retrying", 0, parent=o.oid, reason=why, digest=task.digest, rerun=True)
            if got is None:
                raise GitLeaseError(f"--rerun {tid}: its outcome changed meanwhile (another runner); try again")
            self.emit("rerun", -1, tid, message=why)

    def _summary(self, makespan: float) -> Summary:
        tasks = self.source.tasks()
        try:
            outs = self._outcomes.read(self.svc.store.list_refs())
        except GitLeaseError:
            outs = {}
        for t in tasks:
            st = self.stats.setdefault(t.id, TaskStats(t.id))
            o = outs.get(t.id)
            if t.id in self.conflicts:  # refused: what the store says is another task's
                st.state, st.reason = "failed", self.conflicts[t.id]
            elif o is not None:
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
            signal=self.signal,
        )

    # ------------------------------------------------------------------------------ worker
    def _worker(self, n: int) -> None:
        from gitlease.service.factory import open_service

        svc = open_service(
            self.svc.repo.cwd, remote=self.opts.remote, clock=self.clock, signer=self.svc.signer, agent=self.opts.agent
        )
        idle = 0
        while not self.stop.is_set():
            generation = self._generation
            try:
                pick = self._next(svc, n)
            except RemoteUnavailable as exc:
                self.emit("error", n, message=f"cannot read the store: {exc.message}; trying again")
                self._pause(min(30.0, self.opts.poll * 2 ** min(idle, 5)))
                idle += 1
                continue
            if pick is None:
                self._poke()  # the next idle worker finds the queue finished too
                break
            if pick == "wait":
                seconds = min(5.0, self.opts.poll * (1.5 ** min(idle, 4)))
                with self._lock:
                    own = bool(self._inflight)
                if own:  # what it waits for may be this runner's own tasks: woken when one ends
                    self._wait_change(generation, seconds)
                else:
                    self._pause(seconds)
                idle += 1
                continue
            idle = 0
            task, prev = pick
            at = TaskAttempt(self, n, task, prev)
            thread = threading.Thread(
                target=self._attempt, args=(at, svc), name=f"gitlease-task-{n}-{slug(task.id)}", daemon=True
            )
            with self._lock:
                self._attempt_threads = [t for t in self._attempt_threads if t.is_alive()] + [thread]
            thread.start()
            self._poke()  # an idle worker looks for another task that can start now
            at.slot.wait()  # until its task is verified and waits to land, or the attempt ended
            if at.trouble:
                self._pause(self.opts.poll)
        with self._lock:
            self.workers_view.setdefault(n, {}).update(state="finished", task=None)

    def _attempt(self, at: TaskAttempt, svc: LeaseService) -> None:
        """One attempt, in its own thread: its worker waits for it only until the task is verified (``_detach``),
        then takes its next task while this one lands."""
        try:
            at.run(svc)
        except GitLeaseError as exc:  # the store went away mid-task, a git failure: the task is re-planned
            at.trouble = True
            self.emit("error", at.n, at.task.id, message=exc.message)
        except Exception as exc:  # a bug: said in one line; its lease was given back, its attempt counts
            at.trouble = True
            self.emit("error", at.n, at.task.id, message=f"internal error: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._inflight.discard(at.task.id)
                self._landing.pop(at.task.id, None)
            at.slot.set()
            self._poke()

    def _detach(self, at: TaskAttempt) -> None:
        """``at``'s task is verified and waits to land: its worker goes on to its next task (one agent at a time
        per worker; the landing keeps the task's lease and worktree until its commit is on the branch)."""
        now = self.clock.monotonic()
        with self._lock:
            self._landing[at.task.id] = {"state": "landing", "since": now, "worker": at.n}
            view = self.workers_view.setdefault(at.n, {})
            view.update(state="idle", task=None, since=now, note=f"{at.task.id}: landing")
            view.pop("scope", None)
        at.slot.set()

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
                    task_id = decode_segment(ref[len(TASK_PREFIX) :])
                    if self._settle_unclear_claim(svc, n, task_id, v):
                        continue
                    claimed[task_id] = v.lease_id
        self._note_ignored(n)
        unfinished = [
            t for t in tasks if not self._conflicting(n, t, outs.get(t.id)) and not (t.id in outs and outs[t.id].final)
        ]
        for t in unfinished:
            o = outs.get(t.id)
            if o is not None and o.state == "running" and t.id not in claimed and t.id not in self._inflight:
                outs[t.id] = self._dead_attempt(n, t, o)  # its runner died mid-attempt: that attempt counts
        unfinished = [t for t in unfinished if not (t.id in outs and outs[t.id].final)]
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
        # this runner's own tasks in flight block what overlaps them even before their claims are listed: a
        # claim that the store would refuse is not pushed
        by_task = {t.id: t for t in tasks}
        mine = [(f"task {tid} (this runner)", tuple(by_task[tid].scope)) for tid in sorted(busy_here) if tid in by_task]
        the_plan = plan([t.plan_task() for t in ready], blocking_leases(snap, now, skew) + mine)
        by_id = {t.id: t for t in ready}
        head = the_plan.blocked[0] if the_plan.blocked else None
        waits, pick = [], None
        with self._lock:
            self.head_blockers = list(head.leases) if head and ready and head.id == ready[0].id else []
            for b in the_plan.blocked:
                if b.leases and (b.id, b.leases[0]) not in self._waited:
                    self._waited.add((b.id, b.leases[0]))
                    self.lease_waits += 1
                    waits.append(b)
            for tid in the_plan.start:
                if tid not in self._inflight:
                    self._inflight.add(tid)
                    pick = by_id[tid], outs.get(tid)
                    break
        for b in waits:  # said outside the lock: a listener (the live view) reads the runner's state under it
            self.emit("waiting", n, b.id, message=f"scope held by {' '.join(b.leases)}")
        return pick or "wait"

    def _settle_unclear_claim(self, svc: LeaseService, n: int, task_id: str, v) -> bool:
        """A claim this very process made that no attempt of it is on: its acquire never said so (the push landed
        after the client gave up: the store went away meanwhile), or its attempt ended and the release did not
        take it off the store. Nobody works on it, so it is released now, not left blocking the task until it
        expires. True when it was."""
        rec = v.record
        if rec is None or rec.owner.pid != os.getpid() or rec.owner.host != os.uname().nodename:
            return False
        with self._lock:
            if (
                task_id in self._inflight
                or v.lease_id in self._attempting
                or v.lease_id in self._unreleased
                or v.lease_id in self._refused_releases
            ):
                return False  # an attempt of this runner is on it; its release is retried, or refused for good
        tsvc = LeaseService(
            svc.repo, dataclasses.replace(svc.settings, task=task_id), clock=self.clock, signer=svc.signer
        )
        try:
            tsvc._remember(rec, v.current_oid or v.grant_oid, v.grant_oid or v.current_oid, task_id)
            tsvc.release(v.lease_id)
        except GitLeaseError as exc:
            # gone since this step's read (its attempt released it meanwhile): nothing to settle, and nothing to
            # say; this step counts it as claimed, as it read it, and the next step's read no longer lists it
            if not (isinstance(exc, LeaseLost) and exc.details.get("gone")):
                self.emit("error", n, task_id, message=f"an unclear claim of this runner ({v.lease_id}): {exc.message}")
            return False
        self.emit("released", n, task_id, message=f"an unclear claim of this runner ({v.lease_id}) settled")
        return True

    def _note_ignored(self, n: int) -> None:
        """An outcome whose signature does not verify on a signed store is left out; say so, once each."""
        for task, why in self._outcomes.ignored.items():
            if (task, why) not in self._said:
                self._said.add((task, why))
                self.emit("error", n, task, message=f"outcome of {task} ignored: {why}")

    def _conflicting(self, n: int, task: WorkTask, o: Outcome | None) -> bool:
        """A task whose id is final on the store with other content (another queue's task of the same id):
        refused, never run and never taken for done; ``--rerun ID`` runs it again."""
        if o is None or not o.final or o.digest is None or o.digest == task.digest:
            return False
        why = (
            f"task {task.id} is {o.state} on the store ({o.oid and o.oid[:12]}, {o.at} by {o.by}) with other "
            f"content than this queue's line; git lease work --rerun {task.id} runs it again"
        )
        with self._lock:
            self.conflicts[task.id] = why
        if ("conflict", task.id) not in self._said:
            self._said.add(("conflict", task.id))
            self.emit("refused", n, task.id, message=why)
        return True

    def _dead_attempt(self, n: int, task: WorkTask, o: Outcome) -> Outcome:
        """A ``running`` outcome without a claim: the attempt's runner died (kill -9, a crash). It counts: the
        task is failed once it had its attempts, else it may run again at once."""
        if o.attempts < self.opts.attempts:
            return Outcome(task.id, "retrying", o.attempts, o.reason, o.quarantine, at=o.at, oid=o.oid)
        reason = f"attempt {o.attempts} never finished (its runner stopped mid-task)"
        got = self._outcomes.write(
            task.id, "failed", o.attempts, parent=o.oid, reason=reason, digest=task.digest, quarantine=o.quarantine
        )
        if got is not None:
            self.emit("failed", n, task.id, message=f"{reason} (attempt {o.attempts})")
            return got
        return o

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
                if self._linger(min(latest, end) - now):  # told to stop now: they expire on their own
                    ids = " ".join(v.lease_id for v in left)
                    self.emit("stopping", -1, message=f"not waiting for {ids} to expire: a sweeper reclaims them")
                    return
                continue
            try:
                got = Sweeper(self.svc).sweep()
            except GitLeaseError as exc:
                self.emit("error", -1, message=f"sweep: {exc.message}")
                return
            for r in got.results:
                if r.outcome == "reclaimed":
                    self.emit("swept", -1, r.owner, message=r.line())
            if self.clock.now() >= end or self._linger(1.0):
                return

    def _linger(self, seconds: float) -> bool:
        """Wait ``seconds`` (the injected clock's own time when there is one) unless told to stop now (a second
        Ctrl-C, SIGTERM, SIGHUP, ``request_stop`` twice): True when told. The signals are looked at here too,
        since the workers are done and nothing else does."""
        if type(self.clock).sleep is not Clock.sleep:
            self.clock.sleep(seconds)
            return self.kill.is_set()
        end = self.clock.monotonic() + seconds
        while self.clock.monotonic() < end:
            self._handle_signals(self._interrupts)
            if self.kill.is_set():
                return True
            self.kill.wait(min(0.2, max(0.0, end - self.clock.monotonic())))
        return self.kill.is_set()

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
                    by_branch = {f"work/{slug(t.id)}-": t.id for t in self.source.tasks()}
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
        if at is None:  # its claim: pushed together with the claims of other workers that meet it (pushgroup.py)
            claim = LeaseService(
                svc.repo, dataclasses.replace(svc.settings, task=task.id), clock=self.clock, signer=svc.signer
            )
            claim.store.group = self.claims
            return claim
        from gitlease.service.factory import open_service

        return open_service(
            at, remote=self.opts.remote, clock=self.clock, signer=svc.signer, agent=self.opts.agent, task=task.id
        )

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
        """Fetch the base branch now (after a grant: what landed before on these paths is in it). One fetch at
        a time; a fetch that started after this call serves it too (workers waiting together share one)."""
        branch = self._base_branch()
        tracking = f"refs/remotes/{self.remote}/{branch}" if re.fullmatch(r"[\w.-]+", self.remote) else None
        dst = tracking or f"refs/gitlease/work-base/{branch}"
        from gitlease.worktree.manager import pool_lock

        want = self._fetches_started + 1  # a fetch numbered this or later started after this call
        # not during a `git worktree add` (fetch walks every worktree's HEAD)
        with self._fetch_lock:
            done = self._fetched
            if done is not None and done[0] >= want:
                return branch, done[1]
            self._fetches_started += 1
            number = self._fetches_started
            with pool_lock(self.svc.repo, shared=True):
                cwd = self.svc.repo.cwd
                timeout = self.svc.settings.timeout * 4
                err = gitq.fetch_ref(cwd, self.remote, f"refs/heads/{branch}", dst, timeout=timeout)
                oid = gitq.rev_parse(cwd, dst) if err is None else None
            if oid is None:
                raise RemoteUnavailable(f"cannot fetch {branch} from {self.remote}: {(err or '').strip()[-300:]}")
            self._fetched = (number, oid)
        return branch, oid

    def _target(self, task: WorkTask) -> str:
        return f"refs/heads/{self.opts.land}" if self.opts.land else f"refs/heads/work/{slug(task.id)}"


# --------------------------------------------------------------------------- entry points


def run_queue(
    repo: str,
    tasks: Iterable[Any] | Callable[[], Iterable[Any]] | TaskSource,
    *,
    command: Sequence[str],
    granularity: str | None = None,
    clock: Clock = SYSTEM,
    on_event: Callable[[Event], None] | None = None,
    handle_signals: bool = False,
    runner_hook: Callable[[Runner], None] | None = None,
    **options: Any,
) -> Summary:
    """Run a queue to the end in the clone at ``repo`` and return the Summary (stable entry; docs/work.md).

    ``tasks``: a path to a JSON-lines queue file (str), an iterable of task dicts (``{"id", "paths" or
    "scope", ...}``), a callback returning the tasks queued now (called at each planning step), or a
    TaskSource. ``command``: argv run in each task's worktree. ``options``: any other field of WorkOptions
    (``verify``, ``land``, ``workers``, ``attempts``, ``ttl``, ``remote``, ``task_timeout``, ...). ``clock``:
    injected time (backoff, timings, leases). ``on_event``: called with each Event. ``runner_hook``: called
    with the Runner before it starts (``request_stop`` from another thread, the live view)."""
    source = make_source(repo, tasks, granularity=granularity, remote=options.get("remote"))
    opts = WorkOptions(command=list(command), **options)
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
    """The queue file's lines (``-``: stdin) and where they came from (UsageError when it cannot be read)."""
    from gitlease.plan.planner import read_lines

    return read_lines(path, "queue")


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
