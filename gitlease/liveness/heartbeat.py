"""Keeping a lease alive: renew at an interval, and declare it lost at a deadline safely ahead of the moment
anyone else may take it.

The rule (docs/protocol.md, "Heartbeats"): after a renewal is confirmed at local time ``t`` with expiry ``E``
and stop deadline ``H`` (the record's ``stopBy``: ``Timing.stop_after`` after the renewal, never later than
``E - margin/2``), the next renewal starts at ``t + renew_every``. Failed attempts (remote unreachable, timed
out) are retried while they can still finish before the stop deadline ``D = H - grace - margin/2``; every git
call of an attempt is bounded so that the attempt ends by then. A refused renewal (the lease changed or
vanished: exit 6), or no confirmed renewal by ``D``, is a loss: the owner stops its worker, and has ``grace``
seconds to do so, so the worker is gone by ``H``: before any early reclaim rule (after ``stopBy + skew``) and
before the lease expires. ``Timing.check`` refuses at start any combination where one renewal interval, one
request timeout and the grace period do not fit in the TTL.

With ``progress_timeout`` (``lease.progressTimeout``), a holder that has reported progress once and then
reports none for that long is lost as well, and stopped by then.

Time is injected: the loop reads ``clock.monotonic()`` and waits through ``wait(stop_event, seconds)``; a test
passes a FakeClock and drives the whole schedule without sleeping. Standard library only.
"""

from __future__ import annotations

import math
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

    @property
    def stop_after(self) -> int:
        """Seconds from a renewal to the moment the holder has stopped if no later renewal is confirmed: what it
        records as ``stopBy`` (the early reclaim rules wait for it). Two renewal intervals (what the
        missed-heartbeats rule presumes of a holder), but at least one whole attempt after an interval
        (``renew_every + timeout + grace`` and twice the margin: ``stopBy`` has one-second resolution), and at
        most the TTL (then the stop deadline is the expiry, as for a holder that promises nothing)."""
        need = math.ceil(self.renew_every + self.timeout + self.grace + 2 * self.margin)
        return int(min(int(self.ttl), max(math.ceil(2 * self.renew_every), need)))

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


@dataclass(frozen=True)
class Confirmed:
    """What a confirmed renewal gives: the new version's expiry and stop deadline (wall clock, epoch seconds;
    ``stop_by`` None: the expiry)."""

    expires: float
    stop_by: float | None = None


# An attempt: (time budget in seconds, progress note or None) -> the new version's Confirmed (or its expiry alone).
Attempt = Callable[[float, "str | None"], "Confirmed | float"]


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
    stop_by: float | None = None  # wall-clock stop deadline of the version the holder has now (None: expires)
    progress_timeout: float | None = None  # lease.progressTimeout: lost after reporting no progress this long
    poll: Callable[[], None] | None = None  # called at each wake-up (``git lease run`` reads the command's progress)

    def __post_init__(self) -> None:
        self.timing.check()
        self._stop = threading.Event()
        self._wait = self.wait or waiter_for(self.clock)
        self._progress: str | None = None
        self._lock = threading.Lock()
        self._made: object = None  # the last progress made (core.progress.Progress), and when (monotonic)
        self.progress_at: float | None = None
        now_wall, now_mono = self.clock.now(), self.clock.monotonic()
        self._take(now_mono, now_wall, Confirmed(self.expires, self.stop_by))
        self.confirmed = now_mono
        self.stopped_at: float | None = None  # monotonic time the loss was declared

    def _take(self, mono0: float, wall0: float, got: Confirmed) -> None:
        """The local (monotonic) expiry and hard stop of a version confirmed at ``mono0`` / ``wall0``."""
        self.expiry = mono0 + (got.expires - wall0)
        hard = self.expiry - self.timing.margin / 2
        if got.stop_by is not None:
            hard = min(hard, mono0 + (got.stop_by - wall0))
        self.hard_stop = hard  # everything of the holder has stopped by then (the watchdog's SIGKILL at the latest)

    # ------------------------------------------------------------------ for the owner
    @property
    def deadline(self) -> float:
        """Monotonic time by which the worker is told to stop unless a renewal is confirmed."""
        return self.hard_stop - self.timing.grace - self.timing.margin / 2

    @property
    def progress_deadline(self) -> float | None:
        """Monotonic time by which the worker is told to stop unless it reports progress (``progress_timeout``,
        once it has reported some), so that it has stopped ``margin/2`` before the stalled rule could apply."""
        if not self.progress_timeout or self.progress_at is None:
            return None
        return self.progress_at + self.progress_timeout - self.timing.grace - self.timing.margin / 2

    def stop(self) -> None:
        """Stop renewing (the owner is done); wakes the loop."""
        self._stop.set()

    def report(self, note: str) -> None:
        """Progress to record with the next renewal (``renew --progress``). Progress is *made* when the note or
        its counter changes (core.progress: the record's ``progress.at`` moves only then), and that restarts the
        progress timeout."""
        from gitlease.core.progress import next_progress

        with self._lock:
            self._progress = note
            made = next_progress(note, self._made, self.clock.now())  # type: ignore[arg-type]
            if made is not self._made:
                self._made, self.progress_at = made, self.clock.monotonic()

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        self._wait = self.wait or waiter_for(self.clock)  # ``wait`` may be set after construction
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
            # the next attempt: after the interval, and early enough that a whole attempt fits before the
            # deadline (a renewal made by the renewal agent before this holder heard of it leaves less time)
            due = min(self.confirmed + self.timing.renew_every, self.deadline - self.timing.timeout)
            wake = min(due, self.deadline)
            pd = self.progress_deadline
            if pd is not None:
                wake = min(wake, pd)
            if self._wait(self._stop, wake - self.clock.monotonic()):
                return
            if self.poll is not None:
                self.poll()
            if self._stalled():
                return
            if self.clock.monotonic() < due:
                continue  # woken for the progress deadline, and progress came
            if not self._renew_before_deadline():
                return

    def _stalled(self) -> bool:
        pd = self.progress_deadline
        if pd is None or self.clock.monotonic() < pd:
            return False
        self._lose(
            f"no progress reported for {self.progress_timeout:g}s (lease.progressTimeout): stopped before the "
            "stalled rule may reclaim the lease"
        )
        return True

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
                got = self.attempt(budget, note)
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
            self._take(mono0, wall0, got if isinstance(got, Confirmed) else Confirmed(float(got)))
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


__all__ = ["Timing", "Heartbeat", "Beat", "Confirmed", "waiter_for", "event_wait"]
