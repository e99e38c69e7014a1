"""The lease service's fenced push: branches and the lease's renewal in one atomic push to the lease store,
so a holder whose lease was taken over lands nothing (gitlease/enforce/push.py checks the paths first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gitlease.core.errors import (
    UsageError,
)
from gitlease.core.store import (
    RemoteStore,
    same_remote,
)
from gitlease.service.base import ServiceBase
from gitlease.service.results import Renewed

if TYPE_CHECKING:
    pass


class Fencing(ServiceBase):
    """A role of ``LeaseService`` (gitlease/service/leases.py): see this module's docstring."""

    def push_fenced(self, lease_id: str, remote: str, refspecs: Sequence[str], *, ttl: int | None = None) -> Renewed:
        """Push ``refspecs`` (branches; never ``+``) and renew ``lease_id`` in ONE atomic push to the lease
        store, so the branches land only if the lease is still at the version this worktree wrote: a holder
        whose lease was taken over cannot land its commits (docs/protocol.md, "Fenced pushes").

        Only when the lease store is the remote pushed to; anything else is refused (UsageError). Paths are not
        checked here: ``gitlease.enforce.push.fenced_push`` checks them first, and is what callers use."""
        self.check_fence(remote)
        for spec in refspecs:
            if spec.startswith("+") or spec.startswith(":") or ":" not in spec:
                raise UsageError(f"refspec {spec!r}: a fenced push takes src:dst, without '+' and no deletes")
        return self.renew(lease_id, ttl=ttl, extra_refspecs=list(refspecs))

    def check_fence(self, remote: str) -> None:
        """UsageError unless a fenced push to ``remote`` can carry this store's lease renewal."""
        self.require_store()
        if not isinstance(self.store, RemoteStore):
            raise UsageError(
                "a fenced push needs the lease store on the remote you push to, but leases are "
                "in this repository's own refs (no lease.remote); set lease.remote to that remote, "
                "or use 'git lease renew' and then 'git push' (not fenced)"
            )
        if not same_remote(self.repo.cwd, self.store.remote, remote):
            raise UsageError(
                f"a fenced push needs the lease store and the branch on one remote, but leases are "
                f"on {self.store.remote!r} and the branch goes to {remote!r}; push to "
                f"{self.store.remote!r}, or use 'git lease renew' and then 'git push' (not fenced)"
            )
