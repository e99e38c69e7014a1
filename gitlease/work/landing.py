"""Landing verified tasks (``git lease work``, docs/work.md): a landing train instead of a stampede.

A worker whose task is verified hands it to the runner's one lander and takes its next task; the attempt's own
thread waits for the train (Runner._detach). The lander takes every task that is ready, fetches the base once
(not even that while it alone lands there: it starts from what its last ride landed, until a push is refused
because the branch moved), checks each task's own commits against its own lease (and, unless
``--allow-extend``, its own scope) as the pre-push hook would, all of them on one listing and one read of the
store, takes each one's release (a task whose lease cannot be given back in this push does not board), rebases
the commits one onto the other (their scopes are disjoint: they hold leases; a rebase changes no path a commit
touches), and lands them all in ONE atomic push: the branch, every task's lease
release (its refs deleted, each pinned to the version its worktree holds, with the release's audit entry) and
every task's ``done`` outcome (each pinned to its ``running`` outcome). A task lands exactly once, only under
its live lease, and gives its lease back in the very push that puts its commit on the branch: never before,
and with no push of its own after (its renewals wait while the train holds the lease's renew lock). The
server hook takes such a release, recorded by the lease's holder, as the push's claim on the lease
(docs/protocol.md, "Landing and releasing in one push").

While a push is under way, the tasks that are ready (and those that become ready) board the next ride onto the
commit it lands: checked on a read of the store of their own, their releases taken, rebased. When the push
lands, that ride is pushed at once (no fetch, no check, no rebase in between); when it does not, the boarding
is undone (the renew locks let go, the tasks back in the lane) and they ride afresh after a fetch.

When another runner (or a person) lands first, the push is refused as a whole: the lander backs off with jitter,
re-fetches, rebases and goes again; nothing is thrown away. A task whose own change no longer rebases, whose
commits leave its scope, or whose lease is lost leaves the train (the others go on). A lease found lost before
the push means what the task wrote was not protected: it runs again. A landing that fails for no fault of the
task (its lease lost in the landing push, the server away, the retries spent) parks its verified commit on the
store, and only its landing is tried again: the agent does not run again for a fault that is not its own.
Without ``--land`` each task's own branch ``work/<id>`` rides the same train, and the next ride boards the same way
while a push is under way (judged over the newest base this runner fetched; nothing to rebase).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gitlease.core import gitcmd, gitq
from gitlease.core.errors import GitLeaseError, LeaseLost, NotHeld, RemoteUnavailable
from gitlease.core.refnames import id_ref
from gitlease.core.store import RefUpdate
from gitlease.service.leases import Busy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gitlease.service.audit import AuditLog
    from gitlease.service.leases import LeaseService
    from gitlease.service.results import PreparedRelease
    from gitlease.service.views import Snapshot
    from gitlease.work.attempt import TaskAttempt
    from gitlease.work.runner import Runner

BACKOFF_FIRST, BACKOFF_CAP = 0.2, 5.0  # seconds, after a landing another runner won: doubling, with jitter
MAX_TRAIN = 32  # tasks one push lands at most
LOCK_WAIT = 5.0  # seconds to wait for a task's renew lock (its heartbeat renewing at that moment)


@dataclass
class Ticket:
    """One task waiting to land: its attempt, and the train's answer."""

    at: TaskAttempt
    base_ref: str
    done: threading.Event = field(default_factory=threading.Event)
    landed: str | None = None  # the commit landed (None: nothing to land)
    error: Exception | None = None  # the attempt's _Fail
    head: str | None = None  # its commit, rebased, in the current ride
    verified: str = ""  # its commit as verified, before any ride rebased it: its own work, on its own base
    prep: PreparedRelease | None = None  # its lease's release, prepared for the current ride

    def finish(self, landed: str | None = None, error: Exception | None = None) -> None:
        self.landed, self.error = landed, error
        self.done.set()


@dataclass
class Boarded:
    """A ride's riders, boarded (checked, their releases taken: their renew locks held, their commits rebased one
    onto the other onto ``base``). One boarded while the ride before it was pushing (``base``: the commit that
    push lands) is pushed next when that push landed; else undone (_unboard), its tickets back in the lane."""

    train: list[Ticket]  # every ticket taken from the lane for it
    riders: list[Ticket] = field(default_factory=list)
    tips: dict[str, str] = field(default_factory=dict)
    base: str = ""


