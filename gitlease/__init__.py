"""gitlease: scoped, expiring, renewable leases on repository paths, stored as refs on a git remote.

The Python API for agent runners::

    from gitlease import open_service
    svc = open_service(".", remote="origin")
    lease = svc.acquire(["services/billing"], ttl=300)
    svc.renew(lease.lease_id)
    svc.release(lease.lease_id)

Or held for a block, renewed in a background thread, released at the end::

    import gitlease
    with gitlease.hold(".", scope=["services/billing"], ttl=300, wait=600) as lease:
        lease.check()   # raises LeaseLost once the lease is lost: stop writing

A queue of tasks run to landed commits (``git lease work``, docs/work.md)::

    summary = gitlease.work("queue.jsonl", workers=4, command=["./agent.sh"], verify="make test", land="main")
"""

from __future__ import annotations

from gitlease.core.errors import (
    GitLeaseError,
    HeldError,
    InvalidRecord,
    LeaseLost,
    NotHeld,
    RemoteUnavailable,
    ScopeError,
    ScopeViolation,
    UntrustedWriter,
)

__version__ = "0.1.0"


def open_service(path: str = ".", *, remote: str | None = None, clock=None, signer=None, **flags):
    """A LeaseService for the repository at ``path`` with settings resolved as the CLI does."""
    from gitlease.service.factory import open_service as _open

    return _open(path, remote=remote, clock=clock, signer=signer, **flags)


def hold(repo: str = ".", scope=(), **options):
    """A context manager holding a lease on ``scope`` for a ``with`` block (see gitlease.liveness.hold.hold)."""
    from gitlease.liveness.hold import hold as _hold

    return _hold(repo, scope, **options)


def __getattr__(name: str):
    if name == "work":  # the queue runner's package, itself callable: gitlease.work(queue, ...)
        import gitlease.work

        return gitlease.work
    raise AttributeError(f"module 'gitlease' has no attribute {name!r}")


__all__ = [
    "open_service",
    "work",
    "hold",
    "GitLeaseError",
    "HeldError",
    "InvalidRecord",
    "LeaseLost",
    "NotHeld",
    "RemoteUnavailable",
    "ScopeError",
    "ScopeViolation",
    "UntrustedWriter",
    "__version__",
]
