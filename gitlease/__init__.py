"""gitlease: scoped, expiring, renewable leases on repository paths, stored as refs on a git remote.

The Python API for agent runners::

    from gitlease import open_service
    svc = open_service(".", remote="origin")
    lease = svc.acquire(["services/billing"], ttl=300)
    svc.renew(lease.lease_id)
    svc.release(lease.lease_id)
"""
from __future__ import annotations

from .errors import (GitLeaseError, HeldError, InvalidRecord, LeaseLost, NotHeld, RemoteUnavailable,
                     ScopeError, ScopeViolation)

__version__ = "0.1.0"


def open_service(path: str = ".", *, remote: str | None = None, clock=None, signer=None, **flags):
    """A LeaseService for the repository at ``path`` with settings resolved as the CLI does."""
    from .clock import SYSTEM
    from .config import resolve
    from .repo import Repo
    from .service import LeaseService
    from .signer import UNSIGNED, load_signer

    repo = Repo.discover(path)
    settings = resolve(repo.config, remote=remote, **flags)
    if signer is None:
        signer = load_signer(settings.signing_key) if settings.signing_key else UNSIGNED
    return LeaseService(repo, settings, clock=clock or SYSTEM, signer=signer)


__all__ = ["open_service", "GitLeaseError", "HeldError", "InvalidRecord", "LeaseLost", "NotHeld",
           "RemoteUnavailable", "ScopeError", "ScopeViolation", "__version__"]
