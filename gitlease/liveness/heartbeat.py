"""Keeping a lease alive: renew at an interval, and declare it lost at a deadline safely ahead of expiry.

The rule (docs/protocol.md, "Heartbeats"): after a renewal is confirmed at local time ``t`` with expiry ``E``,
the next renewal starts at ``t + renew_every``. Failed attempts (remote unreachable, timed out) are retried
while they can still finish before the stop deadline ``E - grace - margin``; every git call of an attempt is
bounded so that the attempt ends by that deadline. A refused renewal (the lease changed or vanished: exit 6), or
no confirmed renewal by the deadline, is a loss: the owner stops its worker, and has ``grace`` seconds to do so
before the lease can expire. ``Timing.check`` refuses at start any combination where one renewal interval, one
request timeout and the grace period do not fit in the TTL.

Time is injected: the loop reads ``clock.monotonic()`` and waits through ``wait(stop_event, seconds)``; a test
passes a FakeClock and drives the whole schedule without sleeping. Standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.errors import GitLeaseError, LeaseLost, UsageError

DEFAULT_GRACE = 10.0
DEFAULT_TIMEOUT = 30.0
MARGIN = 1.0  # expiresAt has one-second resolution; and scheduling is not instant
MIN_ATTEMPT = 0.5  # an attempt with less time than this left before the deadline is not started
RETRY_FIRST, RETRY_CAP = 0.5, 5.0
# A renewal waits at most once for the per-lease renew lock and makes at most three network calls (settle a
# pending write, push, re-read after an unclear outcome), each bounded by the store timeout.
CALLS_PER_RENEWAL = 4


@dataclass(frozen=True)
class Timing:
    """How a holder keeps its lease: all seconds."""

    ttl: float
    renew_every: float
    timeout: float  # the hard bound of one renewal attempt, all its git calls together
    grace: float = DEFAULT_GRACE  # from the stop signal to the hard stop (SIGTERM -> SIGKILL)
    margin: float = MARGIN

    @classmethod
    def for_ttl(
        cls, ttl: float, *, renew_every: float | None = None, timeout: float | None = None, grace: float | None = None
    ) -> Timing:
        """Defaults that fit: renew every third of the TTL; request timeout a sixth of it, at most 30 s;
        grace a tenth, at most 10 s. Explicit values are taken as given. Then ``check``."""
        renew = renew_every if renew_every is not None else ttl / 3
        t = timeout if timeout is not None else min(DEFAULT_TIMEOUT, ttl / 6)
        g = grace if grace is not None else min(DEFAULT_GRACE, ttl / 10)
        timing = cls(ttl=float(ttl), renew_every=float(renew), timeout=float(t), grace=float(g))
        timing.check()
        return timing

    @property
    def budget(self) -> float:
        """Seconds from a confirmed renewal to the latest moment the worker must have been told to stop."""
        return self.ttl - self.grace - self.margin

    def check(self) -> None:
        for name, value in (
            ("--ttl", self.ttl),
            ("--renew-every", self.renew_every),
            ("request timeout", self.timeout),
        ):
            if value <= 0:
                raise UsageError(f"{name} must be positive, not {value:g}")
        if self.grace < 0:
            raise UsageError(f"grace must not be negative, not {self.grace:g}")
        need = self.renew_every + self.timeout + self.grace + self.margin
        if need >= self.ttl:
            raise UsageError(
                f"timings do not fit the TTL: renew every {_s(self.renew_every)}s + request timeout "
                f"{_s(self.timeout)}s + grace {_s(self.grace)}s + margin {_s(self.margin)}s = {_s(need)}s, which "
                f"must be less than the TTL ({_s(self.ttl)}s); renew more often, lower the timeout, or raise --ttl"
            )


def _s(seconds: float) -> str:
    return f"{seconds:.2f}".rstrip("0").rstrip(".")


def event_wait(stop: threading.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` real time; True when ``stop`` was set."""
    return stop.wait(max(0.0, seconds))


def waiter_for(clock: Clock) -> Callable[[threading.Event, float], bool]:
    """The system clock waits on the stop event (so a stop wakes it); a test clock that overrides ``sleep``
    (FakeClock) is honoured: its sleep advances fake time."""
    if type(clock).sleep is Clock.sleep:
        return event_wait

    def fake_wait(stop: threading.Event, seconds: float) -> bool:
        if stop.is_set():
            return True
        clock.sleep(max(0.0, seconds))
        return stop.is_set()

    return fake_wait


# An attempt: (time budget in seconds, progress note or None) -> the new version's expiry (wall clock, epoch s).
Attempt = Callable[[float, "str | None"], float]


