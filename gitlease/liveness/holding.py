"""One held lease's life, owned in one place: ``Holding``.

``hold()``, ``git lease run``, the queue runner (``git lease work``) and the MCP session all keep their leases
through a Holding; nothing else heartbeats. A Holding is

* **obtained**: acquired (``Holding.acquire``: through the per-host renewal agent when there is one, waiting
  while the scope is held, with the queued task's claim, with a clean worktree when asked) or adopted
  (``Holding.adopt``: a lease this worktree already holds, ``git lease run --lease``);
* **kept**: ``start()`` runs a heartbeat thread that renews it (through the agent, renewing by itself when the
  agent is gone), sends its progress notes, and declares it lost when no renewal is confirmed by the stop
  deadline, when a renewal is refused, or when progress stalls (``lease.progressTimeout``), always before
  anyone else may take it (gitlease/liveness/heartbeat.py);
* **watched**: ``lost`` (a threading.Event), ``reason``, ``check()``; listeners told of each loss and each
  confirmed renewal (a command's supervisor stops its process group on a loss; its watchdog follows the
  renewals);
* **given back**: ``close()`` stops the heartbeat and releases the lease (through the agent when the agent
  renews it), every git call of it bounded by one attempt's timeout once the lease was lost (the store may be
  what failed); an adopted lease, or one told ``release=False``, is kept until it expires.

The Holding writes no local state itself: every write goes through the service, which updates the worktree's
``held.json`` (what the hooks and the edit guard read) in the same step.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gitlease.core import gitcmd
from gitlease.core.errors import GitLeaseError, LeaseLost, NotHeld
from gitlease.liveness.heartbeat import Confirmed, Heartbeat, Timing

if TYPE_CHECKING:
    from gitlease.core.record import Record
    from gitlease.liveness.delegate import AgentAttempt, AgentLink


@dataclass(frozen=True)
class HoldOptions:
    """How a lease is held. ``None`` everywhere means "the configured default" (git config ``lease.*``)."""

    ttl: int | None = None  # lease.ttl
    renew_every: float | None = None  # a third of the TTL
    timeout: float | None = None  # one renewal attempt, all its git calls: min(lease.timeout, ttl / 6)
    grace: float | None = None  # from the stop signal to the hard stop: a tenth of the TTL, at most 10 s
    wait: float | None = None  # wait this long while the scope is held (None: refuse at once)
    renew_agent: bool | None = None  # lease.renewAgent (never for leases in the repository's own refs)
    progress_timeout: float | None = None  # lease.progressTimeout; 0: none
    release: bool = True  # give the lease back at close(); False: keep it until it expires

    def timing(self, settings, ttl: int) -> Timing:
        timeout = self.timeout if self.timeout is not None else min(float(settings.timeout), ttl / 6)
        return Timing.for_ttl(ttl, renew_every=self.renew_every, timeout=timeout, grace=self.grace)


@dataclass(frozen=True)
class Closed:
    """How a holding ended: ``released`` (or kept), ``lost`` (and why), and a release that failed."""

    lease_id: str
    lost: bool
    reason: str | None
    released: bool
    release_error: GitLeaseError | None = None


class Holding:
    """One lease, held (module docstring). Build it with ``acquire`` or ``adopt``; ``start()`` it; ``close()``
    it (or use it as a ``with`` block: started on entry, closed on exit)."""

    def __init__(
        self,
        svc,
        record: Record,
        timing: Timing,
        *,
        link: AgentLink | None = None,
        release: bool = True,
        progress_timeout: float | None = None,
        attached=None,
    ) -> None:
        self.svc = svc  # the service of the worktree that holds it (held.json there)
        self.lease_id: str = record.lease_id
        self.record = record
        self.timing = timing
        self.link = link
        self.release_on_exit = release
        self.attached = attached  # the worktree attached to it on acquire (WorktreeManager's Attached), or None
        self.cleared: tuple[str, ...] = ()  # expired leases the acquire cleared out of its way
        self.piggybacked = False  # the acquire's ``piggyback`` updates landed in its push
        pt = svc.settings.progress_timeout if progress_timeout is None else progress_timeout
        self._progress_timeout = float(pt) if pt else None
        self._lost_listeners: list[Callable[[str], None]] = []
        self._renewed_listeners: list[Callable[[float], None]] = []
        self._listeners_lock = threading.Lock()
        self._agent_attempt: AgentAttempt | None = None
        self._thread: threading.Thread | None = None
        self._closed: Closed | None = None
        self.heartbeat = self._new_heartbeat()

    # ------------------------------------------------------------------ obtaining
    @classmethod
    def acquire(
        cls,
        svc,
        scope: Sequence[str],
        options: HoldOptions = HoldOptions(),
        *,
        task: str | None = None,
        piggyback: Sequence[Any] = (),
        worktree=None,
        base: str | None = None,
        branch: str | None = None,
        on_wait: Callable[[Any, float], None] | None = None,
        agent_client=None,
        log: Callable[[str], None] | None = None,
        reopen: Callable[[str], Any] | None = None,
    ) -> Holding:
        """A new lease on ``scope`` for the worktree of ``svc`` (not started yet). ``task``: the queued task's
        claim, created in the same atomic push; ``piggyback``: more ref updates for that push (the task's
        outcome: ``piggybacked`` says whether they landed). ``worktree``: a WorktreeManager; the lease then moves into a
        clean worktree attached to it (``base``, ``branch``), and ``reopen(path)`` gives that worktree's
        service (default: ``open_service`` with the same settings)."""
        from gitlease.liveness.delegate import AgentLink
        from gitlease.liveness.wait import obtain

        if isinstance(scope, str):  # one scope, "services/tax", not its characters
            scope = [scope]
        ttl = int(options.ttl or svc.settings.ttl)
        timing = options.timing(svc.settings, ttl)
        link = AgentLink.connect(svc, options.renew_agent, client=agent_client, log=log)
        args: dict[str, Any] = dict(
            ttl=ttl, renew_every=max(1, int(timing.renew_every)), stop_after=timing.stop_after, holder_pid=os.getpid()
        )
        if task is not None:
            args["task"] = task
        if piggyback:
            args["piggyback"] = list(piggyback)
        manager = worktree
        if manager is not None:
            args.update(base=base, branch=branch)
        # a task's claim is not an agent request: acquired here, then handed to the agent for its renewals
        got, att = obtain(
            svc, list(scope), wait=options.wait, on_wait=on_wait, link=None if task else link, worktree=manager, **args
        )
        holder = svc
        if att is not None:  # the lease moved into the worktree: renewed and released from there
            holder = reopen(att.path) if reopen is not None else _reopen(svc, att.path)
            if link is not None:
                link = AgentLink(holder, link.client, link.log)
        holding = cls(
            holder,
            got.record,
            timing,
            link=link,
            release=options.release,
            progress_timeout=options.progress_timeout,
            attached=att,
        )
        holding.cleared = tuple(got.cleared)
        holding.piggybacked = bool(getattr(got, "piggybacked", False))
        return holding

    @classmethod
    def adopt(
        cls,
        svc,
        lease_id: str,
        options: HoldOptions = HoldOptions(release=False),
        *,
        agent_client=None,
        log: Callable[[str], None] | None = None,
    ) -> Holding:
        """A lease this worktree already holds (NotHeld otherwise), kept from its current version on; by default
        not released at close (its holder took it and gives it back)."""
        from gitlease.core import record as records
        from gitlease.liveness.delegate import AgentLink

        records.check_lease_id(lease_id)
        held = svc.held_here().get(lease_id)
        if held is None:
            raise NotHeld(f"lease {lease_id} is not held by this worktree")
        rec = records.parse(held.record.encode("utf-8"))
        timing = options.timing(svc.settings, rec.ttl)
        link = AgentLink.connect(svc, options.renew_agent, client=agent_client, log=log)
        return cls(svc, rec, timing, link=link, release=options.release, progress_timeout=options.progress_timeout)

    def move(self, svc) -> None:
        """The lease now lives in another worktree's held state (a worktree attached after the acquire): renew
        and release it from there. Only before ``start()``."""
        from gitlease.liveness.delegate import AgentLink

        if self._thread is not None:
            raise RuntimeError("a started holding cannot move")
        self.svc = svc
        if self.link is not None:
            self.link = AgentLink(svc, self.link.client, self.link.log)
        self.heartbeat = self._new_heartbeat()

    def _new_heartbeat(self) -> Heartbeat:
        rec = self.record
        return Heartbeat(
            self._renew_by_itself,
            self.timing,
            rec.expires,
            clock=self.svc.clock,
            on_lost=self._told_lost,
            on_renewed=self._told_renewed,
            stop_by=rec.stop_deadline,
            progress_timeout=self._progress_timeout,
        )

    # ------------------------------------------------------------------ keeping
    def start(self, *, poll: Callable[[], None] | None = None, wait=None) -> Holding:
        """Hand the lease to the renewal agent (when linked and it accepts) and start the heartbeat thread.
        ``poll``: called at each heartbeat wake-up (a command's progress file); ``wait``: the heartbeat's wait
        (tests; default: real time with the system clock, the injected clock's sleep otherwise)."""
        if self._thread is not None:
            return self
        hb = self.heartbeat
        if self.link is not None and self.link.register(self.lease_id, os.getpid(), self.timing):
            self._agent_attempt = self.link.attempt(
                self.lease_id, self.timing, self.record.expires, self._renew_by_itself, self.record.stop_deadline
            )
            hb.attempt = self._agent_attempt
        else:
            self.link = None
        hb.poll = poll
        if wait is not None:
            hb.wait = wait
        self._thread = threading.Thread(target=hb.run, name=f"gitlease-heartbeat-{self.lease_id}", daemon=True)
        self._thread.start()
        return self

    def _renew_by_itself(self, budget: float, progress: str | None) -> Confirmed:
        """One renewal attempt by this holder, every git call of it within ``budget`` seconds."""
        with gitcmd.deadline(budget):
            rec = self.svc.renew(self.lease_id, progress=progress, stop_after=self.timing.stop_after).record
        return Confirmed(rec.expires, rec.stop_deadline)

    @property
    def lost(self) -> threading.Event:
        return self.heartbeat.lost

    @property
    def reason(self) -> str | None:
        return self.heartbeat.reason

    @property
    def paths(self) -> tuple[str, ...]:
        return self.record.paths

    @property
    def service(self):
        """The LeaseService of the worktree that holds it."""
        return self.svc

    @property
    def agent(self) -> AgentAttempt | None:
        """The renewal agent's side of the heartbeat when the agent renews this lease, else None."""
        return self._agent_attempt

    @property
    def hard_stop(self) -> float:
        """Monotonic moment by which everything of this holder must have stopped (the stop deadline)."""
        return self.heartbeat.hard_stop

    def check(self) -> None:
        """Raise LeaseLost (exit 6) once the lease is lost: stop writing."""
        if self.heartbeat.lost.is_set():
            raise LeaseLost.of(self.lease_id, self.heartbeat.reason or "no renewal confirmed")

    def progress(self, note: str) -> None:
        """A progress note ("tests 40/120") sent with the next renewal; it restarts the progress timeout."""
        self.heartbeat.report(note)

    def on_lost(self, fn: Callable[[str], None]) -> Callable[[], None]:
        """Call ``fn(reason)`` once when the lease is lost (at once if it is lost already); returns the function
        that removes it."""
        with self._listeners_lock:
            self._lost_listeners.append(fn)
            already = self.heartbeat.reason if self.heartbeat.lost.is_set() else None
        if already is not None:
            fn(already)
        return self._remover(self._lost_listeners, fn)

    def on_renewed(self, fn: Callable[[float], None]) -> Callable[[], None]:
        """Call ``fn(hard_stop)`` after each confirmed renewal; returns the function that removes it."""
        with self._listeners_lock:
            self._renewed_listeners.append(fn)
        return self._remover(self._renewed_listeners, fn)

    def _remover(self, listeners: list, fn: Callable) -> Callable[[], None]:
        def remove() -> None:
            with self._listeners_lock:
                if fn in listeners:
                    listeners.remove(fn)

        return remove

    def _told_lost(self, reason: str) -> None:
        with self._listeners_lock:
            listeners = list(self._lost_listeners)
        for fn in listeners:
            fn(reason)

    def _told_renewed(self, _expiry: float) -> None:
        with self._listeners_lock:
            listeners = list(self._renewed_listeners)
        for fn in listeners:
            fn(self.heartbeat.hard_stop)

    # ------------------------------------------------------------------ changing the scope
    def extend(self, paths: Sequence[str], *, ttl: int | None = None):
        """Add ``paths`` in one atomic push (``LeaseService.extend``): HeldError (exit 3) naming the holder when
        one overlaps another lease, and then nothing was added. Returns the service's ``Resized``."""
        return self._resize(self.svc.extend, paths, ttl)

    def narrow(self, paths: Sequence[str], *, ttl: int | None = None):
        """Give ``paths`` (whole scopes of this lease) back in one atomic push (``LeaseService.narrow``)."""
        return self._resize(self.svc.narrow, paths, ttl)

    def _resize(self, method, paths: Sequence[str], ttl: int | None):
        self.check()
        got = method(self.lease_id, list(paths), ttl=ttl)
        self.record = got.record  # the heartbeat renews from the held state, which has the new scope
        return got

    # ------------------------------------------------------------------ giving back
    def stop(self) -> None:
        """Stop renewing (the heartbeat thread ends within one attempt's timeout); the lease stays held."""
        self.heartbeat.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.timing.timeout + 1)

    def close(self, *, release: bool | None = None) -> Closed:
        """Stop renewing and give the lease back (``release``, default ``release_on_exit``); never raises for a
        failed release: ``Closed.release_error`` says why (the lease then expires on its own). Idempotent."""
        if self._closed is not None:
            return self._closed
        self.stop()
        lost = self.heartbeat.lost.is_set()
        give_back = self.release_on_exit if release is None else release
        released, error = False, None
        try:
            if not give_back:
                if self.link is not None:
                    self.link.unregister(self.lease_id)  # nobody renews it any more: it expires on its own
            else:
                released = self._release(lost)
        except GitLeaseError as exc:
            error = exc
        self._closed = Closed(self.lease_id, lost, self.heartbeat.reason, released, error)
        return self._closed

    def given_back(self) -> Closed:
        """The lease was released by a push made for this holder by another part of the process (the landing
        train's, with the task's commit): stop renewing (without waiting for the heartbeat: a renewal it tries
        finds the lease no longer held here and ends quietly) and close as released, with no push of its own.
        ``close`` then answers the same. Idempotent."""
        if self._closed is not None:
            return self._closed
        self.heartbeat.stop()
        if self.link is not None:
            self.link.unregister(self.lease_id)  # the renewal agent renews it no more
        self._closed = Closed(self.lease_id, False, None, True)
        return self._closed

    def _release(self, lost: bool) -> bool:
        agent = self._agent_attempt
        if self.link is not None and agent is not None and not agent.fallen and not lost:
            self.link.release(self.lease_id)
            return True
        if self.link is not None:
            self.link.unregister(self.lease_id)
        if lost:  # the store may be what failed: the release gets one attempt's time, not the full timeout
            try:
                with gitcmd.deadline(self.timing.timeout):
                    self.svc.release(self.lease_id)
            except (LeaseLost, NotHeld):
                return False  # gone already: nothing to give back
            return True
        self.svc.release(self.lease_id)
        return True

    def __enter__(self) -> Holding:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reopen(svc, path: str):
    """The service of the worktree at ``path``, with the same settings, clock and signer as ``svc``."""
    from gitlease.service.factory import open_service

    s = svc.settings
    return open_service(path, remote=s.remote, clock=svc.clock, signer=svc.signer, agent=s.agent, task=s.task)


__all__ = ["Holding", "HoldOptions", "Closed"]
