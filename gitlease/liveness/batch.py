"""Renew many leases in one push (issue 11): each lease's id ref pinned on its own, in a non-atomic push, so a
lost lease fails only itself (``--porcelain`` reports each ref).

One push per lease store *and* repository object store: a push can only send objects its repository has,
so the leases of linked worktrees of one repository (one object store) share a push; separate clones push
separately. On the local store every lease is its own ``update-ref`` transaction (no network to save).

Each lease is renewed under its per-lease renew lock (the one ``LeaseService.renew`` and ``release`` take), taken
without waiting: a lease whose holder is renewing or releasing it right now is skipped this time (``Busy``), so
the agent and a holder that fell back to renewing itself never race each other into a false loss.

``prepare`` / ``finish``: the same renewals made ready to ride in another push (the agent piggybacks them on an
acquire or a release, gitlease/liveness/agent.py).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from gitlease.core import record as records
from gitlease.core.errors import GitLeaseError, LeaseLost, RemoteUnavailable
from gitlease.core.store import Outcome, RefUpdate


@dataclass
class _Item:
    svc: object  # LeaseService
    lease_id: str
    progress: str | None = None
    update: RefUpdate | None = None
    record: records.Record | None = None
    lock: IO | None = None


class Busy(GitLeaseError):
    """The lease is being renewed or released by its holder right now: not renewed in this batch."""

    kind = "busy"


def group_key(svc) -> tuple[str, str]:
    """Leases with one key can share a push: one lease store, one object store."""
    return (svc.store.name, svc.repo.objects_dir)


def renew_many(items: Sequence[tuple], *, ttl: int | None = None) -> dict[str, object]:
    """``[(service, lease id[, progress note]), ...]`` -> ``{lease id: Renewed | GitLeaseError}``; never raises
    for one lease."""
    results, groups = _prepare_all(items, ttl)
    for (_, _), group in groups.items():
        pusher = group[0].svc
        updates = [it.update for it in group]
        try:
            if pusher.store.kind == "local":
                outcomes = {it.lease_id: pusher.store.apply([it.update]) for it in group}
            else:
                out = pusher.store.apply(updates, atomic=False)
                outcomes = _per_lease(pusher, group, out)
            for it in group:
                results[it.lease_id] = _settle(it, outcomes[it.lease_id])
        finally:
            for it in group:
                _unlock(it)
    return results


def prepare(items: Sequence[tuple], *, ttl: int | None = None) -> tuple[list[_Item], dict[str, object]]:
    """Renewals made ready (version objects written, each lease's renew lock held) to ride in another push of
    the same group (``group_key``); ``finish`` must follow. Returns (ready items, {lease id: error})."""
    results, groups = _prepare_all(items, ttl)
    return [it for group in groups.values() for it in group], results


def finish(items: Sequence[_Item], landed: bool | None) -> dict[str, object]:
    """After the push that carried ``prepare``'s renewals: True, they landed; False, that atomic push was refused
    (nothing of them landed: the leases are as before); None, unknown (each is marked pending and settled by
    re-reading before its next renewal). Releases the locks."""
    from gitlease.service.leases import Renewed

    out: dict[str, object] = {}
    for it in items:
        try:
            if landed:
                it.svc._update_held(it.lease_id, it.record, it.update.new)
                out[it.lease_id] = Renewed(it.lease_id, it.record, it.update.new)
            elif landed is None:
                _mark_pending(it)
        finally:
            _unlock(it)
    return out


def _prepare_all(items: Sequence[tuple], ttl: int | None):
    from gitlease.core.refnames import id_ref

    results: dict[str, object] = {}
    groups: dict[tuple[str, str], list[_Item]] = {}
    for entry in items:
        svc, lease_id = entry[0], entry[1]
        item = _Item(svc, lease_id, entry[2] if len(entry) > 2 else None)
        try:
            _prepare(item, ttl, id_ref)
        except GitLeaseError as exc:
            _unlock(item)
            results[lease_id] = exc
            continue
        groups.setdefault(group_key(svc), []).append(item)
    return results, groups


def _settle(it: _Item, out) -> object:
    from gitlease.service.leases import Renewed

    if isinstance(out, GitLeaseError):
        return out
    if out.ok:
        it.svc._update_held(it.lease_id, it.record, it.update.new)
        return Renewed(it.lease_id, it.record, it.update.new)
    it.svc._forget(it.lease_id)
    return LeaseLost(
        f"lease lost or replaced: {it.lease_id} is no longer at the version this worktree wrote (stop writing)"
    )


def _lock(item: _Item) -> None:
    folder = item.svc.held.folder
    os.makedirs(folder, exist_ok=True)
    fh = open(os.path.join(folder, f"renew-{item.lease_id}.lock"), "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise Busy(f"lease {item.lease_id} is being renewed or released by its holder; skipped this time") from None
    item.lock = fh


def _unlock(item: _Item) -> None:
    if item.lock is not None:
        item.lock.close()  # closing the file drops the flock
        item.lock = None


def _prepare(item: _Item, ttl: int | None, id_ref) -> None:
    from gitlease.core.progress import next_progress

    svc = item.svc
    svc._held(item.lease_id)  # NotHeld before taking any lock
    _lock(item)
    h = svc._held(item.lease_id)  # again, under the lock: what the holder may just have written
    if h.pending:
        h = svc._settle_pending(h)
    current = records.parse(h.record.encode("utf-8"))
    now = svc.clock.now()
    if now >= current.expires:
        svc._forget(item.lease_id)
        raise LeaseLost(
            f"lease {item.lease_id} expired at {current.expires_at}; renewal after expiry is "
            "refused (stop writing and acquire again)"
        )
    prog = next_progress(item.progress, current.progress, now) if item.progress is not None else None
    nxt = current.next_version(now, ttl=ttl, progress=prog)
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
                    f"store cannot be re-read ({exc})"
                )
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
