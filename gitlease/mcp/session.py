"""What an MCP session can do with leases, without the MCP SDK: ``gitlease.mcp.server`` exposes each method as a
tool. Every method returns a JSON-able dict a model can act on, or raises GitLeaseError with the CLI's one-line
message (the server turns it into a tool error).

The leases a session acquires are held as ``hold()`` and ``git lease run`` hold theirs (a Holding:
gitlease/liveness/holding.py: renewed through the per-host agent or by itself, progress and its timeout, loss)
while the session lives, and released when it ends (``on_exit="keep"``: left to expire instead). Leases this
worktree held before the session are shown, checked and can be extended, pushed with or released, but the
session does not renew them (their holder does).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from gitlease.core.errors import GitLeaseError, NotHeld, UsageError
from gitlease.liveness.holding import Holding, HoldOptions

ON_EXIT = ("release", "keep")


class Session:
    def __init__(self, repo: str = ".", *, remote: str | None = None, on_exit: str = "release", open_service=None):
        if on_exit not in ON_EXIT:
            raise UsageError(f"on exit: one of {', '.join(ON_EXIT)}, not {on_exit!r}")
        if open_service is None:
            from gitlease.service.factory import open_service
        self._open = open_service
        self.repo, self.remote, self.on_exit = repo, remote, on_exit
        self.svc = open_service(repo, remote=remote)
        self.held: dict[str, Holding] = {}  # the leases this session acquired and keeps
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
            holding = self.held.get(lid)
            leases.append(
                {
                    "leaseId": lid,
                    "paths": list(h.paths),
                    "version": h.version,
                    "expiresAt": h.expires_at,
                    "secondsLeft": left,
                    "renewedBySession": holding is not None,
                    "lost": holding.reason if holding is not None and holding.lost.is_set() else None,
                }
            )
        for lid, holding in sorted(self.held.items()):  # those held in a worktree of their own
            if holding.attached is not None and lid not in self.svc.held_here():
                leases.append({"leaseId": lid, "worktree": holding.attached.path, "renewedBySession": True})
        return {"worktree": self.svc.repo.cwd, "mode": self._mode(self.svc), "leases": leases}

    # ------------------------------------------------------------------------- writing
    def acquire(
        self, paths: Sequence[str], *, task: str | None = None, ttl: int | None = None, worktree: bool = False
    ) -> dict[str, Any]:
        flags = {"task": task} if task else {}
        svc = self._open(self.repo, remote=self.remote, **flags)
        manager = None
        if worktree:
            from gitlease.worktree.manager import WorktreeManager

            manager = WorktreeManager(svc)
        holding = Holding.acquire(
            svc,
            list(paths),
            HoldOptions(ttl=ttl, release=self.on_exit == "release"),
            worktree=manager,
            reopen=lambda path: self._open(path, remote=self.remote, **flags),
        ).start()
        with self.lock:
            self.held[holding.lease_id] = holding
        rec = holding.record
        where = holding.attached.path if holding.attached is not None else None
        return {
            "leaseId": holding.lease_id,
            "paths": list(rec.paths),
            "ttl": rec.ttl,
            "expiresAt": rec.expires_at,
            "worktree": where,
            "renewedBySession": True,
            "cleared": list(holding.cleared),
        }

    def _service_of(self, lease_id: str):
        holding = self.held.get(lease_id)
        if holding is not None:
            return holding.svc
        if lease_id in self.svc.held_here():
            return self.svc
        raise NotHeld(f"lease {lease_id} is not held by this worktree or this session")

    def extend(self, lease_id: str, paths: Sequence[str]) -> dict[str, Any]:
        holding = self.held.get(lease_id)
        if holding is not None:
            return holding.extend(list(paths)).to_json()
        return self._service_of(lease_id).extend(lease_id, list(paths)).to_json()

    def progress(self, note: str, lease_id: str | None = None) -> dict[str, Any]:
        with self.lock:
            held = [h for lid, h in self.held.items() if lease_id in (None, lid)]
        if not held:
            raise NotHeld(
                "this session renews no lease"
                + (f" {lease_id}" if lease_id else "")
                + ": acquire one with lease_acquire"
            )
        for h in held:
            h.check()  # a lost lease: the model must stop, not report progress on it
            h.progress(note)
        return {"leases": [h.lease_id for h in held], "note": note, "recorded": "with the next renewal"}

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
        holding = self.held.get(lease_id)
        if holding is not None:
            holding.check()
        return fenced_push(self._service_of(lease_id), lease_id, branch)

    def release(self, lease_id: str) -> dict[str, Any]:
        """Give ``lease_id`` back. Idempotent, as ``git lease release`` is: a lease released before (or
        reclaimed) answers ``already``."""
        with self.lock:
            holding = self.held.pop(lease_id, None)
        if holding is not None:
            closed = holding.close(release=True)
            if closed.release_error is not None:
                raise closed.release_error
            return {"leaseId": lease_id, "released": True, "already": not closed.released, "lost": closed.reason}
        got = self.svc.release(lease_id)
        return {"leaseId": lease_id, "released": True, "already": bool(got.already), "note": got.note}

    def close(self) -> list[str]:
        """End of the session: stop every heartbeat; release what the session acquired (unless on_exit is
        keep). Returns problems (one line each), never raises."""
        with self.lock:
            held = list(self.held.values())
            self.held.clear()
        problems = []
        for h in held:
            closed = h.close()
            if closed.release_error is not None:
                problems.append(f"release of {h.lease_id}: {closed.release_error.message}")
        return problems


def fenced_push(svc, lease_id: str, branch: str | None) -> dict[str, Any]:
    """Push ``branch`` (or SRC:DST; default: the current branch) with a renewal of ``lease_id`` in one atomic
    push, every commit it lands checked first, as ``git lease push`` does (gitlease.enforce.push)."""
    from gitlease.enforce.push import fenced_push as push
    from gitlease.enforce.push import push_defaults

    remote, specs = push_defaults(svc.repo.cwd, None, [branch] if branch else None)
    return push(svc, remote, specs, lease_id).to_json()


__all__ = ["Session", "fenced_push", "ON_EXIT"]
