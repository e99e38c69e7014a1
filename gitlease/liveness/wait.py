"""Waiting for a scope: ``git lease acquire --wait 10m`` and ``hold(..., wait=...)``, like ``flock -w``.

One acquire first (a single push when nothing blocks). While the scope is held, poll with reads only
(``can_start``: one listing, no push; hosts limit pushes far more than reads) on a jittered exponential backoff,
and try to acquire again as soon as nothing blocks; a lost race just waits again. At the deadline the last
refusal is raised (HeldError, exit 3), naming the holders. Errors other than "held" (the store unreachable)
end the wait at once: writes fail closed.

Time is injected (``clock.monotonic`` and ``clock.sleep``): a test moves a FakeClock and never sleeps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.errors import HeldError

if TYPE_CHECKING:  # random is imported where a wait needs it: not on every acquire's start-up
    import random


@dataclass(frozen=True)
class Backoff:
    first: float = 0.5
    factor: float = 2.0
    cap: float = 15.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Equal jitter: between half and all of the exponential step, so waiters spread out."""
        step = min(self.cap, self.first * self.factor**attempt)
        return rng.uniform(step / 2, step)


def acquire_wait(
    svc,
    raw_scopes: Sequence[str],
    *,
    wait: float,
    clock: Clock | None = None,
    backoff: Backoff = Backoff(),
    rng: random.Random | None = None,
    on_wait: Callable[[HeldError, float], None] | None = None,
    acquire: Callable[..., Any] | None = None,
    **acquire_args: Any,
):
    """``svc.acquire(raw_scopes, **acquire_args)``, retried until it succeeds or ``wait`` seconds have passed
    (then the last HeldError is raised). ``on_wait(refusal, seconds)`` is told before each pause. ``acquire``:
    another function with acquire's signature to retry (the worktree manager's: lease, then worktree)."""
    import random

    acquire = acquire or svc.acquire
    clock = clock or svc.clock or SYSTEM
    rng = rng or random.Random()
    deadline = clock.monotonic() + max(0.0, wait)
    attempt = 0
    try:
        return acquire(raw_scopes, **acquire_args)
    except HeldError as exc:
        refusal = exc
    while True:
        left = deadline - clock.monotonic()
        if left <= 0:
            raise HeldError(f"{refusal.message} (gave up after waiting {wait:g}s)", **refusal.details)
        pause = min(backoff.delay(attempt, rng), left)
        attempt += 1
        if on_wait:
            on_wait(refusal, pause)
        clock.sleep(pause)
        paths, blockers, _snap = svc.can_start(raw_scopes)
        if blockers:
            from gitlease.service.views import held_error

            now = clock.now()
            refusal = held_error(paths, blockers, now, svc.settings.skew)
            continue
        try:
            return acquire(raw_scopes, **acquire_args)
        except HeldError as exc:  # lost the race to another waiter
            refusal = exc


def obtain(
    svc,
    raw_scopes: Sequence[str],
    *,
    wait: float | None = None,
    on_wait: Callable[[HeldError, float], None] | None = None,
    link=None,
    worktree=None,
    **acquire_args: Any,
):
    """The one way ``hold()``, ``git lease run`` and ``git lease acquire`` get a lease: through the renewal agent
    when ``link`` (a delegate.AgentLink) is given, else by the service itself; with ``worktree`` (a
    WorktreeManager) a clean worktree is attached to the new lease (``acquire_args`` may then name ``base`` and
    ``branch``); with ``wait``, retried while the scope is held for up to that many seconds (``acquire_wait``).
    Returns (Acquired, the worktree's Attached or None)."""
    if worktree is not None:
        do = worktree.acquire
    elif link is not None:
        do = link.acquire
    else:
        do = svc.acquire
    if wait is not None:
        got = acquire_wait(svc, raw_scopes, wait=wait, on_wait=on_wait, acquire=do, **acquire_args)
    else:
        got = do(raw_scopes, **acquire_args)
    if worktree is not None:
        return got.acquired, got
    return got, None


__all__ = ["Backoff", "acquire_wait", "obtain"]
