"""The lease service as the reclaimer: a stale lease's refs deleted and the reclaim audited in one atomic push
(``reclaim``, ``reclaim_many``: gitlease/ops/sweep.py decides which), an expired blocker cleared on the way
to an acquire (``_clear``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gitlease.core.store import (
    RefUpdate,
)
from gitlease.service.base import ServiceBase
from gitlease.service.views import (
    LeaseView,
)

if TYPE_CHECKING:
    from gitlease.service.audit import Appended, AuditLog


class Reclaims(ServiceBase):
    """A role of ``LeaseService`` (gitlease/service/leases.py): see this module's docstring."""

    def _clear(self, view: LeaseView) -> bool:
        """CAS-delete exactly the refs of an expired lease, at the values we read, with its audit entry."""
        if not view.refs():
            return False
        exp = view.expires()
        reason = f"expired={int(self.clock.now() - exp)}s" if exp is not None else "expired"
        return self.reclaim(view, action="clear", rule="expired", reason=reason).ok

    @functools.cached_property
    def audit(self) -> AuditLog:
        """This writer's audit log (``refs/leases-audit/<agent>``: one ref per writer, no contention)."""
        from gitlease.core.cachenames import cache_path
        from gitlease.service.audit import AuditLog, writer_id

        writer = writer_id(self.settings.agent)
        return AuditLog(
            self.store,
            self.objects,
            self.signer,
            self.clock,
            writer=writer,
            head_cache=cache_path(self.repo.shared_dir(), f"audit-{writer}", self.store.name),
        )

    def reclaim(self, view: LeaseView, *, action: str, rule: str, reason: str, by: str | None = None) -> Appended:
        """Delete exactly ``view``'s refs at the values read AND append the audit entry (who, which lease,
        which version, why, when) in ONE atomic transaction: never a reclaim without its record. A lease that
        changed since it was read (renewed, released, reclaimed by another) makes it all fail: ``changed``."""
        self.require_store()
        fields = self._reclaim_fields(view, action=action, rule=rule, reason=reason, by=by)
        deletes = [RefUpdate(ref, None, oid) for ref, oid in sorted(view.refs().items())]
        return self.audit.append_with(deletes, fields, pointer=view.current_oid or view.grant_oid)

    def reclaim_many(self, items: Sequence[tuple[LeaseView, str, str, str, str | None]]) -> tuple[list[Appended], int]:
        """``reclaim`` of many leases ((view, action, rule, reason, by) each) in as few pushes as git allows:
        one atomic push with all their deletes and audit entries; a lease that changed since it was read is
        ``changed`` and the others go again without it (``AuditLog.append_many``). Returns one result per item
        and the number of pushes."""
        self.require_store()
        batch = []
        for view, action, rule, reason, by in items:
            fields = self._reclaim_fields(view, action=action, rule=rule, reason=reason, by=by)
            deletes = [RefUpdate(ref, None, oid) for ref, oid in sorted(view.refs().items())]
            batch.append((deletes, fields, view.current_oid or view.grant_oid))
        return self.audit.append_many(batch)

    def _reclaim_fields(
        self, view: LeaseView, *, action: str, rule: str, reason: str, by: str | None
    ) -> dict[str, object]:
        rec = view.record
        return {
            "action": action,
            "rule": rule,
            "reason": reason,
            "by": by or self.settings.agent,
            "leaseId": view.lease_id,
            "version": rec.version if rec else None,
            "oid": view.current_oid,
            "grant": view.grant_oid,
            "refs": view.refs(),
            "paths": list(view.paths),
            "owner": rec.owner.to_json() if rec else None,
            "expiresAt": rec.expires_at if rec else None,
            "valid": view.valid,
        }
