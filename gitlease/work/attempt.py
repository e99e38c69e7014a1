"""One attempt at one queued task, from claim to release (``git lease work``, docs/work.md).

``TaskAttempt.run`` claims the task's scope and the task itself in one atomic push (a Holding: the lease is
kept exactly as ``hold()`` and ``git lease run`` keep theirs, through the per-host renewal agent, with the
progress timeout), fetches the base, attaches a clean worktree bound to the lease, runs the command and then
the verifier there, each a guarded process group (gitlease/liveness/supervise.py: stopped when the lease is
lost, when the runner stops them, and by a watchdog and kill-on-parent-death when the runner itself dies or
freezes), hands the commit to the landing (gitlease/work/landing.py), and gives everything back. A failure
is classified once (``_Fail``): re-queued with backoff up to ``--attempts``, or final at once (a refusal by
a gitlease check or a scope error, a command that cannot run), its work quarantined and parked on the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
from typing import TYPE_CHECKING, Any

from gitlease.core import gitcmd
from gitlease.core.errors import GitLeaseError, HeldError, LeaseLost, NotHeld, RemoteUnavailable
from gitlease.core.refnames import quarantine_ref
from gitlease.core.store import RefUpdate, RemoteStore
from gitlease.liveness.holding import Holding, HoldOptions
from gitlease.liveness.supervise import CANNOT_RUN, Guard
from gitlease.service.outcomes import Outcome
from gitlease.work.queue import WorkTask
from gitlease.work.report import TaskStats

if TYPE_CHECKING:
    from gitlease.service.leases import LeaseService
    from gitlease.work.runner import Runner

BACKOFF_CAP = 300.0


class _Fail(Exception):
    """An attempt that did not land: ``final`` fails the task at once (a scope violation, a refusal by a
    gitlease check, a command that cannot run); ``interrupted`` re-queues it under the same number."""

    def __init__(self, reason: str, *, final: bool = False, interrupted: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.final, self.interrupted = reason, final, interrupted


class TaskAttempt:
    """One attempt at ``task`` by worker ``n`` of ``runner`` (its options, events, counters and the store's
    outcomes are the runner's; everything of the task's own life is here)."""

    def __init__(self, runner: Runner, n: int, task: WorkTask, prev: Outcome | None) -> None:
        self.r, self.n, self.task, self.prev = runner, n, task, prev
        self.number = (prev.attempts if prev else 0) + 1
        self.holding: Holding | None = None
        self.manager: Any = None
        self.att: Any = None
        with runner._lock:
            self.st = runner.stats.setdefault(task.id, TaskStats(task.id))

    @property
    def lease_id(self) -> str:
        assert self.holding is not None
        return self.holding.lease_id

    def emit(self, kind: str, **detail: Any) -> None:
        self.r.emit(kind, self.n, self.task.id, **detail)

    # ------------------------------------------------------------------------------ claim
    def run(self, svc: LeaseService) -> None:
        r = self.r
        tsvc = r._task_service(svc, self.task)
        options = HoldOptions(ttl=r.ttl, release=True)
        try:
            self.holding = Holding.acquire(tsvc, self.task.scope, options, task=self.task.id)
        except HeldError as exc:
            with r._lock:
                r.lease_waits += 1
            self.emit("refused", message=exc.message)
            return
        except RemoteUnavailable:
            raise
        except GitLeaseError as exc:  # claimed by another runner at another scope, a hook refused
            self.emit("refused", message=exc.message)
            r._pause(r.opts.poll)
            return
        with r._lock:
            r.ran += 1
            r._granted.add(self.lease_id)
        rec = self.holding.record
        self.emit("claimed", lease=self.lease_id, scope=" ".join(rec.paths), attempt=self.number)
        started = r.clock.monotonic()
        try:
            if self._finished_elsewhere(tsvc):
                self._release()
                self.emit("released", message="another runner finished it meanwhile")
                return
            self._work()
        finally:
            spent = r.clock.monotonic() - started
            with r._lock:
                r.busy += spent
                self.st.busy += spent

    def _finished_elsewhere(self, tsvc: LeaseService) -> bool:
        """Finished (or re-queued) by another runner between our read and our claim."""
        refs = tsvc.store.list_refs()
        with self.r._lock:
            fresh = self.r._outcomes.read(refs).get(self.task.id)
        prev = self.prev
        return fresh is not None and (fresh.final or (prev is None or fresh.oid != prev.oid))

    # ------------------------------------------------------------------------------ work
    def _work(self) -> None:
        from gitlease.liveness.heartbeat import event_wait
        from gitlease.liveness.supervise import PROGRESS_ENV, ProgressFile, progress_file
        from gitlease.worktree.manager import WorktreeManager

        r, task, holding = self.r, self.task, self.holding
        assert holding is not None
        self.manager = WorktreeManager(holding.svc)
        progress = None
        try:
            base_ref, base_oid = r._fetch_base()
            self.att = self.manager.add(self.lease_id, base=base_oid, branch=branch_name(task.id, self.lease_id))
            # bound to this process until given back (also between the release and the give-back): a
            # restarted runner prunes it only once this one is dead (Runner._prune_dead)
            self.manager.mark_busy(self.att.id, f"git lease work: task {task.id}")
            holding.move(r._task_service(holding.svc, task, self.att.path))
            progress = ProgressFile(progress_file(holding.svc.held.folder, self.lease_id), self._progress)
            # waits in real time, also under an injected clock: a test clock then moves only when the runner
            # itself waits (backoff, polling), never in a renewal loop of its own
            holding.start(poll=progress.poll, wait=event_wait)
            env = self._env()
            env[PROGRESS_ENV] = progress.path  # `git lease progress NOTE` from the command
            self._run_command(env)
            if r.opts.verify:
                self._run_verifier(env)
            self.emit("landing")
            landed = r.lander.land(self, base_ref)
        except _Fail as exc:
            holding.stop()
            self._failed(exc)
            return
        except BaseException:
            holding.stop()
            self._release()
            if self.att is not None:
                with contextlib.suppress(GitLeaseError):
                    self.manager.give_back(self.att.id)
            raise
        finally:
            holding.stop()
            if progress is not None:
                progress.remove()
        self.st.state, self.st.attempts, self.st.landed = "done", self.number, landed
        self.emit("landed", commit=landed, branch=r._target(task).removeprefix("refs/heads/"))
        self._release()
        with contextlib.suppress(GitLeaseError):
            r._fetch_base()
        self._give_back(say=True)
        self.emit("done", attempt=self.number)

    def _run_command(self, env: dict[str, Any]) -> None:
        task, att = self.task, self.att
        argv = [a.replace("{id}", task.id).replace("{path}", att.path) for a in self.r.opts.command]
        self.emit("running", worktree=att.path, attempt=self.number)
        rc = self._run(argv, env, "command", input=json.dumps(env["__task"]), clock="agent")
        self._check_stop()
        if rc == CANNOT_RUN and self._cannot_run("command"):
            raise _Fail(self._cannot_run("command") or "", final=True)
        if rc != 0:
            raise _Fail(f"the command exited {rc}")
        dirt = gitcmd.run(["status", "--porcelain", "--untracked-files=all"], cwd=att.path).out.strip()
        if dirt:
            raise _Fail("the command left uncommitted changes (the runner commits nothing itself)")

    def _run_verifier(self, env: dict[str, Any]) -> None:
        self.emit("verifying")
        vrc = self._run(["sh", "-c", self.r.opts.verify or ""], env, "verify", clock="verify")
        self._check_stop()
        if vrc != 0:
            raise _Fail(f"the verifier failed (exit {vrc})")
        # what a verifier leaves untracked (build output) is not the task's work; a tracked file it changed is
        dirt = gitcmd.run(["status", "--porcelain", "--untracked-files=no"], cwd=self.att.path).out.strip()
        if dirt:
            raise _Fail("the verifier changed tracked files")

    def _check_stop(self) -> None:
        holding = self.holding
        assert holding is not None
        if holding.lost.is_set():
            raise _Fail(LeaseLost.say(self.lease_id, holding.reason or "no renewal confirmed"))
        if self.r.kill.is_set():
            raise _Fail("interrupted", interrupted=True)

    def _run(self, argv, env, what: str, *, input: str | None = None, clock: str = "agent") -> int:
        """``argv`` as a guarded process group in the task's worktree (a session of its own: a Ctrl-C typed at the
        terminal reaches the runner, not the agent); stopped when the lease is lost or the runner stops its
        commands. Its output goes to a log file (``<git dir>/gitlease/work-logs``)."""
        assert self.holding is not None
        r = self.r
        penv = {k: v for k, v in env.items() if k != "__task"}
        log = self._log_path(what)
        started = r.clock.monotonic()
        with open(log, "ab") as out:
            guard = Guard(
                self.holding,
                argv,
                env=penv,
                cwd=self.att.path,
                grace=r.opts.grace,
                stdin=input.encode("utf-8") if input is not None else b"",
                stdout=out,
                stderr=subprocess.STDOUT,
                session=True,
            )
            guard.start()
            try:
                rc = guard.wait(lambda: "the runner is stopping its commands" if r.kill.is_set() else None)
            finally:
                guard.finish_watchdog()
        spent = r.clock.monotonic() - started
        with r._lock:
            if clock == "agent":
                self.st.agent += spent
            else:
                self.st.verify += spent
        return rc

    def _log_path(self, what: str) -> str:
        return os.path.join(self.r.log_dir, f"{slug(self.task.id)}-{self.number}-{what}.log")

    def _cannot_run(self, what: str) -> str | None:
        """The gate's "cannot run" line in the log of ``what``, if the command could not be started."""
        try:
            with open(self._log_path(what), "rb") as fh:
                tail = fh.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return None
        lines = [ln for ln in tail.splitlines() if ln.startswith("git-lease: cannot run ")]
        return lines[-1].removeprefix("git-lease: ") if lines else None

    def _progress(self, note: str) -> None:
        """A progress note from the task's command: sent with the lease's next renewal, shown in the view."""
        assert self.holding is not None
        self.holding.progress(note)
        r = self.r
        with r._lock:
            view = r.workers_view.get(self.n)
            if view is not None and view.get("task") == self.task.id:
                view["note"] = f"progress: {note}"

    def _env(self) -> dict[str, Any]:
        task, path = self.task, self.att.path
        doc = dict(task.to_json(), attempt=self.number, lease=self.lease_id, worktree=path)
        os.makedirs(self.r.log_dir, exist_ok=True)
        task_file = os.path.join(self.r.log_dir, f"{slug(task.id)}-{self.lease_id}.json")
        with open(task_file, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        env: dict[str, Any] = {k: v for k, v in gitcmd.clean_env().items() if k != "LC_ALL" or "LC_ALL" in os.environ}
        env.update(
            GITLEASE_LEASE=self.lease_id,
            GITLEASE_TASK=task.id,
            GITLEASE_SCOPE=" ".join(task.scope),
            GITLEASE_TASK_FILE=task_file,
            GITLEASE_WORKTREE=path,
            GITLEASE_ATTEMPT=str(self.number),
        )
        env["__task"] = doc
        return env

    # ------------------------------------------------------------------------------ ending
    def _failed(self, exc: _Fail) -> None:
        r, task, number = self.r, self.task, self.number
        ref = None
        if self.att is not None:
            try:
                _state, ref = self.manager.give_back(self.att.id, quarantine_only=True)
            except GitLeaseError as err:
                self.emit("error", message=f"could not quarantine the worktree: {err.message}")
        if ref:
            if not exc.interrupted:  # an interrupted attempt runs again under the same number: kept here only
                ref = self._park(ref)
            self.emit("quarantined", ref=ref)
        if exc.interrupted:
            state, attempts, not_before = "retrying", number - 1, 0.0
        else:
            final = exc.final or number >= r.opts.attempts
            state, attempts = ("failed" if final else "retrying"), number
            not_before = 0.0 if final else r.clock.now() + min(BACKOFF_CAP, r.opts.backoff * 2 ** (number - 1))
        reason = exc.reason
        prev = self.prev
        try:
            wrote = r._outcomes.write(
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
            self.emit("error", message=f"outcome not recorded: {err.message}")
        self.st.attempts, self.st.reason, self.st.quarantine = attempts, reason, ref or self.st.quarantine
        if wrote is not None:
            self.st.state = state
        self._release()
        if self.att is not None:
            self._give_back()
        if exc.interrupted:
            self.emit("interrupted", quarantine=ref)
        elif state == "failed":
            self.emit("failed", message=f"{reason} (attempt {number}); work kept in {ref or 'nothing'}")
        else:
            with r._lock:
                r.retries += 1
            self.emit("retry", message=f"{reason} (attempt {number} of {r.opts.attempts})")

    def _park(self, ref: str) -> str:
        """Park the quarantined work of a failed attempt on the store too (``refs/leases-quarantine/<task>/<attempt>``,
        created only, never overwritten), and under the same name here, so that the ref its outcome names can
        be fetched from any clone. Returns that name; the local quarantine ref when the store is this
        repository or the push fails (said in an event: the work is still kept here)."""
        r = self.r
        if not isinstance(r.svc.store, RemoteStore):
            return ref
        oid = gitcmd.run(["rev-parse", "--verify", "--quiet", ref], cwd=r.svc.repo.cwd, check=False).out.strip()
        target = quarantine_ref(self.task.id, self.number)
        if not oid:
            return ref
        try:
            out = r.svc.store.apply([RefUpdate(target, oid, None)])
            ok, why = out.ok, out.message or ", ".join(f"{x} {st}" for x, st in out.statuses.items())
        except GitLeaseError as err:
            ok, why = False, err.message
        if not ok:
            self.emit("error", message=f"work kept here in {ref}, not parked on the store: {why[:200]}")
            return ref
        gitcmd.run(["update-ref", target, oid], cwd=r.svc.repo.cwd, check=False)
        return target

    def _release(self) -> None:
        """Give the lease (and the task's claim) back. Lost or gone already: nothing to give back, but a lease
        lost to an ambiguous renewal may still be on the store: swept once it must have expired. The store
        unreachable: tried again at each planning step. Refused by the store (a hook, its rules): said in an
        error event with the server's reason, and left to expire and be swept, never retried in a loop."""
        holding = self.holding
        if holding is None:
            return
        closed = holding.close(release=True)
        err = closed.release_error
        if err is None:
            if closed.lost and not closed.released:
                self.r._sweep_soon()
            return
        if isinstance(err, (LeaseLost, NotHeld)):
            self.r._sweep_soon()
        elif isinstance(err, RemoteUnavailable):
            with self.r._lock:
                self.r._unreleased[self.lease_id] = holding.svc
        else:
            self.emit("error", message=f"release of {self.lease_id} refused: {err.message}; it expires on its own")
            with self.r._lock:
                self.r._refused_releases.add(self.lease_id)  # its worktree is freed once the lease is swept
            self.r._sweep_soon()

    def _give_back(self, *, say: bool = False) -> None:
        """The task's worktree back to the pool (quarantined when it holds work: said when ``say``). One its
        lease still binds because the release failed (the store unreachable) is given back when the release
        goes through (Runner._retry_releases), not left bound to this live runner, which no prune would free."""
        r, wt = self.r, self.att.id
        try:
            state, ref = self.manager.give_back(wt)
        except GitLeaseError:
            return
        if state == "quarantined" and say:
            self.emit("quarantined", ref=ref)
        if state != "kept":
            return
        with r._lock:
            pending = self.lease_id in r._unreleased or self.lease_id in r._refused_releases
            if pending:
                r._pending_back[self.lease_id] = (self.manager, wt)
        if not pending:  # released meanwhile by another worker's retry: free now
            with contextlib.suppress(GitLeaseError):
                self.manager.give_back(wt)


def slug(task_id: str) -> str:
    """A task id as a branch and file name component (readable, and unique enough with a short hash)."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", task_id).strip(".-")[:60] or "task"
    if base == task_id:
        return base
    return f"{base}-{hashlib.sha1(task_id.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def branch_name(task_id: str, lease_id: str) -> str:
    return f"work/{slug(task_id)}-{lease_id[-8:]}"


__all__ = ["TaskAttempt", "slug", "branch_name"]
