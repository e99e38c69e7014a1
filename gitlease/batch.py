"""Renew many leases in one push (issue 11): each lease's id ref pinned on its own, in a non-atomic push, so a
lost lease fails only itself (``--porcelain`` reports each ref).

One push per lease store *and* repository object store: a push can only send objects its repository has,
so the leases of linked worktrees of one repository (one object store) share a push; separate clones push
separately. On the local store every lease is its own ``update-ref`` transaction (no network to save).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import record as records
from .errors import GitLeaseError, LeaseLost, RemoteUnavailable
from .store import Outcome, RefUpdate


@dataclass
class _Item:
    svc: object  # LeaseService
    lease_id: str
    update: RefUpdate | None = None
    record: records.Record | None = None


def renew_many(items: Sequence[tuple[object, str]], *, ttl: int | None = None) -> dict[str, object]:
    """``[(service, lease id), ...]`` -> ``{lease id: Renewed | GitLeaseError}``; never raises for one lease."""
    from .service import Renewed, id_ref

    results: dict[str, object] = {}
    groups: dict[tuple[str, str], list[_Item]] = {}
    for svc, lease_id in items:
        item = _Item(svc, lease_id)
        try:
            _prepare(item, ttl, id_ref)
        except GitLeaseError as exc:
            results[lease_id] = exc
            continue
        groups.setdefault((svc.store.name, svc.repo.objects_dir), []).append(item)
    for (_, _), group in groups.items():
        pusher = group[0].svc
        updates = [it.update for it in group]
        if pusher.store.kind == "local":
            outcomes = {it.lease_id: pusher.store.apply([it.update]) for it in group}
        else:
            out = pusher.store.apply(updates, atomic=False)
            outcomes = _per_lease(pusher, group, out)
        for it in group:
            out = outcomes[it.lease_id]
            if isinstance(out, GitLeaseError):
                results[it.lease_id] = out
            elif out.ok:
                it.svc._update_held(it.lease_id, it.record, it.update.new)
                results[it.lease_id] = Renewed(it.lease_id, it.record, it.update.new)
            else:
                it.svc._forget(it.lease_id)
                results[it.lease_id] = LeaseLost(
                    f"lease lost or replaced: {it.lease_id} is no longer at the version this worktree wrote "
                    "(stop writing)")
    return results


def _prepare(item: _Item, ttl: int | None, id_ref) -> None:
    svc = item.svc
    h = svc._held(item.lease_id)
    if h.pending:
        h = svc._settle_pending(h)
    current = records.parse(h.record.encode("utf-8"))
    now = svc.clock.now()
    if now >= current.expires:
        svc._forget(item.lease_id)
        raise LeaseLost(f"lease {item.lease_id} expired at {current.expires_at}; renewal after expiry is "
                        "refused (stop writing and acquire again)")
    nxt = current.next_version(now, ttl=ttl)
    records.validate(nxt)
    oid = svc._write_version(nxt, h.current, "renew")
    item.update = RefUpdate(id_ref(item.lease_id), oid, h.current)
    item.record = nxt


def _per_lease(pusher, group: list[_Item], out: Outcome) -> dict[str, object]:
    """Each lease's verdict from the per-ref statuses; refs without one are settled by re-reading."""
    verdicts: dict[str, object] = {}
    unclear = []
    for it in group:
        status = out.statuses.get(it.update.ref)
        if status is None:
            unclear.append(it)
        else:
            verdicts[it.lease_id] = Outcome(ok=status == "ok", statuses={it.update.ref: status})
    if unclear:
        try:
            refs = pusher.store.list_refs()
        except RemoteUnavailable as exc:
            for it in unclear:
                _mark_pending(it)
                verdicts[it.lease_id] = RemoteUnavailable(
                    f"outcome of the renewal of {it.lease_id} unknown ({out.message or 'no answer'}) and the "
                    f"store cannot be re-read ({exc})")
            return verdicts
        for it in unclear:
            landed = refs.get(it.update.ref) == it.update.new
            verdicts[it.lease_id] = Outcome(ok=landed, statuses={it.update.ref: "ok" if landed else "rejected"})
    return verdicts


def _mark_pending(it: _Item) -> None:
    with it.svc.held.locked() as held:
        if it.lease_id in held:
            held[it.lease_id].pending = it.update.new
            held[it.lease_id].pending_record = it.record.canonical().decode("utf-8")
