"""The lease service as the reader of the store: ``snapshot`` (one listing, the records it names read, verified
and judged: fail closed), ``status``, ``can_start``, ``show``, and where a lease not held here is held.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from gitlease.core import record as records
from gitlease.core import scope as scopes
from gitlease.core.bearing import restrict_refs
from gitlease.core.errors import (
    GitLeaseError,
    RemoteUnavailable,
)
from gitlease.core.state import HeldState
from gitlease.core.store import (
    Blob,
)
from gitlease.service.base import ServiceBase, _RefsCache
from gitlease.service.results import Listing
from gitlease.service.viewcache import refs_left, views_of
from gitlease.service.views import (
    INVALID,
    HistoryEntry,
    KeptView,
    LeaseView,
    Parsed,
    Snapshot,
    build_views,
    foreign_refs,
    parse_blob,
)

if TYPE_CHECKING:
    from gitlease.identity.replay import Memory
    from gitlease.identity.trust import Trust
    from gitlease.service.recordcache import RecordCache
    from gitlease.service.viewcache import Row, ViewCache


class Reader(ServiceBase):
    """A role of ``LeaseService`` (gitlease/service/leases.py): see this module's docstring."""

    def gone_note(self, lease_id: str) -> str | None:
        """How a lease left the store, from the audit log ("released by A at T"), or None when it has no trace."""
        from gitlease.service.audit import read_log

        try:
            entries = [e for e in read_log(self.store) if e.lease_id == lease_id]
        except GitLeaseError:
            return None
        if not entries:
            return None
        d = entries[-1].doc
        what = {"release": "released", "force-release": "force-released", "clear": "cleared"}.get(
            str(d.get("action")), "reclaimed"
        )
        rule = f" (rule {d.get('rule')})" if d.get("rule") else ""
        return f"{what} by {d.get('by')} at {d.get('at')}{rule}"

    def _where_held(self, view: LeaseView) -> str:
        """Where a lease this worktree does not hold is held: another worktree of this repository (with the
        command to run there), or another agent, host and workspace."""
        rec = view.record
        if rec is None:
            return "its record is unreadable (an admin clears it: git lease release --force ID)"
        if rec.owner.host == os.uname().nodename:
            for path, state in _worktree_states(self.repo.common_dir):
                try:
                    held = state.load()
                except GitLeaseError:
                    continue
                if view.lease_id in held and held[view.lease_id].store == self.store.name:
                    return f"it is held by the worktree at {path}: git -C {path} lease release {view.lease_id}"
        return (
            f"it is held by agent {rec.owner.agent_id} (task {rec.owner.task_id}) on host {rec.owner.host}, "
            f"workspace {rec.workspace_id}; only its holder releases it (an admin: git lease release --force "
            f"{view.lease_id})"
        )

    def snapshot(
        self,
        *,
        use_cache: bool = True,
        paths: Sequence[str] | None = None,
        keep: Iterable[str] = (),
        listing: Listing | None = None,
        reuse: bool = True,
    ) -> Snapshot:
        """Every lease on the store, each verified (signatures, trust, owner binding, replay: trust.py).
        When the store cannot be read and ``use_cache``, the last listing fetched (its objects are local) is
        returned, marked stale with its age.

        ``paths``: only the leases that bear on these (normalised) paths, and those named in ``keep``: the same
        views of them, and the same answers from ``blocking``/``overlapping`` on ``paths``, as the full read
        (bearing.restrict_refs), without building the others (for the hooks and ``can-start``; the snapshot's
        ``restricted_to`` says so). Such a read answers from the store or fails: never from the last listing.

        ``listing``: the store as the caller just listed it (``listing()``), read instead of listing again.

        ``reuse``: a full read takes each lease whose refs have not moved from the view an earlier read
        finished (service/viewcache.py; replay still checked); False: every lease is read and checked again,
        each with its history (``show``)."""
        from gitlease.core.gcpause import paused

        with paused():  # thousands of small acyclic objects (core/gcpause.py)
            return self._snapshot(use_cache, paths, keep, listing, reuse)

    def _snapshot(
        self,
        use_cache: bool,
        paths: Sequence[str] | None,
        keep: Iterable[str],
        listing: Listing | None,
        reuse: bool,
    ) -> Snapshot:
        from gitlease.identity.replay import Seen
        from gitlease.service.recordcache import RecordCache

        cache = _RefsCache(self.repo.shared_dir(), self.store.name)
        seen = Seen(self.repo.shared_dir(), self.store.name)
        before = listing.before if listing is not None else seen.load()  # before listing: see Seen
        kept = RecordCache(self.repo.shared_dir())
        finished = _finished(self, paths is None and reuse)
        present: set[str] | None = None
        matched: dict[str, Row] = {}
        try:
            try:
                refs = listing.refs if listing is not None else self.store.list_refs(head=self._needs_trust_file())
                fetched_at = self.clock.now()
                head = self.store.listed_head()  # the trust file's commit, fetched with the lease objects
                used = refs
                if paths is not None:
                    used, present = self._restrict(kept, refs, paths, keep)
                elif finished is not None:
                    matched = finished.match(refs)
                    used = refs_left(refs, matched) if matched else refs
                blobs, parsed = self._read_records(kept, set(used.values()), set(refs.values()), also=head)
            except RemoteUnavailable as exc:
                if not use_cache or paths is not None:
                    raise
                return self._stale_snapshot(cache, kept, before, exc)
        finally:
            kept.close()
        if paths is None:  # a restricted read leaves most objects unfetched: not a listing to answer from later
            cache.save(refs, fetched_at)
        trust = self.trust()
        hits = views_of(matched, trust.identity) if matched else []
        views = build_views(used, blobs, parsed)
        if hits is None or (hits and any(v.lease_id in matched for v in views)):
            # a kept view finished under another trust file (or damaged), or another commit naming a kept lease:
            # every lease read and checked again
            return self.snapshot(use_cache=use_cache, listing=Listing(refs, head, before), reuse=False)
        self._verify(views, blobs, trust, before)
        news: list[LeaseView] = views  # the views that may tell the replay memory something new
        if finished is not None:
            finished.save(trust.identity, views)  # and closes it
            news = [*views, *_replay_checked(hits, before)]
            views = _merge(hits, views)
        listed = [
            (v.lease_id, v.version(), v.current_oid, v.expires())
            for v in news
            if v.valid and v.current_oid and not _seen_as(before, v)
        ]
        seen.update(
            before,
            listed,  # type: ignore[arg-type]
            present if present is not None else {v.lease_id for v in views},
            self.clock.now(),
        )
        return Snapshot(
            views,
            fetched_at,
            trust=trust.describe(),
            signed_store=trust.signed,
            foreign=foreign_refs(refs),
            restricted_to=tuple(paths) if paths is not None else None,
            listing=refs,
        )

    def _stale_snapshot(self, cache: _RefsCache, kept: RecordCache, before: Memory, exc: RemoteUnavailable) -> Snapshot:
        """The store unreadable: the last listing fetched, from objects already here, marked stale with why."""
        cached = cache.load()
        if cached is None:
            raise RemoteUnavailable(f"{exc}; and no earlier state is known") from None
        refs, fetched_at = cached
        blobs, parsed = self._read_records(kept, set(refs.values()), set(refs.values()), fetch=False)
        trust = self.trust(offline=True)
        views = build_views(refs, blobs, parsed)
        self._verify(views, blobs, trust, before)
        return Snapshot(
            views,
            fetched_at,
            stale=True,
            error=str(exc),
            trust=trust.describe(),
            signed_store=trust.signed,
            foreign=foreign_refs(refs),
            listing=refs,
        )

    def listing(self, given: tuple[str, tuple[int, bool] | None] | None = None) -> Listing:
        """The store's refs and its HEAD by one ``ls-remote``, for a caller that needs HEAD before it reads the
        store (the pre-push hook, when the push goes to the lease store) and then ``snapshot(listing=...)``.
        The replay memory is loaded first, as ``snapshot`` does: see Seen. ``given``: that listing as the
        caller already read it (``ls-remote --symref <store> HEAD refs/leases/*``), with the replay memory's
        file as opened before it listed (``Seen.load_opened``)."""
        from gitlease.identity.replay import Seen

        seen = Seen(self.repo.shared_dir(), self.store.name)
        if given is not None:
            before = seen.load_opened(given[1])
            refs = self.store.take_listing(given[0])
        else:
            before = seen.load()
            refs = self.store.list_refs(head=True)
        return Listing(refs, self.store.listed_head(), before)

    def _restrict(
        self, kept: RecordCache, refs: dict[str, str], paths: Sequence[str], keep: Iterable[str]
    ) -> tuple[dict[str, str], set[str]]:
        """bearing.restrict_refs, with each listed commit's lease and paths from the record cache (the commits
        it does not hold yet are fetched, read and kept first)."""
        listed = set(refs.values())
        index = kept.index()
        missing = listed - index.keys()
        if missing:
            self.store.ensure_objects(sorted(missing))
            new = {oid: (b, parse_blob(b)) for oid, b in self.store.read(missing, fetch=False).items()}
            kept.save(new, listed)
            for oid, (_b, (rec, _p)) in new.items():
                index[oid] = (rec.lease_id, "\n".join(rec.paths)) if rec is not None else None
        return restrict_refs(refs, index, paths, keep)

    def _read_records(
        self,
        kept: RecordCache,
        oids: set[str],
        listed: set[str],
        *,
        also: str | None = None,
        fetch: bool = True,
    ) -> tuple[dict[str, Blob], dict[str, Parsed]]:
        """The bytes and parsed record of each lease commit: from the repository's record cache
        (service/recordcache.py) where another read kept them, else from git (``also``: one more commit to
        fetch in the same go, read by no one here: the trust file's; ``listed``: every commit of the listing,
        what the cache keeps). Objects are still fetched when missing: the history checks read them."""
        got = kept.load(oids)
        if fetch:
            self.store.ensure_objects(sorted(oids | ({also} if also else set())))
        fresh = self.store.read(oids - set(got), fetch=False)
        new = {oid: (b, parse_blob(b)) for oid, b in fresh.items()}
        kept.save(new, listed)
        got.update(new)
        return {o: b for o, (b, _) in got.items()}, {o: p for o, (_, p) in got.items()}

    def _verify(self, views: list[LeaseView], blobs: dict[str, Blob], trust: Trust, before: Memory) -> None:
        """Check each lease's whole history (trust.Trust.check_chain) and this machine's replay memory; every
        problem makes the view invalid, so its scope stays blocked (fail closed)."""
        from gitlease.identity.trust import MEMO

        now = self.clock.now()
        heads: set[str] = {h for v in views if v.record is not None and (h := v.current_oid or v.grant_oid)}
        ident = trust.identity
        if ident is not None:  # what other processes verified under this trust (trust.VerifiedCache)
            MEMO.attach(os.path.join(self.repo.shared_dir(), "cache", "verified.sqlite3"))
            MEMO.prefetch(ident, [v.lease_id for v in views])
        try:
            self._verify_chains(views, blobs, trust, before, heads, now)
        finally:
            MEMO.flush()

    def _verify_chains(
        self,
        views: list[LeaseView],
        blobs: dict[str, Blob],
        trust: Trust,
        before: Memory,
        heads: set[str],
        now: float,
    ) -> None:
        from gitlease.identity.trust import MEMO

        ident = trust.identity
        # the history walk stops where this process already verified (trust.ChainMemo): a renewal adds one
        stop_at = MEMO.newest(ident, {v.lease_id for v in views}) if ident is not None else []
        walk = heads - set(stop_at)  # a head verified already needs no walk at all
        parents = self.store.parents(walk, exclude=stop_at)
        if stop_at and not walk <= set(parents):  # a head below a verified one (moved back), or an excluded
            parents = self.store.parents(walk)  # commit no longer local: the whole walk, as without the memo
        missing = set(parents) - set(blobs)
        if missing:
            blobs = dict(blobs)
            blobs.update(self.store.read(missing, fetch=False))
        known = (
            {  # records parsed already, for the versions a walk reads (none when every head was verified)
                at: v.record
                for v in views
                if v.record is not None and not v.problems and (at := v.current_oid or v.grant_oid)
            }
            if walk
            else {}
        )
        from gitlease.identity.replay import Seen

        for v in views:
            current = v.current_oid
            head = current or v.grant_oid
            if v.record is None or head is None:
                v.verification = INVALID
                continue
            chk = trust.check_chain(
                v.lease_id, head, v.grant_oid if current else None, parents, blobs, now, known, memo=MEMO
            )
            v.chain, v.verification, v.signer = chk, chk.status, chk.signer
            v.problems.extend(p for p in chk.problems if p not in v.problems)
            if current:
                replay = Seen.replay_problem(before, v.lease_id, v.record.version, current)
                if replay:
                    v.problems.append(replay)

    def status(self, *, use_cache: bool = True) -> Snapshot:
        self.require_store()
        return self.snapshot(use_cache=use_cache)

    def can_start(self, raw_scopes: Sequence[str]) -> tuple[tuple[str, ...], list[LeaseView], Snapshot]:
        paths = scopes.normalize_all(raw_scopes)
        self.require_store()
        snap = self.snapshot(use_cache=False, paths=paths)  # only the leases bearing on them
        return paths, snap.blocking(paths, self.clock.now(), self.settings.skew), snap

    def show(self, lease_id: str) -> tuple[LeaseView | None, list[HistoryEntry], Snapshot]:
        records.check_lease_id(lease_id)
        self.require_store()
        snap = self.snapshot(reuse=False)  # each version's check, for the history
        view = snap.find(lease_id)
        entries: list[HistoryEntry] = []
        if view and view.chain is not None and view.chain.versions:
            for h in view.chain.versions:
                entries.append(
                    HistoryEntry(
                        h.oid,
                        h.record,
                        h.check.problem,
                        h.signed,
                        h.check.status,
                        h.check.fingerprint,
                        h.check.principal,
                    )
                )
        elif view and (view.current_oid or view.grant_oid):
            head = view.current_oid or view.grant_oid
            assert head is not None
            chain = [oid for oid, _ in self.store.history(head)]
            blobs = self.store.read(chain, fetch=not snap.stale)
            for oid in chain:
                b = blobs.get(oid, Blob(None, None, "missing"))
                rec, problem = parse_blob(b)
                entries.append(HistoryEntry(oid, rec, problem, b.signature is not None))
        return view, entries, snap


