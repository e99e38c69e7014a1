"""Renew many leases in one push (issue 11): each lease's id ref pinned on its own, in a non-atomic push, so a
lost lease fails only itself (``--porcelain`` reports each ref).

One push per lease store *and* repository object store: a push can only send objects its repository has,
so the leases of linked worktrees of one repository (one object store) share a push; separate clones push
separately. On the local store every lease is its own ``update-ref`` transaction (no network to save).

Each renewal is ``LeaseService.prepare_renewal`` (the renewal the holder would write: the same checks, signed
by the owner's key or not made) with the lease's renew lock taken without waiting: a lease whose holder is
renewing or releasing it right now is skipped this time (``Busy``), so the agent and a holder that fell back
to renewing itself never race each other into a false loss. ``LeaseService.settle_renewal`` then applies the
store's verdict for that lease.

``prepare`` / ``finish``: the same renewals made ready to ride in another push (the agent piggybacks them on an
acquire or a release, gitlease/liveness/agent.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gitlease.core.errors import GitLeaseError, RemoteUnavailable
from gitlease.core.store import Outcome, RefUpdate
from gitlease.service.leases import Busy, LeaseService, PreparedRenewal


@dataclass
class _Item:
    svc: LeaseService
    lease_id: str
    progress: str | None = None
    stop_after: int | None = None
    prep: PreparedRenewal | None = None

    @property
    def update(self) -> RefUpdate:
        assert self.prep is not None
        return self.prep.update

    @property
    def record(self):
        assert self.prep is not None
        return self.prep.record


def group_key(svc) -> tuple[str, str]:
    """Leases with one key can share a push: one lease store, one object store."""
    return (svc.store.name, svc.repo.objects_dir)


def renew_many(items: Sequence[tuple], *, ttl: int | None = None) -> dict[str, object]:
    """``[(service, lease id[, progress note[, stop after]]), ...]`` -> ``{lease id: Renewed | GitLeaseError}``;
    never raises for one lease. ``stop after``: the holder's stop horizon (``Timing.stop_after``; None: as the
    version renewed had it)."""
    results, groups = _prepare_all(items, ttl)
    for group in groups.values():
        pusher = group[0].svc
        try:
            if not pusher.store.capabilities.network:  # one transaction a renewal: nothing to save
                outcomes = {it.lease_id: pusher.store.apply([it.update]) for it in group}
            else:
                out = pusher.store.apply([it.update for it in group], atomic=False)
                outcomes = _per_lease(pusher, group, out)
            for it in group:
                verdict = outcomes[it.lease_id]
                if isinstance(verdict, GitLeaseError):
                    results[it.lease_id] = verdict
                else:
                    results[it.lease_id] = it.svc.settle_renewal(it.prep, verdict.ok)
        finally:
            for it in group:
                it.prep.close()
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
    out: dict[str, object] = {}
    for it in items:
        assert it.prep is not None  # only prepared items reach a push
        if landed is False:
            it.prep.close()
            continue
        got = it.svc.settle_renewal(it.prep, landed)
        if got is not None:
            out[it.lease_id] = got
    return out


def _prepare_all(items: Sequence[tuple], ttl: int | None):
    results: dict[str, object] = {}
    groups: dict[tuple[str, str], list[_Item]] = {}
    for entry in items:
        svc, lease_id = entry[0], entry[1]
        item = _Item(svc, lease_id, entry[2] if len(entry) > 2 else None, entry[3] if len(entry) > 3 else None)
        try:
            item.prep = svc.prepare_renewal(
                lease_id, ttl=ttl, progress=item.progress, lock=True, stop_after=item.stop_after
            )
        except GitLeaseError as exc:
            results[lease_id] = exc
            continue
        groups.setdefault(group_key(svc), []).append(item)
    return results, groups


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
                assert it.prep is not None
                it.svc.settle_renewal(it.prep, None)
                verdicts[it.lease_id] = RemoteUnavailable(
                    f"outcome of the renewal of {it.lease_id} unknown ({out.message or 'no answer'}) and the "
                    f"store cannot be re-read ({exc})"
                )
            return verdicts
        for it in unclear:
            landed = refs.get(it.update.ref) == it.update.new
            verdicts[it.lease_id] = Outcome(ok=landed, statuses={it.update.ref: "ok" if landed else "rejected"})
    return verdicts


__all__ = ["Busy", "renew_many", "prepare", "finish", "group_key"]
