"""``gitlease.hold``: a lease held for the length of a ``with`` block, renewed by a background thread.

::

    with gitlease.hold(".", scope=["services/billing"], ttl=300) as lease:
        for step in work:
            lease.check()          # raises LeaseLost once the lease is lost: stop writing
            step()
            lease.progress("tests 40/120")   # recorded with the next renewal

``lease.lost`` is a threading.Event, set when a renewal is refused or none is confirmed by the stop deadline
(``Timing``: ``grace`` seconds before the lease could expire). Leaving the block stops the heartbeat and releases
the lease; leaving it normally after a loss raises LeaseLost, so a caller never mistakes unprotected work for
protected work. Every git call of the heartbeat has a hard timeout that ends before the stop deadline.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from .errors import GitLeaseError, LeaseLost
from .heartbeat import Heartbeat, Timing, service_attempt


@dataclass
class Lease:
    lease_id: str
    paths: tuple[str, ...]
    timing: Timing
    heartbeat: Heartbeat = field(repr=False)

    @property
    def lost(self) -> threading.Event:
        return self.heartbeat.lost

    @property
    def reason(self) -> str | None:
        return self.heartbeat.reason

    def check(self) -> None:
        """Raise LeaseLost (exit code 6) once the lease is lost."""
        if self.heartbeat.lost.is_set():
            raise LeaseLost(f"lease lost: {self.lease_id}: {self.heartbeat.reason} (stop writing)",
                            leaseId=self.lease_id)

    def progress(self, note: str) -> None:
        """A progress note ("tests 40/120") sent with the next renewal."""
        self.heartbeat.report(note)


def _timing(settings, ttl: int, renew_every: float | None, timeout: float | None, grace: float | None) -> Timing:
    if timeout is None:
        timeout = min(settings.timeout, ttl / 6)
    return Timing.for_ttl(ttl, renew_every=renew_every, timeout=timeout, grace=grace)


@contextlib.contextmanager
def hold(repo: str = ".", scope: Sequence[str] = (), *, ttl: int | None = None, renew_every: float | None = None,
         wait: float | None = None, remote: str | None = None, grace: float | None = None,
         timeout: float | None = None, on_lost: Callable[[str], None] | None = None, clock=None, signer=None,
         service=None, **flags: Any) -> Iterator[Lease]:
    """Acquire ``scope`` in ``repo`` (waiting up to ``wait`` seconds while it is held), renew it in a
    background thread, release it when the block ends. ``service``: an existing LeaseService (tests)."""
    from . import open_service
    from .service import LeaseService

    svc = service or open_service(repo, remote=remote, clock=clock, signer=signer, **flags)
    ttl = int(ttl or svc.settings.ttl)
    timing = _timing(svc.settings, ttl, renew_every, timeout, grace)
    acquire_args = dict(ttl=ttl, renew_every=max(1, int(timing.renew_every)))
    if wait is not None:
        from .wait import acquire_wait

        got = acquire_wait(svc, scope, wait=wait, **acquire_args)
    else:
        got = svc.acquire(scope, **acquire_args)
    beat_svc = LeaseService(svc.repo, svc.settings, clock=svc.clock, signer=svc.signer)
    hb = Heartbeat(service_attempt(beat_svc, got.lease_id), timing, got.record.expires, clock=svc.clock,
                   on_lost=on_lost)
    thread = threading.Thread(target=hb.run, name=f"gitlease-heartbeat-{got.lease_id}", daemon=True)
    lease = Lease(got.lease_id, got.record.paths, timing, hb)
    thread.start()
    body_failed = False
    try:
        yield lease
    except BaseException:
        body_failed = True
        raise
    finally:
        hb.stop()
        thread.join(timing.timeout + 1)  # an attempt in flight ends within its budget
        lost = hb.lost.is_set()
        saved = svc.store.timeout
        if lost:  # the store may be what failed: do not let the release hang for the full timeout
            svc.store.timeout = min(float(saved), timing.timeout)
        try:
            svc.release(got.lease_id)
        except GitLeaseError:
            if not (lost or body_failed):
                raise
        finally:
            svc.store.timeout = saved
        if lost and not body_failed:
            lease.check()


__all__ = ["hold", "Lease"]