class Lander:
    """The runner's landing train (module docstring). ``land(attempt, base_ref)`` blocks until the task landed
    (its commit, or None for nothing to land) or raises the attempt's _Fail."""

    def __init__(self, runner: Runner) -> None:
        self.r = runner
        self._lane: list[Ticket] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._rng = random.Random()
        self._tip: str | None = None  # the base branch as our last ride landed it (None: not known)
        self._next: Boarded | None = None  # the next ride, boarded while the last one pushed (_board_next)
        self._boarder: threading.Thread | None = None  # the thread boarding it (joined before it is taken)
        self._reader: LeaseService | None = None  # the store read by _board_next (beside the push's own)
        self._solo = False  # nobody else seen landing on it since: the next ride starts from _tip, unfetched
        self.rides = 0  # pushes made
        self.landed = 0  # tasks landed by them

    def land(self, at: TaskAttempt, base_ref: str) -> str | None:
        started = self.r.clock.monotonic()
        ticket = Ticket(at, base_ref, verified=gitq.head_commit(at.att.path))
        with self._cond:
            self._lane.append(ticket)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="gitlease-lander", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        ticket.done.wait()
        spent = self.r.clock.monotonic() - started
        with self.r._lock:
            at.st.land += spent
        if ticket.error is not None:
            raise ticket.error
        return ticket.landed

    # ------------------------------------------------------------------------------ the train
    def _loop(self) -> None:
        while True:
            boarded = self._take_next()
            with self._cond:
                if boarded is not None:
                    train = boarded.train
                elif not self._lane:
                    self._thread = None
                    return
                else:
                    train, self._lane = self._lane[:MAX_TRAIN], self._lane[MAX_TRAIN:]
            try:
                self._run(train, boarded)
            except BaseException as exc:  # never leave a worker waiting on a ticket
                for t in train:
                    if not t.done.is_set():
                        t.finish(error=exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
                if not isinstance(exc, Exception):
                    raise

    def _run(self, train: list[Ticket], boarded: Boarded | None = None) -> None:
        """``train`` landed, retried up to --land-retries times; ``boarded``: its first ride, made ready while
        the ride before it pushed (pushed as it is when that push landed, else undone and ridden afresh). No
        renew lock it took outlives this, whatever happens (a stop, a bug)."""
        try:
            self._retried(train, boarded)
        finally:
            self._unboard(boarded, back=False)

    def _retried(self, train: list[Ticket], boarded: Boarded | None) -> None:
        from gitlease.work.attempt import _Fail

        r = self.r
        for i in range(r.opts.land_retries + 1):
            train = [t for t in train if not t.done.is_set()]
            if not train:
                return
            if r.kill.is_set():
                self._unboard(boarded, back=False)  # their renew locks let go before their attempts hear
                for t in train:
                    t.finish(error=_Fail("interrupted", interrupted=True))
                return
            if i:
                with r._lock:
                    r.land_retries += 1
                    r.retries += 1
                self._pause(i)
            if boarded is not None:
                ready, boarded = boarded, None
                # the push it was boarded during landed (one that did not land undid it: _push_riders); with
                # --land it was rebased onto the commit that push landed, without it onto nothing
                if ready.riders and (ready.base == self._tip or not r.opts.land):
                    if self._push(ready.riders, ready.tips):
                        return
                    continue
                self._unboard(ready, back=False)  # ridden afresh now (with this train)
            if self._ride(train):
                return
        for t in train:
            if not t.done.is_set():
                t.finish(error=_Fail(f"landing refused {r.opts.land_retries + 1} times", ready=True, counted=False))

    def _pause(self, i: int) -> None:
        step = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (i - 1))
        self.r._pause(self._rng.uniform(step / 2, step))

    def _ride(self, train: list[Ticket]) -> bool:
        """One try at landing ``train``: True when nothing is left to retry (landed, or left the train)."""
        from gitlease.work.attempt import _Fail

        base = self._base()
        try:
            checked = self._check(train, base)
        except RemoteUnavailable as exc:  # not the tasks' fault: their verified work is kept for landing
            for t in train:
                if not t.done.is_set():
                    t.finish(error=_Fail(f"landing: {exc.message}", ready=True, counted=False))
            return True
        ride = Boarded(train, base=base)
        try:
            self._board_all(checked, ride)
            if not ride.riders:
                return True
            return self._push(ride.riders, ride.tips)
        finally:
            self._unboard(ride, back=False)  # the renew locks of those that did not ride (_push let the riders' go)

    def _board_all(self, checked: list[Ticket], ride: Boarded) -> None:
        """Each of ``checked`` boards ``ride`` in turn: its release first (a task whose lease cannot be given back
        in this push never boards, so no later rider is rebased onto its commit: that commit would land with
        theirs, its lease unreleased), then its commits rebased onto the ride's tip of its target so far (with
        --land: from ``ride.base``; else its own branch, not rebased)."""
        r = self.r
        for t in checked:
            t.prep = self._prepare(t)
            if t.prep is None:
                continue
            target = r._target(t.at.task)
            head = self._board(t, ride.tips.get(target, ride.base if r.opts.land else None))
            if head is None:
                continue
            ride.tips[target] = head
            ride.riders.append(t)

    def _landing_tip(self, tips: dict[str, str]) -> str | None:
        """The commit ``tips`` put on the branch --land names (None without --land)."""
        return tips.get(f"refs/heads/{self.r.opts.land}") if self.r.opts.land else None

    def _base(self) -> str:
        """The commit this ride lands onto: the base branch fetched, or, while this runner is the only one
        landing on it, the commit its last ride landed (no fetch: a push refused because the branch moved
        ends that, and the next ride fetches)."""
        r = self.r
        if r.opts.land and self._solo and self._tip is not None:
            return self._tip
        _branch, base = r._fetch_base()
        self._solo = self._tip is not None and base == self._tip  # nobody else landed since our last ride
        return base

    def _check(self, train: list[Ticket], base: str, svc: LeaseService | None = None) -> list[Ticket]:
        """The tickets whose own commits (over ``base``, before any rebase: rebasing one onto another changes
        no path they touch) lie in their lease and scope and outside every other live lease, judged on ONE
        listing and ONE read of the store for the whole train (its riders' paths and leases); the others leave
        it (finished: nothing to land, or a failure of their own). RemoteUnavailable: the store away."""
        from gitlease.enforce.push import landing_paths

        r = self.r
        paths: dict[int, list[str]] = {}
        heads: dict[int, str] = {}
        for k, t in enumerate(train):
            # its commit as verified, not as an earlier ride rebased it (onto riders that may not have landed)
            path, heads[k] = t.at.att.path, t.verified
            if r.opts.land and gitq.count_commits(path, t.verified, [base]) == 0:
                self._nothing_to_land(t)
                continue
            paths[k] = landing_paths(t.at.held.svc, heads[k], base)
        if not paths:
            return []
        keep = {lid for k in paths for lid in train[k].at.held.svc.held_here()}
        wanted = sorted({p for ps in paths.values() for p in ps})
        snap = (svc or r.svc).snapshot(use_cache=False, paths=wanted, keep=keep)
        out = []
        for k, ps in paths.items():
            t, at = train[k], train[k].at
            within = None if r.opts.allow_extend else at.task.scope
            if self._passes(t, heads[k], base, ps, within, snap):
                out.append(t)
        return out

    def _passes(
        self, t: Ticket, head: str, base: str, paths: list[str], within: Sequence[str] | None, snap: Snapshot
    ) -> bool:
        """Whether ``t``'s commits pass its landing check on the train's read (``snap``); when they do not, the
        ticket is finished with why. A lease that looks lost there is asked of the store again: its heartbeat
        may have renewed it since the train's read."""
        from gitlease.enforce.push import check_task_landing
        from gitlease.work.attempt import _Fail

        at = t.at
        args = (at.held.svc, self.r.remote, at.lease_id, head, base)
        try:
            try:
                check_task_landing(*args, within=within, snap=snap, paths=paths)
            except LeaseLost:
                check_task_landing(*args, within=within, paths=paths)
        except LeaseLost as exc:  # lost before its landing began: what it wrote was not protected; it runs again
            t.finish(error=_Fail(exc.message))
            return False
        except RemoteUnavailable as exc:  # the store away (its objects not fetched): not the task's fault
            t.finish(error=_Fail(f"landing: {exc.message}", ready=True, counted=False))
            return False
        except GitLeaseError as exc:  # ScopeViolation: the task's own failure, final
            t.finish(error=_Fail(exc.message, final=True))
            return False
        return True

    def _board(self, t: Ticket, onto: str | None) -> str | None:
        """``t``'s commit rebased onto ``onto`` (the base, or the commit of the task before it in this train;
        None: its own branch, not rebased); None when it leaves the train (its change no longer rebases: the
        agent runs again)."""
        from gitlease.work.attempt import _Fail

        path = t.at.att.path
        if onto is not None:
            gitq.reset_hard(path, t.verified)  # its own commits only: not another rider's from a ride that failed
            why = gitq.rebase(path, onto)
            if why is not None:
                prep, t.prep = t.prep, None
                if prep is not None:  # its renew lock let go before its attempt hears (it releases the lease)
                    prep.close()
                t.finish(error=_Fail(f"its change no longer rebases onto {t.base_ref} ({why}): the agent runs again"))
                return None
        t.head = gitq.head_commit(path)
        return t.head

    def _nothing_to_land(self, t: Ticket) -> None:
        from gitlease.work.attempt import _Fail

        at = t.at
        got = self.r._outcomes.write(
            at.task.id, "done", at.number, parent=at.outcome, reason="nothing to land", digest=at.task.digest
        )
        t.finish(error=None if got is not None else _Fail("the task's outcome changed meanwhile (another runner)"))

    # ------------------------------------------------------------------------------ the push
    def _push(self, riders: list[Ticket], tips: dict[str, str]) -> bool:
        """Every rider's release, audit entry and outcome and the branch tips in one atomic push. True when it
        landed, or nothing is left to retry. Whatever happens, no rider's renew lock outlives the ride: one
        left taken (a bug raising in between) would block that lease's own release for good."""
        everyone = list(riders)
        try:
            return self._push_riders(riders, tips)
        finally:
            for t in everyone:
                prep, t.prep = t.prep, None
                if prep is not None:
                    prep.close()

    def _push_riders(self, riders: list[Ticket], tips: dict[str, str]) -> bool:
        from gitlease.work.attempt import _Fail

        r = self.r
        updates: list[RefUpdate] = []
        for t in riders:
            prep, at = t.prep, t.at
            assert prep is not None  # taken when it boarded (_ride)
            oid, _ = r._outcomes.make(
                at.task.id,
                "done",
                at.number,
                parent=at.outcome,
                landed=t.head,
                branch=r._target(at.task),
                digest=at.task.digest,
            )
            updates += [*prep.updates, r._outcomes.update(at.task.id, oid, at.outcome)]
        specs = [f"{tip}:{target}" for target, tip in sorted(tips.items())]  # each target has riders (_ride)
        self._tip = None  # known again once this push lands
        try:
            audits = self._audit_entries(riders)  # reads our audit ref's head when this clone has not yet
        except RemoteUnavailable as exc:  # nothing pushed: as a landing the store refused, again after a pause
            self._settle(riders, False, [])
            for t in riders:
                t.at.emit("landing", message=f"not landed ({shortened(exc.message)}); backing off, then again")
            return False
        try:
            out = self._apply(updates + [u for _, u, _ in audits], specs, tips)
        except GitLeaseError as exc:
            self._unboard(self._take_next())
            self._settle(riders, None, audits)
            for t in riders:
                t.finish(error=_Fail(f"landing: {exc.message}", ready=True, counted=False))
            return True
        with self.r._lock:
            self.rides += 1
        if out.ambiguous:
            out = self._reread(updates, specs, out)
        if not out.ok:  # the next ride was boarded onto a commit that did not land
            self._unboard(self._take_next())
        if out.ok:
            self._tip = self._landing_tip(tips)
            self._settle(riders, True, audits)
            with r._lock:
                self.landed += len(riders)
            for t in riders:
                t.finish(landed=t.head)
            return True
        self._settle(riders, False, audits, out.statuses)
        if any("hook declined" in st for st in out.statuses.values()):  # the server refused the push itself
            for t in riders:
                t.finish(error=_Fail(f"the server refused the landing: {out.reason}", ready=True))
            return True
        lost = [t for t in riders if _refused_itself(out.statuses.get(id_ref(t.at.lease_id), ""))]
        for t in lost:
            t.finish(error=_Fail(f"lease lost while landing: {t.at.lease_id}", ready=True, counted=False))
        if lost:
            return False  # the others go again at once
        what = out.reason or "refused"
        for t in riders:
            t.at.emit("landing", message=f"not landed ({shortened(what)}); backing off, then again")
        return False

    def _apply(self, updates: list[RefUpdate], specs: list[str], tips: dict[str, str]):
        """The landing push. While it runs, the tasks in the lane, and those that come, board the next ride onto
        the commit it lands (_board_next, in a thread of its own): a ride's check and rebases then cost no time
        between two pushes, and the riders of this push hear its outcome as soon as it is known, not when that
        boarding ends (the next ride waits for it: _take_next)."""
        r = self.r
        onto = self._landing_tip(tips) if r.opts.land else self._newest_base()
        pushed = threading.Event()
        if onto is not None and not r.kill.is_set():
            self._boarder = threading.Thread(
                target=self._board_next, args=(onto, pushed), name="gitlease-lander-board", daemon=True
            )
            self._boarder.start()
        try:
            # not while a worker fetches: the push moves refs/remotes/<remote>/<branch> too, and the fetch's
            # update of it would fail ("cannot lock ref ... is at X but expected Y"); the workers' claims that
            # come meanwhile wait for it, then go together (core/pushgroup.py)
            with gitcmd.deadline(float(r.svc.settings.timeout)), r._fetch_lock, r.claims.first():
                return r.svc.store.apply(updates, extra_refspecs=specs)
        finally:
            pushed.set()
            with self._cond:
                self._cond.notify_all()  # the boarding ends

    def _newest_base(self) -> str | None:
        """Without --land: the newest commit of the base branch this runner fetched (for a ride or a task's
        worktree), at least as new as the base of every task ready now (None: none fetched yet). Their commits
        are judged over it: an older one would count commits that landed on it since as theirs."""
        fetched = self.r._fetched
        return fetched[1] if fetched is not None else None

    def _board_next(self, onto: str, pushed: threading.Event) -> None:
        """Until ``pushed``, board the tasks in the lane, and each that comes, onto ``onto`` (with --land: the
        commit the push under way lands; without: the base they are judged over, _newest_base), as a ride would:
        checked on a read of the store of its own, their releases taken, their commits rebased one onto the other
        (with --land). Kept in ``_next`` for the lander's next turn. Never raises: whatever goes wrong puts the
        tickets back in the lane, as they were, for an ordinary ride."""
        from gitlease.service.factory import open_service

        r = self.r
        ready = Boarded([], base=onto)
        try:
            while True:
                with self._cond:
                    room = MAX_TRAIN - len(ready.train)
                    if pushed.is_set() or room <= 0 or r.kill.is_set():
                        break
                    if not self._lane:
                        self._cond.wait()  # a task for the lane, or the push's end
                        continue
                    batch, self._lane = self._lane[:room], self._lane[room:]
                ready.train += batch
                if self._reader is None:
                    self._reader = open_service(
                        r.svc.repo.cwd, remote=r.opts.remote, clock=r.clock, signer=r.svc.signer, agent=r.opts.agent
                    )
                self._board_all(self._check(batch, onto, self._reader), ready)
        except Exception:
            self._unboard(ready)
            return
        if ready.train:
            with self._cond:
                self._next = ready

    def _take_next(self) -> Boarded | None:
        """The ride boarded during the last push (None: none), once its boarding has ended."""
        boarder, self._boarder = self._boarder, None
        if boarder is not None:
            boarder.join()
        with self._cond:
            boarded, self._next = self._next, None
        return boarded

    def _unboard(self, boarded: Boarded | None, *, back: bool = True) -> None:
        """A boarded ride undone: its renew locks let go and (``back``) its tickets not finished meanwhile put
        back at the head of the lane."""
        if boarded is None:
            return
        for t in boarded.train:
            prep, t.prep = t.prep, None
            if prep is not None:
                prep.close()
        if back:
            with self._cond:
                self._lane[:0] = [t for t in boarded.train if not t.done.is_set()]

    def _prepare(self, t: Ticket) -> PreparedRelease | None:
        """``t``'s lease release, made ready to ride with its commit (its renew lock held until settled: nothing
        renews it meanwhile); None when the lease is lost (the ticket is then finished)."""
        from gitlease.work.attempt import _Fail

        svc = t.at.held.svc
        end = self.r.clock.monotonic() + LOCK_WAIT
        while True:
            try:
                return svc.prepare_release(t.at.lease_id)
            except Busy:  # its heartbeat is renewing right now
                if self.r.clock.monotonic() >= end:
                    t.finish(error=_Fail("landing: its lease stayed busy renewing", ready=True, counted=False))
                    return None
                threading.Event().wait(0.05)
            except (LeaseLost, NotHeld) as exc:  # lost before its landing: it runs again
                t.finish(error=_Fail(exc.message))
                return None

    @staticmethod
    def _audit_entries(riders: list[Ticket]) -> list[tuple[AuditLog, RefUpdate, tuple[str, int]]]:
        """The riders' release entries, one chain per audit writer (riders of one runner share one): for each,
        (its log, its ref's update, its head once landed)."""
        logs: dict[str, tuple[AuditLog, list[Ticket]]] = {}
        for t in riders:
            audit = t.at.held.svc.audit
            logs.setdefault(audit.ref, (audit, []))[1].append(t)
        out = []
        for audit, group in logs.values():
            update, after = audit.prepare_entries([(t.prep.fields, t.prep.pointer) for t in group if t.prep])
            out.append((audit, update, after))
        return out

    def _settle(
        self,
        riders: list[Ticket],
        landed: bool | None,
        audits: list[tuple[AuditLog, RefUpdate, tuple[str, int]]],
        statuses: dict[str, str] | None = None,
    ) -> None:
        """Each rider's release as the store decided it: landed (the lease is no longer held here: its holding
        stops renewing before the renew lock is let go), not landed or unknown (held as it was; a release
        whose outcome is unknown is found out by the attempt's own release later). Each audit log's head
        follows: moved on, or read again when the store refused or may have taken our entries."""
        for t in riders:
            prep, t.prep = t.prep, None
            if prep is None:
                continue
            if landed:
                t.at.held.svc.settle_release(prep, True)
                t.at.held.given_back()  # before the lock is let go: a renewal waiting for it then finds nothing
            prep.close()
        for audit, update, after in audits:
            if landed:
                audit.landed(after)
            elif landed is None or _refused_itself((statuses or {}).get(update.ref, "")):
                try:
                    audit.reread()
                except GitLeaseError:
                    pass  # read again by the next ride's entries (its own push then fails and says why)

    def _reread(self, updates: list[RefUpdate], specs: list[str], out):
        """After an unclear outcome: landed when every ref of the lease namespace is at what we wrote (the
        push is atomic: the outcome refs, new commits of ours, witness the rest)."""
        from gitlease.core.store import Outcome

        try:
            refs = self.r.svc.store.list_refs()
        except RemoteUnavailable:
            return Outcome(ok=False, statuses={}, message=out.message)
        ok = all(refs.get(u.ref) == u.new for u in updates)
        return Outcome(ok=ok, statuses={} if ok else {u.ref: "rejected:unknown" for u in updates}, message=out.message)


def shortened(text: str, limit: int = 160) -> str:
    """``text`` cut to about ``limit`` characters at a word's end, never inside a word ("..." says so)."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > 0 else limit].rstrip(" ;,:") + " ..."


def _refused_itself(status: str) -> bool:
    """A ref the server refused on its own account (not "atomic push failed" because of another)."""
    return status.startswith("rejected") and "atomic" not in status


__all__ = ["Lander", "Ticket"]
