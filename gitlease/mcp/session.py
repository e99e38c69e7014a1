"""What an MCP session can do with leases, without the MCP SDK: ``gitlease.mcp.server`` exposes each method as a
tool. Every method returns a JSON-able dict a model can act on, or raises GitLeaseError with the CLI's one-line
message (the server turns it into a tool error).

The leases a session acquires are kept renewed by a heartbeat thread each (gitlease/liveness/heartbeat.py, as
``hold()`` and ``git lease run`` do) while the session lives, and released when it ends (``on_exit="keep"``:
left to expire instead). Leases this worktree held before the session are shown, checked and can be extended,
pushed with or released, but the session does not renew them (their holder does).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gitlease.core.errors import GitLeaseError, NotHeld, UsageError
from gitlease.liveness.heartbeat import Heartbeat, service_attempt
from gitlease.liveness.hold import _timing

ON_EXIT = ("release", "keep")


@dataclass
class Held:
    """A lease this session acquired and renews."""

    lease_id: str
    service: Any  # the LeaseService of the worktree that holds it (a new worktree's, with worktree=True)
    heartbeat: Heartbeat = field(repr=False)
    thread: threading.Thread = field(repr=False)
    worktree: str | None = None

    def stop(self) -> None:
        self.heartbeat.stop()
        self.thread.join(self.heartbeat.timing.timeout + 1)


class Session:
    def __init__(self, repo: str = ".", *, remote: str | None = None, on_exit: str = "release", open_service=None):
        if on_exit not in ON_EXIT:
            raise UsageError(f"on exit: one of {', '.join(ON_EXIT)}, not {on_exit!r}")
        if open_service is None:
            from gitlease.service.factory import open_service
        self._open = open_service
        self.repo, self.remote, self.on_exit = repo, remote, on_exit
        self.svc = open_service(repo, remote=remote)
        self.held: dict[str, Held] = {}
        self.lock = threading.Lock()

    # ------------------------------------------------------------------------- reading
    def _mode(self, svc) -> str:
        from gitlease.core.modes import effective_mode

        return effective_mode(svc.settings.enforce, bool(svc.held_here()))

    def status(self) -> dict[str, Any]:
        snap = self.svc.status()
        now, skew = self.svc.clock.now(), self.svc.settings.skew
        here = self.svc.held_here()
        return {
            "store": self.svc.store.name,
            "stale": snap.stale,
            "error": snap.error,
            "leases": [
                dict(v.to_json(now, skew), heldHere=v.lease_id in here, renewedBySession=v.lease_id in self.held)
                for v in snap.leases
            ],
        }

    def can_start(self, paths: Sequence[str]) -> dict[str, Any]:
        from gitlease.service.views import describe_blocker

        scope, blockers, _ = self.svc.can_start(list(paths))
        now, skew = self.svc.clock.now(), self.svc.settings.skew
        return {
            "paths": list(scope),
            "free": not blockers,
            "blockers": [dict(b.to_json(now, skew), summary=describe_blocker(b, now)) for b in blockers],
        }

    def plan(self, tasks: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import json

        from gitlease.plan.planner import parse_tasks, plan_queue
        from gitlease.plan.suggest import read_tree

        lines = [json.dumps(t) for t in tasks]
        queue = parse_tasks(lines, tree=read_tree(self.svc.repo.cwd), source="tasks")
        the_plan, snap = plan_queue(self.svc, queue)
        return dict(the_plan.to_json(), store=self.svc.store.name, leases=len(snap.leases))

    def check_paths(self, paths: Sequence[str]) -> dict[str, Any]:
        """Per path: ``yours`` (a current lease of this worktree covers it), ``free`` or ``held`` (by whom), and
        whether this worktree may write it now (lease.enforce)."""
        from gitlease.core import scope as scopes

        rels = scopes.normalize_all(paths) if paths else ()
        snap = self.svc.snapshot()
        now, skew = self.svc.clock.now(), self.svc.settings.skew
        here = self.svc.held_here()
        mode = self._mode(self.svc)
        out = []
        for p in sorted(set(rels)):
            views = [v for v in snap.overlapping([p]) if v.state(now, skew) != "expired"]
            mine = [v for v in views if v.lease_id in here and v.state(now, skew) == "active"]
            others = [v for v in views if v.lease_id not in here]
            row: dict[str, Any] = {"path": p}
            if mine and scopes.covers(mine[0].paths, p):
                row.update(status="yours", leaseId=mine[0].lease_id, writable=True)
            elif others:
                b = others[0]
                rec = b.record
                row.update(
                    status="held",
                    leaseId=b.lease_id,
                    holder={
                        "task": rec.owner.task_id if rec else None,
                        "agent": rec.owner.agent_id if rec else None,
                        "secondsLeft": int(rec.expires - now) if rec else None,
                        "paths": list(b.paths),
                        "valid": b.valid,
                    },
                    writable=mode in ("warn", "off"),
                    hint="leave it alone; lease_can_start tells when it is free",
                )
            else:
                ok = mode in ("others", "warn", "off")
                row.update(status="free", writable=ok)
                if not ok:
                    ids = [lid for lid in here]
                    row["hint"] = (
                        f"lease_extend {ids[0]} with this path first" if len(ids) == 1 else "lease_acquire it first"
                    )
            out.append(row)
        return {"mode": mode, "stale": snap.stale, "paths": out}

    def held_here(self) -> dict[str, Any]:
        """The resource: the leases this worktree holds, their scope and time left (and which of them this
        session renews)."""
        from gitlease.core import record as records

        now = self.svc.clock.now()
        leases = []
        for lid, h in sorted(self.svc.held_here().items()):
            try:
                rec = records.parse(h.record.encode("utf-8"))
                left = int(rec.expires - now)
            except GitLeaseError:
                left = None
            beat = self.held.get(lid)
            leases.append(
                {
                    "leaseId": lid,
                    "paths": list(h.paths),
                    "version": h.version,
                    "expiresAt": h.expires_at,
                    "secondsLeft": left,
                    "renewedBySession": beat is not None,
                    "lost": beat.heartbeat.reason if beat is not None and beat.heartbeat.lost.is_set() else None,
                }
            )
        for lid, beat in sorted(self.held.items()):  # those held in a worktree of their own
            if beat.worktree and lid not in self.svc.held_here():
                leases.append({"leaseId": lid, "worktree": beat.worktree, "renewedBySession": True})
        return {"worktree": self.svc.repo.cwd, "mode": self._mode(self.svc), "leases": leases}

    # ------------------------------------------------------------------------- writing
    def acquire(
        self, paths: Sequence[str], *, task: str | None = None, ttl: int | None = None, worktree: bool = False
    ) -> dict[str, Any]:
        svc = self._open(self.repo, remote=self.remote, **({"task": task} if task else {}))
        the_ttl = int(ttl or svc.settings.ttl)
        timing = _timing(svc.settings, the_ttl, None, None, None)
        args: dict[str, Any] = dict(
            ttl=the_ttl,
            holder_pid=os.getpid(),
            renew_every=max(1, int(timing.renew_every)),
            stop_after=timing.stop_after,
        )
        where = None
        manager = None
        if worktree:
            from gitlease.worktree.manager import WorktreeManager

            manager = WorktreeManager(svc)
        from gitlease.liveness.wait import obtain

        got, att = obtain(svc, list(paths), worktree=manager, **args)
        holder_svc = svc
        if att is not None:
            where = att.path
            holder_svc = self._open(where, remote=self.remote, **({"task": task} if task else {}))
        from gitlease.service.leases import LeaseService

        beat_svc = LeaseService(holder_svc.repo, holder_svc.settings, clock=holder_svc.clock, signer=holder_svc.signer)
        hb = Heartbeat(
            service_attempt(beat_svc, got.lease_id, stop_after=timing.stop_after),
            timing,
            got.record.expires,
            clock=svc.clock,
            stop_by=got.record.stop_deadline,
        )
        thread = threading.Thread(target=hb.run, name=f"gitlease-mcp-{got.lease_id}", daemon=True)
        thread.start()
        with self.lock:
            self.held[got.lease_id] = Held(got.lease_id, holder_svc, hb, thread, where)
        rec = got.record
        return {
            "leaseId": got.lease_id,
            "paths": list(rec.paths),
            "ttl": rec.ttl,
            "expiresAt": rec.expires_at,
            "worktree": where,
            "renewedBySession": True,
            "cleared": list(got.cleared),
        }

    def _service_of(self, lease_id: str):
        beat = self.held.get(lease_id)
        if beat is not None:
            return beat.service
        if lease_id in self.svc.held_here():
            return self.svc
        raise NotHeld(f"lease {lease_id} is not held by this worktree or this session")

    def extend(self, lease_id: str, paths: Sequence[str]) -> dict[str, Any]:
        return self._service_of(lease_id).extend(lease_id, list(paths)).to_json()

    def progress(self, note: str, lease_id: str | None = None) -> dict[str, Any]:
        with self.lock:
            beats = [b for lid, b in self.held.items() if lease_id in (None, lid)]
        if not beats:
            raise NotHeld(
                "this session renews no lease"
                + (f" {lease_id}" if lease_id else "")
                + ": acquire one with lease_acquire"
            )
        for b in beats:
            b.heartbeat.report(note)
        return {"leases": [b.lease_id for b in beats], "note": note, "recorded": "with the next renewal"}

    def push(self, branch: str, lease_id: str | None = None) -> dict[str, Any]:
        if lease_id is None:
            with self.lock:
                mine = list(self.held)
            here = [lid for lid in self.svc.held_here() if lid not in mine]
            candidates = mine or here
            if len(candidates) != 1:
                raise UsageError(
                    "name the lease to push under (lease)" if candidates else "no lease is held here: acquire one"
                )
            lease_id = candidates[0]
        return fenced_push(self._service_of(lease_id), lease_id, branch)

    def release(self, lease_id: str) -> dict[str, Any]:
        with self.lock:
            beat = self.held.pop(lease_id, None)
        if beat is not None:
            beat.stop()
        svc = beat.service if beat is not None else self._service_of(lease_id)
        svc.release(lease_id)
        return {"leaseId": lease_id, "released": True}

    def close(self) -> list[str]:
        """End of the session: stop every heartbeat; release what the session acquired (unless on_exit is
        keep). Returns problems (one line each), never raises."""
        with self.lock:
            beats = list(self.held.values())
            self.held.clear()
        problems = []
        for b in beats:
            b.stop()
            if self.on_exit == "release" and not b.heartbeat.lost.is_set():
                try:
                    b.service.release(b.lease_id)
                except GitLeaseError as exc:
                    problems.append(f"release of {b.lease_id}: {exc.message}")
        return problems


def fenced_push(svc, lease_id: str, branch: str | None) -> dict[str, Any]:
    """Push ``branch`` (or SRC:DST; default: the current branch) with a renewal of ``lease_id`` in one atomic
    push, every commit it lands checked first, as ``git lease push`` does (gitlease.enforce.push)."""
    from gitlease.enforce.push import fenced_push as push
    from gitlease.enforce.push import push_defaults

    remote, specs = push_defaults(svc.repo.cwd, None, [branch] if branch else None)
    return push(svc, remote, specs, lease_id).to_json()


__all__ = ["Session", "fenced_push", "ON_EXIT"]
