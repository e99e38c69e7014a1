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
import threading
from typing import TYPE_CHECKING, Any

from gitlease.core import gitq, hookgit
from gitlease.core.errors import GitLeaseError, HeldError, LeaseLost, NotHeld, RemoteUnavailable
from gitlease.core.refnames import quarantine_ref
from gitlease.core.store import RefUpdate
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
    gitlease check, a command that cannot run); ``interrupted`` re-queues it under the same number at once;
    not ``counted`` (the store unreachable) re-queues it under the same number after the backoff; ``ready``
    (a landing fault: its lease lost, the server away) parks its verified commit, and the next attempt only
    lands it."""

    def __init__(
        self,
        reason: str,
        *,
        final: bool = False,
        interrupted: bool = False,
        counted: bool = True,
        ready: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason, self.final, self.interrupted, self.ready = reason, final, interrupted, ready
        self.counted = counted and not interrupted


class TaskAttempt:
    """One attempt at ``task`` by worker ``n`` of ``runner`` (its options, events, counters and the store's
    outcomes are the runner's; everything of the task's own life is here)."""

    def __init__(self, runner: Runner, n: int, task: WorkTask, prev: Outcome | None) -> None:
        self.r, self.n, self.task, self.prev = runner, n, task, prev
        self.number = (prev.attempts if prev else 0) + 1
        self.holding: Holding | None = None
        self.outcome: str | None = None  # this attempt's ``running`` outcome, once claimed
        self.deadline: float | None = None  # when its commands are stopped (--task-timeout)
        self.timed_out = False
        self.manager: Any = None
        self.att: Any = None
        self.slot = threading.Event()  # set when its worker may take the next task (Runner._detach, or the end)
        self.trouble = False  # ended by an error of the store or git: its worker pauses before the next read
        with runner._lock:
            self.st = runner.stats.setdefault(task.id, TaskStats(task.id))

    @property
    def lease_id(self) -> str:
        return self.held.lease_id

    @property
    def held(self) -> Holding:
        """The attempt's lease, once claimed."""
        assert self.holding is not None
        return self.holding

    def emit(self, kind: str, **detail: Any) -> None:
        self.r.emit(kind, self.n, self.task.id, **detail)

    # ------------------------------------------------------------------------------ claim
    def run(self, svc: LeaseService) -> None:
        """Claim the task, its scope and its ``running`` outcome (this attempt counted on the store) in one
        atomic push, then work on it. An outcome that moved since the runner read it (another runner) gives the
        claim back at once, unrun."""
        r, task = self.r, self.task
        tsvc = r._task_service(svc, task)
        options = HoldOptions(ttl=r.ttl, release=True)
        parent = self._parent()
        running, _ = r._outcomes.make(
            task.id, "running", self.number, parent=parent, digest=task.digest, quarantine=self._kept()
        )
        try:
            self.holding = Holding.acquire(
                tsvc, task.scope, options, task=task.id, piggyback=[r._outcomes.update(task.id, running, parent)]
            )
        except HeldError as exc:
            with r._lock:
                r.lease_waits += 1
            self.emit("refused", message=exc.message)
            return
        except RemoteUnavailable:
            raise
        except GitLeaseError as exc:  # claimed by another runner meanwhile; else the claim itself fails
            if self._claimed_elsewhere(tsvc):
                self.emit("refused", message=exc.message)
                r._pause(r.opts.poll)
            else:  # a stray claim ref, a refusal by the store: counted like any failed attempt, never a loop
                self._claim_failed(exc)
            return
        with r._lock:
            r.ran += 1
            r._granted.add(self.lease_id)
            r._attempting.add(self.lease_id)
        rec = self.holding.record
        self.emit("claimed", lease=self.lease_id, scope=" ".join(rec.paths), attempt=self.number)
        if not self.holding.piggybacked:  # its outcome moved meanwhile: finished or re-queued by another runner
            self._release()
            self.emit("released", message="another runner finished it meanwhile")
            return
        self.outcome = running  # the outcome this attempt's next one replaces
        started = r.clock.monotonic()
        self.deadline = started + r.task_timeout if r.task_timeout else None  # --task-timeout, from the claim
        try:
            self._work()
        finally:
            spent = r.clock.monotonic() - started
            with r._lock:
                r.busy += spent
                self.st.busy += spent
                # ended: a claim of it still on the store (its release failed quietly) is the runner's to settle
                r._attempting.discard(self.lease_id)

    def _kept(self) -> str | None:
        """The work an earlier attempt kept (its quarantine ref), named by each later outcome until one keeps
        work of its own: a task that fails in an attempt that kept nothing (its runner killed mid-task, a claim
        that never ran) still names the work it has."""
        return self.prev.quarantine if self.prev is not None else None

    def _parent(self) -> str | None:
        """The outcome this attempt's first outcome replaces: the one read, or one the runner ignored (its
        signature did not verify: replaced, never taken for the task's state)."""
        if self.prev is not None:
            return self.prev.oid
        with self.r._lock:
            return self.r._outcomes.listed.get(self.task.id)

    def _claimed_elsewhere(self, tsvc: LeaseService) -> bool:
        """Whether a live lease of someone else claims this task now."""
        from gitlease.core.refnames import task_ref

        try:
            snap = tsvc.snapshot(use_cache=False, paths=self.task.scope)
        except GitLeaseError:
            return True  # cannot tell: not the task's fault
        ref = task_ref(self.task.id)
        now, skew = self.r.clock.now(), tsvc.settings.skew
        return any(ref in v.task_refs and v.state(now, skew) in ("active", "grace") for v in snap.leases)

    def _claim_failed(self, exc: GitLeaseError) -> None:
        """The claim push refused for a reason of the task's own (a stray claim ref, a server hook's refusal):
        the attempt is counted on the store (pinned to the outcome the runner read), with its backoff."""
        r, number = self.r, self.number
        final = number >= r.opts.attempts
        state = "failed" if final else "retrying"
        not_before = 0.0 if final else r.clock.now() + min(BACKOFF_CAP, r.opts.backoff * 2 ** (number - 1))
        reason = f"the claim was refused: {exc.message}"
        parent = self._parent()
        got = r._outcomes.write(
            self.task.id, state, number, parent=parent, reason=reason, not_before=not_before, digest=self.task.digest
        )
        self.st.attempts, self.st.reason = number, reason
        if got is None:
            self.emit("error", message=f"outcome not recorded: {reason}")
            return
        self.st.state = state
        if final:
            self.emit("failed", message=f"{reason} (attempt {number})")
        else:
            with r._lock:
                r.retries += 1
            self.emit("retry", message=f"{reason} (attempt {number} of {r.opts.attempts})")

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
            # the lease now lives in the worktree's held state: renewed and released from there, also when the
            # next step fails (released from the clone, it was "not held" and stayed on the store)
            holding.move(r._task_service(holding.svc, task, self.att.path))
            # bound to this process until given back (also between the release and the give-back): a
            # restarted runner prunes it only once this one is dead (Runner._prune_dead)
            self.manager.mark_busy(self.att.id, f"git lease work: task {task.id}")
            progress = ProgressFile(progress_file(holding.svc.held.folder, self.lease_id), self._progress)
            # waits in real time, also under an injected clock: a test clock then moves only when the runner
            # itself waits (backoff, polling), never in a renewal loop of its own
            holding.start(poll=progress.poll, wait=event_wait)
            ready = self.prev.ready if self.prev is not None else None
            if ready and self._restore(ready):
                note = {"message": f"its verified work ({ready}): landing only, the agent does not run again"}
            else:
                env = self._env()
                env[PROGRESS_ENV] = progress.path  # `git lease progress NOTE` from the command
                self._run_command(env)
                if r.opts.verify:
                    self._run_verifier(env)
                note = {}
            r._detach(self)  # its worker takes the next task while this one lands
            self.emit("landing", **note)
            landed = r.lander.land(self, base_ref)
        except _Fail as exc:
            holding.stop()
            self._failed(exc)
            return
        except RemoteUnavailable as exc:  # the store or the base went away: not the task's fault, not counted
            holding.stop()
            self._failed(_Fail(exc.message, counted=False))
            return
        except GitLeaseError as exc:  # anything else ends this attempt, counted (a broken worktree, a git error)
            holding.stop()
            self._failed(_Fail(exc.message))
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
        if not self._shared(landed):  # else the landing push moved the remote-tracking branch already
            with contextlib.suppress(GitLeaseError):
                r._fetch_base()  # so that giving the worktree back finds its commits on the remote
        self._give_back(say=True)
        self.emit("done", attempt=self.number)

    def _shared(self, landed: str | None) -> bool:
        """Whether another branch, a remote-tracking branch or a tag of this clone holds ``landed`` already (a
        landing push to a named remote moves its remote-tracking branch itself): no fetch needed for the give-back
        to find the task's commits shared."""
        if landed is None:
            return False
        return gitq.count_unshared(self.r.svc.repo.cwd, landed, self.att.branch) == 0

    def _restore(self, ref: str) -> bool:
        """The verified commit an earlier attempt parked at ``ref`` (on the store), checked out in this attempt's
        worktree to be landed again; False when it cannot be had (then the agent runs again)."""
        r = self.r
        cwd = r.svc.repo.cwd
        fetched = gitq.fetch_ref(cwd, r.remote, ref, ref) is None if r.remote else True
        oid = gitq.rev_parse_commit(cwd, ref)
        if not fetched or oid is None:
            self.emit("error", message=f"the verified work of an earlier attempt ({ref}) cannot be fetched; rerunning")
            return False
        gitq.reset_hard(self.att.path, oid)
        return True

    def _run_command(self, env: dict[str, Any]) -> None:
        task, att = self.task, self.att
        argv = [a.replace("{id}", task.id).replace("{path}", att.path) for a in self.r.opts.command]
        self.emit("running", worktree=att.path, attempt=self.number)
        rc = self._run(argv, env, "command", input=json.dumps(env["__task"]), clock="agent")
        self._check_stop()
        if rc == CANNOT_RUN and self._cannot_run("command"):
            raise _Fail(self._cannot_run("command") or "", final=True)
        if rc != 0:
            said = self._log_lines("command", "")
            refused = [i for i, ln in enumerate(said) if ln.startswith("gitlease: ") and " refused" in ln]
            if refused:  # a gitlease check refused what it did: running it again changes nothing
                i = refused[-1]
                detail = f"; {said[i + 1]}" if i + 1 < len(said) and not said[i + 1].startswith("gitlease:") else ""
                raise _Fail(f"the command exited {rc}: {said[i]}{detail}", final=True)
            raise _Fail(f"the command exited {rc}" + (f": {said[-1][:300]}" if said else ""))
        if gitq.status(att.path):
            raise _Fail("the command left uncommitted changes (the runner commits nothing itself)")

    def _run_verifier(self, env: dict[str, Any]) -> None:
        self.emit("verifying")
        vrc = self._run(["sh", "-c", self.r.opts.verify or ""], env, "verify", clock="verify")
        self._check_stop()
        if vrc != 0:
            said = self._log_lines("verify", "")
            raise _Fail(f"the verifier failed (exit {vrc})" + (f": {said[-1][:300]}" if said else ""))
        # what a verifier leaves untracked (build output) is not the task's work; a tracked file it changed is
        if gitq.status(self.att.path, untracked=False):
            raise _Fail("the verifier changed tracked files")

    def _check_stop(self) -> None:
        holding = self.held
        if holding.lost.is_set():
            raise _Fail(LeaseLost.say(self.lease_id, holding.reason or "no renewal confirmed"))
        if self.r.kill.is_set():
            raise _Fail("interrupted", interrupted=True)
        if self.timed_out:
            raise _Fail(f"stopped after --task-timeout ({self.r.task_timeout:g}s)")

    def _should_stop(self) -> str | None:
        """Asked while a command runs: why it must stop now (the runner stopping, the task's time is up)."""
        if self.r.kill.is_set():
            return "the runner is stopping its commands"
        if self.deadline is not None and self.r.clock.monotonic() >= self.deadline:
            self.timed_out = True
            return f"--task-timeout ({self.r.task_timeout:g}s)"
        return None

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
                rc = guard.wait(self._should_stop)
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
        lines = self._log_lines(what, "git-lease: cannot run ")
        return lines[-1].removeprefix("git-lease: ") if lines else None

    def _log_lines(self, what: str, prefix: str) -> list[str]:
        """The non-empty lines starting with ``prefix`` at the end of the log of ``what`` (the reason a failure
        reports, not only the log's path)."""
        try:
            with open(self._log_path(what), "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 4000))
                tail = fh.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [ln.strip() for ln in tail.splitlines() if ln.strip() and ln.strip().startswith(prefix)]

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
        env: dict[str, Any] = {k: v for k, v in hookgit.clean_env().items() if k != "LC_ALL" or "LC_ALL" in os.environ}
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
        r, number = self.r, self.number
        ref = None
        if self.att is not None and self.manager.repair(self.att.path):
            self.emit("error", message=f"the command deleted its worktree's .git file; repaired ({self.att.path})")
        if exc.ready and self.att is not None:
            return self._failed_landing(exc)
        if self.att is not None:
            try:
                _state, ref = self.manager.give_back(self.att.id, quarantine_only=True)
            except GitLeaseError as err:
                self.emit("error", message=f"could not quarantine the worktree: {err.message}")
        if ref:
            if exc.counted:  # one not counted runs again under the same number: its work is kept here only
                ref = self._park(ref)
            self.emit("quarantined", ref=ref)
        backoff = r.clock.now() + min(BACKOFF_CAP, r.opts.backoff * 2 ** (number - 1))
        if exc.interrupted:
            state, attempts, not_before = "retrying", number - 1, 0.0
        elif not exc.counted:
            state, attempts, not_before = "retrying", number - 1, backoff
        else:
            final = exc.final or number >= r.opts.attempts
            state, attempts = ("failed" if final else "retrying"), number
            not_before = 0.0 if final else backoff
        reason = exc.reason
        wrote = self._record_outcome(state, attempts, reason, not_before, quarantine=ref or self._kept())
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

    def _record_outcome(self, state: str, attempts: int, reason: str, not_before: float, **where: Any):
        """This attempt's outcome written on the store (``where``: its quarantine or ready ref); None, said in an
        error event, when the store refused or could not be reached."""
        try:
            return self.r._outcomes.write(
                self.task.id,
                state,
                attempts,
                parent=self.outcome,
                reason=reason,
                not_before=not_before,
                digest=self.task.digest,
                **where,
            )
        except GitLeaseError as err:
            self.emit("error", message=f"outcome not recorded: {err.message}")
            return None

    def _failed_landing(self, exc: _Fail) -> None:
        """A landing that did not happen: its verified commit is parked on the store and the outcome names it
        (``ready``), so the next attempt, on any runner, only lands it. A fault that is not the task's (its
        lease lost, the server away, the train's retries spent) is not counted toward ``--attempts``; a push
        the server refused is, so that a landing refused every time ends ``failed`` (its work kept), never a
        loop."""
        r, task, number = self.r, self.task, self.number
        head = gitq.head_commit(self.att.path)
        local = quarantine_ref(task.id, number)
        gitq.update_ref(r.svc.repo.cwd, local, head, check=False)
        ref = self._park(local)
        final = exc.counted and number >= r.opts.attempts
        attempts = number if exc.counted else number - 1
        state = "failed" if final else "retrying"
        not_before = 0.0 if final else r.clock.now() + min(BACKOFF_CAP, r.opts.backoff * 2 ** max(0, attempts - 1))
        reason = f"not landed: {exc.reason}"
        got = self._record_outcome(
            state, attempts, reason, not_before, quarantine=ref if final else None, ready=None if final else ref
        )
        if got is None:
            self.emit("error", message=f"outcome not recorded: {reason}")
        else:
            self.st.state = state
        self.st.attempts, self.st.reason = attempts, exc.reason
        if final:
            self.st.quarantine = ref
        self._release()
        self._give_back()
        if final:
            self.emit("failed", message=f"{reason} (attempt {number}); its verified work is kept in {ref}")
            return
        with r._lock:
            r.retries += 1
        counted = f" (attempt {number} of {r.opts.attempts})" if exc.counted else ""
        self.emit(
            "retry",
            message=f"not landed ({exc.reason}); its verified work is kept in {ref}, only the landing goes again"
            + counted,
        )

    def _park(self, ref: str) -> str:
        """Park the quarantined work of a failed attempt on the store too (``refs/leases-quarantine/<task>/<attempt>``,
        created only, never overwritten), and under the same name here, so that the ref its outcome names can
        be fetched from any clone. Returns that name; the local quarantine ref when the store is this
        repository or the push fails (said in an event: the work is still kept here)."""
        r = self.r
        if not r.svc.store.capabilities.shared:
            return ref
        oid = gitq.rev_parse(r.svc.repo.cwd, ref)
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
        gitq.update_ref(r.svc.repo.cwd, target, oid, check=False)
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
    base = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._-]+", "-", task_id)).strip(".-")[:60] or "task"
    if base.endswith(".lock"):
        base = base[: -len(".lock")] + "-lock"
    if base == task_id:
        return base
    return f"{base}-{hashlib.sha1(task_id.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def branch_name(task_id: str, lease_id: str) -> str:
    return f"work/{slug(task_id)}-{lease_id[-8:]}"


__all__ = ["TaskAttempt", "slug", "branch_name"]
