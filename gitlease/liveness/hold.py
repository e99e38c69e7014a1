"""``gitlease.hold``: a lease held for the length of a ``with`` block, renewed by a background thread.

::

    with gitlease.hold(".", scope=["services/billing"], ttl=300) as lease:
        for step in work:
            lease.check()          # raises LeaseLost once the lease is lost: stop writing
            step()
            lease.progress("tests 40/120")   # recorded with the next renewal
            lease.extend(["docs/billing.md"])   # one more path, in one atomic push (exit 3 if held)

``lease.lost`` is a threading.Event, set when a renewal is refused or none is confirmed by the stop deadline
(``Timing``: ``grace`` seconds before the lease could expire). Leaving the block stops the heartbeat and releases
the lease; leaving it normally after a loss raises LeaseLost (also when the body caught one from ``check()``),
so a caller never mistakes unprotected work for protected work. Every git call of the heartbeat has a hard
timeout that ends before the stop deadline.

By default the lease is handed to the per-host renewal agent (docs/agent.md; started on demand): the acquire
and the release go through it (due renewals of other local leases ride in the same push), and the heartbeat
asks it for the lease's state instead of pushing; if the agent dies the heartbeat renews by itself
(gitlease/liveness/delegate.py). ``renew_agent=False`` (or git config ``lease.renewAgent false``) renews by itself only.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gitlease.core.errors import GitLeaseError, LeaseLost
from gitlease.liveness.heartbeat import Attempt, Heartbeat, Timing, service_attempt

if TYPE_CHECKING:
    from gitlease.liveness.delegate import AgentAttempt


@dataclass
class Lease:
    lease_id: str
    paths: tuple[str, ...]
    timing: Timing
    heartbeat: Heartbeat = field(repr=False)
    agent: Any = field(default=None, repr=False)  # the AgentAttempt when renewed through the agent, else None
    service: Any = field(default=None, repr=False)  # the LeaseService that holds it (extend, narrow)
    release_on_exit: bool = True  # False: leaving the block stops renewing and keeps the lease until it expires

    @property
    def lost(self) -> threading.Event:
        return self.heartbeat.lost

    @property
    def reason(self) -> str | None:
        return self.heartbeat.reason

    def check(self) -> None:
        """Raise LeaseLost (exit code 6) once the lease is lost."""
        if self.heartbeat.lost.is_set():
            raise LeaseLost.of(self.lease_id, self.heartbeat.reason or "no renewal confirmed")

    def progress(self, note: str) -> None:
        """A progress note ("tests 40/120") sent with the next renewal."""
        self.heartbeat.report(note)

    def extend(self, paths: Sequence[str], *, ttl: int | None = None):
        """Add ``paths`` to this lease in one atomic push (``LeaseService.extend``): HeldError (exit 3) naming the
        holder when one overlaps another lease, and then nothing was added. Returns the service's ``Resized``."""
        return self._resize(self.service.extend, paths, ttl)

    def narrow(self, paths: Sequence[str], *, ttl: int | None = None):
        """Give ``paths`` (whole scopes of this lease) back in one atomic push (``LeaseService.narrow``)."""
        return self._resize(self.service.narrow, paths, ttl)

    def _resize(self, method, paths: Sequence[str], ttl: int | None):
        self.check()
        got = method(self.lease_id, list(paths), ttl=ttl)
        self.paths = got.record.paths  # the heartbeat renews from the held state, which has the new scope
        return got


def _timing(settings, ttl: int, renew_every: float | None, timeout: float | None, grace: float | None) -> Timing:
    if timeout is None:
        timeout = min(settings.timeout, ttl / 6)
    return Timing.for_ttl(ttl, renew_every=renew_every, timeout=timeout, grace=grace)


@contextlib.contextmanager
def hold(
    repo: str = ".",
    scope: Sequence[str] = (),
    *,
    ttl: int | None = None,
    renew_every: float | None = None,
    wait: float | None = None,
    remote: str | None = None,
    grace: float | None = None,
    timeout: float | None = None,
    on_lost: Callable[[str], None] | None = None,
    clock=None,
    signer=None,
    service=None,
    renew_agent: bool | None = None,
    agent_client=None,
    release: bool = True,
    **flags: Any,
) -> Iterator[Lease]:
    """Acquire ``scope`` in ``repo`` (waiting up to ``wait`` seconds while it is held), renew it in a
    background thread, release it when the block ends. ``scope``: path prefixes, or one as a string.
    ``service``: an existing LeaseService (tests).

    After a loss, leaving the block raises LeaseLost, also when the body caught the LeaseLost that
    ``lease.check()`` raised: work done after a loss was not protected, and the caller must hear it once more
    where it can act. Catch it around the ``with``, not only inside it.
    ``renew_agent``: renew through the per-host agent (default: git config ``lease.renewAgent``, true; never
    for leases in the repository's own refs); ``agent_client``: an AgentClient (default: the usual socket).
    ``release=False`` (or ``lease.release_on_exit = False`` inside the block): leaving the block stops renewing
    but keeps the lease until it expires (it can be renewed or released later from the same worktree)."""
    from gitlease.liveness.delegate import AgentLink
    from gitlease.liveness.wait import obtain
    from gitlease.service.factory import open_service
    from gitlease.service.leases import LeaseService

    if isinstance(scope, str):  # one scope, "services/tax", not its characters
        scope = [scope]
    svc = service or open_service(repo, remote=remote, clock=clock, signer=signer, **flags)
    ttl = int(ttl or svc.settings.ttl)
    timing = _timing(svc.settings, ttl, renew_every, timeout, grace)
    link = AgentLink.connect(svc, renew_agent, client=agent_client)
    acquire_args: dict[str, Any] = dict(
        ttl=ttl, renew_every=max(1, int(timing.renew_every)), stop_after=timing.stop_after
    )
    if link:
        acquire_args["holder_pid"] = os.getpid()
    got, _ = obtain(svc, scope, wait=wait, link=link, **acquire_args)
    beat_svc = LeaseService(svc.repo, svc.settings, clock=svc.clock, signer=svc.signer)
    attempt: Attempt = service_attempt(beat_svc, got.lease_id, stop_after=timing.stop_after)
    agent_attempt: AgentAttempt | None = None
    if link and link.register(got.lease_id, os.getpid(), timing):
        attempt = agent_attempt = link.attempt(
            got.lease_id, timing, got.record.expires, attempt, got.record.stop_deadline
        )
    else:
        link = None
    hb = Heartbeat(
        attempt,
        timing,
        got.record.expires,
        clock=svc.clock,
        on_lost=on_lost,
        stop_by=got.record.stop_deadline,
        progress_timeout=svc.settings.progress_timeout,
    )
    thread = threading.Thread(target=hb.run, name=f"gitlease-heartbeat-{got.lease_id}", daemon=True)
    lease = Lease(got.lease_id, got.record.paths, timing, hb, attempt if link else None, svc, release)
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
            if not lease.release_on_exit and not lost:
                if link is not None:
                    link.unregister(got.lease_id)  # nobody renews it any more: it expires on its own
            elif link is not None and agent_attempt is not None and not agent_attempt.fallen and not lost:
                link.release(got.lease_id)
            else:
                if link is not None:
                    link.unregister(got.lease_id)
                svc.release(got.lease_id)
        except GitLeaseError:
            if not (lost or body_failed):
                raise
        finally:
            svc.store.timeout = saved
        if lost and not body_failed:
            lease.check()


__all__ = ["hold", "Lease"]
