"""A lease that grows with the task: ``extend`` adds paths to a held lease, ``narrow`` gives paths back.

Each is ONE atomic transaction on the store (docs/protocol.md, "Extend and narrow"):

* extend: the id ref moves from the version this worktree wrote to the next one (pinned), whose record names
  the larger scope, and a scope ref for each new path is created "must not exist", pointing at the lease's
  grant (version 1) like every other scope ref of the lease. All or nothing: when one new path overlaps another
  lease, git's directory/file rule refuses its scope ref and nothing lands (exit 3, naming the holder).
* narrow: the id ref moves to the next version, whose record names the smaller scope, and the scope refs of the
  paths given back are deleted, each pinned to the grant.

Both are owner-bound like renew (the signing key of version 1, the version this worktree wrote), refused after
expiry by the local clock, serialised with the renewals of the same lease (its renew lock), and recorded in the
lease's history (a version whose scope differs from its parent's). Both renew the lease too (a new expiry).

Scope refs keep pointing at the grant and never move, so what readers group by (the grant) is unchanged; what
changes is that the set of scope refs follows the *current* version's scope instead of the grant's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gitlease.core import record as records
from gitlease.core import scope as scopes
from gitlease.core.errors import GitLeaseError, LeaseLost, RemoteUnavailable, UsageError
from gitlease.core.record import Record
from gitlease.core.refnames import id_ref, scope_ref
from gitlease.core.store import Outcome, RefUpdate

ATTEMPTS = 4


@dataclass(frozen=True)
class Resized:
    lease_id: str
    record: Record  # the lease's current version after the change
    oid: str
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)

    def to_json(self) -> dict[str, object]:
        return {
            "leaseId": self.lease_id,
            "paths": list(self.record.paths),
            "added": list(self.added),
            "removed": list(self.removed),
            "version": self.record.version,
            "expiresAt": self.record.expires_at,
        }


def extend(svc, lease_id: str, raw_paths: Sequence[str], *, ttl: int | None = None) -> Resized:
    """Add ``raw_paths`` to the lease ``lease_id`` this worktree holds (see the module's docstring). Paths the
    lease covers already add nothing (no push when nothing is new). Raises HeldError (exit 3) naming the holder
    when a new path overlaps another lease that is not expired beyond the skew margin (expired blockers are
    cleared, audited, as acquire does), UsageError when a new path contains one of the lease's own paths (git
    cannot replace a scope ref by its parent's in one push), LeaseLost when the lease is no longer at the
    version this worktree wrote."""
    wanted = scopes.normalize_all(raw_paths)
    with svc._renewing(lease_id):
        for _attempt in range(ATTEMPTS):
            h, current = _current(svc, lease_id, "extend")
            added = tuple(p for p in wanted if not scopes.covers(current.paths, p))
            if not added:
                return Resized(lease_id, current, h.current)
            parents = [(p, mine) for p in added for mine in current.paths if scopes.contains(p, mine)]
            if parents:
                p, mine = parents[0]
                raise UsageError(
                    f"cannot extend {lease_id} with {p}: it contains {mine}, which the lease holds already, and git "
                    f"cannot replace a scope ref by its parent's in one atomic push; acquire a new lease on {p} "
                    f"(after releasing this one), or extend with paths inside {p} beside {mine}"
                )
            nxt = _next(svc, current, scopes.minimize(current.paths + added), ttl)
            too_big = svc.release_size_problem(nxt)
            if too_big:
                raise UsageError(
                    f"cannot extend {lease_id} with {len(added)} more paths: {too_big}; lease coarser scopes"
                )
            oid = svc._write_version(nxt, h.current, "extend")
            updates = [RefUpdate(id_ref(lease_id), oid, h.current)] + [
                RefUpdate(scope_ref(p), h.grant, None) for p in added
            ]
            out = _apply(svc, lease_id, updates, nxt, oid)
            if out.ok:
                svc._update_held(lease_id, nxt, oid)
                return Resized(lease_id, nxt, oid, added=added)
            _lost_unless_current(svc, lease_id, h.current, nxt, oid)
            # the id ref is still ours: a new path's scope ref was refused (another lease holds it, or a
            # directory/file conflict with one): name the holder, or clear an expired one and try again
            snap = svc.snapshot(use_cache=False)
            now = svc.clock.now()
            blockers = [b for b in snap.overlapping(added) if b.lease_id != lease_id]
            live = [b for b in blockers if b.state(now, svc.settings.skew) != "expired"]
            if live:
                from gitlease.service.views import held_error

                raise held_error(added, live, now, svc.settings.skew)
            cleared = [b for b in blockers if svc._clear(b)]
            if not cleared and not blockers:
                raise GitLeaseError(
                    f"could not extend {lease_id} with {' '.join(added)}: "
                    f"{out.message or 'the store refused the update'}"
                )
        raise GitLeaseError(f"could not extend {lease_id} with {' '.join(added)}: the store kept refusing the update")


def narrow(svc, lease_id: str, raw_paths: Sequence[str], *, ttl: int | None = None) -> Resized:
    """Give back ``raw_paths`` from the lease ``lease_id`` this worktree holds: every path of the lease that
    lies inside one of them (see the module's docstring). A given path that covers none of the lease's paths, or
    lies strictly inside one of them (only whole scopes can be given back), is a UsageError; so is giving back
    every path (release the lease instead). LeaseLost when the lease is no longer at the version written here."""
    given = scopes.normalize_all(raw_paths)
    with svc._renewing(lease_id):
        h, current = _current(svc, lease_id, "narrow")
        removed: list[str] = []
        for g in given:
            inside = [p for p in current.paths if scopes.contains(g, p)]
            if not inside:
                outer = next((p for p in current.paths if scopes.contains(p, g)), None)
                if outer is not None:
                    raise UsageError(
                        f"cannot narrow {lease_id} by {g}: it lies inside {outer}, and only whole scopes of the "
                        f"lease can be given back ({' '.join(current.paths)})"
                    )
                raise UsageError(f"{lease_id} does not hold {g} (it holds {' '.join(current.paths)})")
            removed += [p for p in inside if p not in removed]
        keep = tuple(p for p in current.paths if p not in removed)
        if not keep:
            raise UsageError(
                f"narrowing {lease_id} by {' '.join(given)} would leave it no path: release it instead "
                f"(git lease release {lease_id})"
            )
        nxt = _next(svc, current, keep, ttl)
        oid = svc._write_version(nxt, h.current, "narrow")
        updates = [RefUpdate(id_ref(lease_id), oid, h.current)] + [
            RefUpdate(scope_ref(p), None, h.grant) for p in removed
        ]
        out = _apply(svc, lease_id, updates, nxt, oid)
        if out.ok:
            svc._update_held(lease_id, nxt, oid)
            return Resized(lease_id, nxt, oid, removed=tuple(removed))
        _lost_unless_current(svc, lease_id, h.current, nxt, oid)
        raise GitLeaseError(
            f"could not narrow {lease_id}: {out.message or 'the store refused the update'}; the lease is unchanged"
        )


# ------------------------------------------------------------------------------ helpers


def _current(svc, lease_id: str, action: str):
    return svc.renewable(lease_id, action)  # the checks every renewal makes (owner key, expiry, stop deadline)


def _next(svc, current: Record, paths: tuple[str, ...], ttl: int | None) -> Record:
    nxt = replace(current.next_version(svc.clock.now(), ttl=ttl), paths=paths)
    records.validate(nxt)
    return nxt


def _apply(svc, lease_id: str, updates: list[RefUpdate], nxt: Record, oid: str) -> Outcome:
    out = svc.store.apply(updates)
    if out.ambiguous:
        try:
            out = svc._resolve(updates, out)
        except RemoteUnavailable:  # settled by reading first, next time (as a renewal is)
            with svc.held.locked() as held:
                if lease_id in held:
                    held[lease_id].pending = oid
                    held[lease_id].pending_record = nxt.canonical().decode("utf-8")
            raise
    return out


def _lost_unless_current(svc, lease_id: str, expected: str, nxt: Record, oid: str) -> None:
    """After a refused (or unclear, re-read) transaction: LeaseLost when the id ref moved elsewhere. When it is
    at the new version but not every scope ref changed (a server that died while applying the transaction:
    docs/limits.md), the new version is this worktree's now: remembered, and reported."""
    now_at = svc.store.list_refs().get(id_ref(lease_id))
    if now_at == oid:
        svc._update_held(lease_id, nxt, oid)
        raise GitLeaseError(
            f"the change to {lease_id} landed only in part (the store applied some of its refs): see "
            f"git lease show {lease_id}; the lease is at version {nxt.version} with scope {' '.join(nxt.paths)}"
        )
    if now_at != expected:
        svc.forget(lease_id)
        raise LeaseLost(
            f"lease lost or replaced: {lease_id} is no longer at the version this worktree wrote (stop writing)"
        )


__all__ = ["Resized", "extend", "narrow"]
