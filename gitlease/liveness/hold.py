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

The lease is a ``Holding`` (gitlease/liveness/holding.py): the one lifecycle that ``git lease run``, the queue runner
and the MCP session use too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gitlease.liveness.holding import Holding, HoldOptions

Lease = Holding  # what ``hold()`` yields: lease_id, paths, lost, reason, check(), progress(), extend(), narrow()


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
    progress_timeout: float | None = None,
    **flags: Any,
) -> Iterator[Holding]:
    """Acquire ``scope`` in ``repo`` (waiting up to ``wait`` seconds while it is held), renew it in a
    background thread, release it when the block ends. ``scope``: path prefixes, or one as a string.
    ``service``: an existing LeaseService (tests).

    After a loss, leaving the block raises LeaseLost, also when the body caught the LeaseLost that
    ``lease.check()`` raised: work done after a loss was not protected, and the caller must hear it once more
    where it can act. Catch it around the ``with``, not only inside it.
    ``renew_agent``: renew through the per-host agent (default: git config ``lease.renewAgent``, true; never
    for leases in the repository's own refs); ``agent_client``: an AgentClient (default: the usual socket).
    ``release=False`` (or ``lease.release_on_exit = False`` inside the block): leaving the block stops renewing
    but keeps the lease until it expires (it can be renewed or released later from the same worktree).
    ``progress_timeout``: lost after reporting no progress this long (default: git config
    ``lease.progressTimeout``; 0: never)."""
    from gitlease.core.errors import GitLeaseError
    from gitlease.service.factory import open_service

    svc = service or open_service(repo, remote=remote, clock=clock, signer=signer, **flags)
    options = HoldOptions(
        ttl=ttl,
        renew_every=renew_every,
        timeout=timeout,
        grace=grace,
        wait=wait,
        renew_agent=renew_agent,
        progress_timeout=progress_timeout,
        release=release,
    )
    lease = Holding.acquire(svc, scope, options, agent_client=agent_client)
    if on_lost is not None:
        lease.on_lost(on_lost)
    lease.start()
    body_failed = False
    try:
        yield lease
    except BaseException:
        body_failed = True
        raise
    finally:
        closed = lease.close()
        if closed.release_error is not None and not (closed.lost or body_failed):
            err: GitLeaseError = closed.release_error
            raise err
        if closed.lost and not body_failed:
            lease.check()


__all__ = ["hold", "Lease"]