def _finished(svc: Reader, wanted: bool) -> ViewCache | None:
    from gitlease.service.viewcache import ViewCache

    return ViewCache(svc.repo.shared_dir(), svc.store.name) if wanted else None


def _replay_checked(hits: list[KeptView], before: Memory) -> list[KeptView]:
    """Each kept view checked against the replay memory (identity/replay.py): a problem makes it invalid.
    Returns those the memory does not hold at their version and commit already (the rest tell it nothing)."""
    from gitlease.identity.replay import Seen

    news = []
    for v in hits:
        if _seen_as(before, v) and v.lease_id not in before.gone:
            continue  # seen as it is now (the common case: one lookup)
        replay = Seen.replay_problem(before, v.lease_id, v._version, v.current_oid)  # type: ignore[arg-type]
        if replay:
            v.problems.append(replay)
        news.append(v)
    return news


def _merge(hits: list[KeptView], views: list[LeaseView]) -> list[LeaseView]:
    """The kept views and those read in full, in ``build_views``'s order: by lease id, then the views of refs
    that name no lease."""
    if not hits:
        return views
    if not views:
        return list(hits)  # the cache gives them in lease id order (its key)
    named = [v for v in views if not v.lease_id.startswith("?")]
    odd = [v for v in views if v.lease_id.startswith("?")]
    return sorted([*hits, *named], key=lambda v: v.lease_id) + odd


def _seen_as(before: Memory, v: LeaseView) -> bool:
    """Whether the replay memory from before this read holds the lease at this version and commit (then the
    read has nothing new to tell it of the lease)."""
    last = before.live.get(v.lease_id)
    return type(last) is tuple and len(last) == 3 and last[0] == v.version() and last[1] == v.current_oid


def _unsigned_cache(path: str) -> bool:
    """Whether the cached trust of a store says it has no trust file (read without the trust module)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh).get("text") is None
    except (OSError, ValueError, AttributeError):
        return False


def _worktree_states(common_dir: str) -> Iterator[tuple[str, HeldState]]:
    """(work tree path, its held state) of every worktree of the repository at ``common_dir``."""
    main = os.path.dirname(common_dir.rstrip("/"))
    yield main, HeldState(os.path.join(common_dir, "gitlease"))
    admin = os.path.join(common_dir, "worktrees")
    try:
        names = sorted(os.listdir(admin))
    except OSError:
        return
    for name in names:
        try:
            with open(os.path.join(admin, name, "gitdir"), encoding="utf-8") as fh:
                path = os.path.dirname(fh.read().strip())
        except OSError:
            continue
        yield path, HeldState(os.path.join(admin, name, "gitlease"))