@dataclass
class Beat:
    """One renewal attempt, for logs and tests."""

    at: float  # monotonic time it started
    ok: bool
    budget: float
    error: str | None = None


@dataclass
class Heartbeat:
    """Renews through ``attempt`` until stopped or lost. ``run()`` is the loop (call it in a thread);
    ``lost`` is set, and ``on_lost(reason)`` called once, when the lease is lost."""

    attempt: Attempt
    timing: Timing
    expires: float  # wall-clock expiry of the version the holder has now
    clock: Clock = SYSTEM
    on_lost: Callable[[str], None] | None = None
    on_renewed: Callable[[float], None] | None = None  # called with the new local (monotonic) expiry
    wait: Callable[[threading.Event, float], bool] | None = None
    lost: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None
    beats: list[Beat] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.timing.check()
        self._stop = threading.Event()
        self._wait = self.wait or waiter_for(self.clock)
        self._progress: str | None = None
        self._lock = threading.Lock()
        now_wall, now_mono = self.clock.now(), self.clock.monotonic()
        self.expiry = now_mono + (self.expires - now_wall)  # local monotonic expiry
        self.confirmed = now_mono
        self.stopped_at: float | None = None  # monotonic time the loss was declared

    # ------------------------------------------------------------------ for the owner
    @property
    def deadline(self) -> float:
        """Monotonic time by which the worker is told to stop unless a renewal is confirmed."""
        return self.expiry - self.timing.grace - self.timing.margin

    def stop(self) -> None:
        """Stop renewing (the owner is done); wakes the loop."""
        self._stop.set()

    def report(self, note: str) -> None:
        """Progress to record with the next renewal (``renew --progress``)."""
        with self._lock:
            self._progress = note

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug in an attempt must not leave a worker running unguarded
            self._lose(f"heartbeat failed: {type(exc).__name__}: {exc}")
            if not isinstance(exc, Exception):
                raise

    def _loop(self) -> None:
        if self.clock.monotonic() >= self.deadline:
            self._lose("the lease is too close to its expiry to keep it safely")
            return
        while True:
            next_at = min(self.confirmed + self.timing.renew_every, self.deadline)
            if self._wait(self._stop, next_at - self.clock.monotonic()):
                return
            if not self._renew_before_deadline():
                return

    def _renew_before_deadline(self) -> bool:
        pause = RETRY_FIRST
        last = "no renewal attempt fitted before the deadline"
        while True:
            if self._stop.is_set():
                return False
            now = self.clock.monotonic()
            budget = min(self.timing.timeout, self.deadline - now)
            if budget < MIN_ATTEMPT:
                self._lose(f"no renewal confirmed before the stop deadline ({last})")
                return False
            with self._lock:
                note = self._progress
            wall0, mono0 = self.clock.now(), self.clock.monotonic()
            try:
                expires = self.attempt(budget, note)
            except LeaseLost as exc:
                self.beats.append(Beat(mono0, False, budget, str(exc)))
                self._lose(str(exc))
                return False
            except GitLeaseError as exc:  # unreachable, timed out, outcome unknown: retry while time is left
                last = str(exc)
                self.beats.append(Beat(mono0, False, budget, last))
                wait = min(pause, self.deadline - self.clock.monotonic() - MIN_ATTEMPT)
                pause = min(pause * 2, RETRY_CAP)
                if wait <= 0:  # no time for a pause and another attempt
                    self._lose(f"no renewal confirmed before the stop deadline ({last})")
                    return False
                if self._wait(self._stop, wait):
                    return False
                continue
            self.beats.append(Beat(mono0, True, budget))
            with self._lock:
                if self._progress == note:
                    self._progress = None
            self.confirmed = mono0
            self.expiry = mono0 + (expires - wall0)
            if self.on_renewed:
                self.on_renewed(self.expiry)
            return True

    def _lose(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.reason = reason
        self.stopped_at = self.clock.monotonic()
        self.lost.set()
        if self.on_lost:
            self.on_lost(reason)


def service_attempt(svc, lease_id: str, *, ttl: int | None = None) -> Attempt:
    """An Attempt that renews ``lease_id`` with ``svc`` (a LeaseService used by this heartbeat alone): the lock
    wait and each of the renewal's git calls get a quarter of the budget, so the whole attempt ends within it."""

    def attempt(budget: float, progress: str | None) -> float:
        svc.store.timeout = max(0.1, budget / CALLS_PER_RENEWAL)
        return svc.renew(lease_id, ttl=ttl, progress=progress).record.expires

    return attempt


__all__ = ["Timing", "Heartbeat", "Beat", "service_attempt", "waiter_for", "event_wait"]
