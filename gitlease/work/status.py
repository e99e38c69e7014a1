"""``git lease work --status QUEUE``: every task's state, read from the store (its outcome, its claim, the
leases blocking its scope), without running anything."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.refnames import QUARANTINE_PREFIX, TASK_PREFIX, decode_segment
from gitlease.service.outcomes import Outcomes


@dataclass
class TaskState:
    id: str
    state: str  # done | failed | retrying | running | waiting | pending
    attempts: int = 0
    reason: str = ""
    quarantine: str | None = None
    landed: str | None = None
    lease: str | None = None
    holder: str | None = None
    scope: tuple[str, ...] = ()
    host: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "attempts": self.attempts,
            "reason": self.reason,
            "quarantine": self.quarantine,
            "landed": self.landed,
            "lease": self.lease,
            "holder": self.holder,
            "scope": list(self.scope),
            "host": self.host,
        }

    def line(self) -> str:
        bits = [f"{self.state:<8} {self.id}", f"attempts={self.attempts}"]
        if self.landed:
            bits.append(f"landed={self.landed[:12]}")
        if self.lease:
            bits.append(f"lease={self.lease} by {self.holder}")
        if self.quarantine:
            local = self.host and not self.quarantine.startswith(QUARANTINE_PREFIX)  # parked: on the store
            bits.append(f"quarantine={self.quarantine}" + (f" on {self.host}" if local else ""))
        if self.reason and self.state != "done":
            bits.append(f"reason: {self.reason}")
        return "  ".join(bits)


def queue_status(repo: str, tasks, *, granularity: str | None = None, remote: str | None = None, clock: Clock = SYSTEM):
    """Every task's state from the store: done / failed / retrying (outcome), running (claimed by a live
    lease), waiting (its scope is held), pending. Returns (list of TaskState, counts)."""
    from gitlease.plan.planner import blocking_leases
    from gitlease.service.factory import open_service
    from gitlease.work.runner import make_source

    source = make_source(repo, tasks, granularity=granularity, remote=remote)
    svc = open_service(repo, remote=remote, clock=clock)
    snap = svc.snapshot(use_cache=False)
    outs = Outcomes(svc).read(snap.listing)
    now = clock.now()
    claims: dict[str, Any] = {}
    for lv in snap.leases:
        for ref in lv.task_refs:
            with contextlib.suppress(ValueError):
                claims[decode_segment(ref[len(TASK_PREFIX) :])] = lv
    held = blocking_leases(snap, now, svc.settings.skew)
    from gitlease.core import scope as scopes

    out = []
    for t in source.tasks():
        o = outs.get(t.id)
        st = TaskState(t.id, "pending", scope=t.scope)
        if o is not None:
            st.state, st.attempts, st.reason = o.state, o.attempts, o.reason
            st.quarantine, st.landed, st.host = o.quarantine, o.landed, o.host
        v = claims.get(t.id)
        if v is not None and not (o is not None and o.final):
            st.state, st.lease = "running", v.lease_id
            st.holder = f"{v.record.owner.agent_id}@{v.record.owner.host}" if v.record else "?"
        elif st.state in ("pending", "retrying") and any(scopes.sets_overlap(p, t.scope) for _l, p in held):
            st.state = "waiting" if st.state == "pending" else st.state
        out.append(st)
    counts: dict[str, int] = {}
    for s in out:
        counts[s.state] = counts.get(s.state, 0) + 1
    return out, counts


__all__ = ["TaskState", "queue_status"]
