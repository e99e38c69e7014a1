"""The lease service as the writer for one worktree, taking and giving back: ``acquire`` (one atomic push of a
lease's refs, a refused or unclear attempt undone, expired blockers cleared) and ``release`` (its refs deleted
and the release audited in one atomic push).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gitlease.core import record as records
from gitlease.core import scope as scopes
from gitlease.core.errors import (
    GitLeaseError,
    LeaseLost,
    NotHeld,
    RemoteUnavailable,
    UsageError,
)
from gitlease.core.procs import process_start
from gitlease.core.record import Owner, Record
from gitlease.core.refnames import id_ref, is_scope_ref, path_of_scope_ref, scope_ref, task_ref
from gitlease.core.state import Held
from gitlease.core.store import (
    Outcome,
    RefUpdate,
)
from gitlease.service.base import ServiceBase
from gitlease.service.legacy import refuse_legacy_overlap
from gitlease.service.results import Acquired, PreparedRelease, Released
from gitlease.service.verdict import doctor_gate
from gitlease.service.views import (
    HALF_DELETED,
    LeaseView,
    Snapshot,
    held_error,
)

if TYPE_CHECKING:
    pass


ACQUIRE_ATTEMPTS = 4
# how long (clock seconds) an acquire goes on after pushes that only lost races (refused for another writer's
# lock, a ref that moved or a directory/file clash, and nobody live holding the scope after it): racers who all
# lost to each other's locks try again after a jittered pause, until one wins or this has passed
LOST_RACE_PATIENCE = 15.0
LOST_RACE_PAUSE_CAP = 1.0  # the longest pause (seconds) between two lost races
# what git says of a ref that lost a race rather than a rule: another push's lock, a moved or created ref, a
# directory/file clash with a ref that another writer held or holds
RACE_REASONS = (
    "stale info",
    "fetch first",
    "non-fast-forward",
    "failed to update ref",
    "failed to lock",
    "cannot lock ref",
    "incorrect old value",
    "atomic push failed",
    "atomic transaction failed",
    "already exists",
    "exists; cannot create",
    "cannot process",
    "Not a directory",  # a stale reflog in the way: healed (_heal_stale_reflogs), then a race again
)
REMNANT_LOOKS = 5  # reads of the store while only other writers' remnants block (_wait_out_remnants)


class Grants(ServiceBase):
    """A role of ``LeaseService`` (gitlease/service/leases.py): see this module's docstring."""

    def acquire(
        self,
        raw_scopes: Sequence[str],
        *,
        ttl: int | None = None,
        holder_pid: int = 0,
        renew_every: int | None = None,
        workspace: str | None = None,
        replace: str | None = None,
        piggyback: Sequence[RefUpdate] = (),
        stop_after: int | None = None,
        task: str | None = None,
    ) -> Acquired:
        """One push creating the lease's refs. ``task``: a queued task this lease claims: its id is the lease's
        task id, and ``refs/leases/task/<task>`` is created in the same atomic push (so two workers never claim
        one task), and deleted with the lease's other refs. ``replace``: a lease this worktree holds, released in
        the same atomic push (a worker moving to its next task pays one push, not two) when the two scopes do not
        overlap; otherwise, or when the combined push is refused, it is released first on its own.
        ``piggyback``: other updates (the renewal agent's due renewals, gitlease/liveness/agent.py) sent in the same
        atomic push; when one of them is refused the acquire is retried without them, and ``piggybacked``
        in the answer says whether they landed. ``stop_after``: the holder's promise, recorded as ``stopBy`` in
        each version, to have stopped that many seconds after its last renewal unless it hears of a later one
        (a supervised holder's stop deadline; default: the TTL). A refused or unclear attempt leaves none of its
        refs behind: whatever of it landed is deleted again (``_undo_partial``)."""
        self.require_store()
        paths = scopes.normalize_all(raw_scopes)
        ttl = ttl or self.settings.ttl
        make = functools.partial(self._record, paths, ttl, holder_pid, renew_every, workspace, stop_after, task)
        self._check_size(paths, make)
        self.check_writer()
        doctor_gate(self)  # no passing doctor verdict for this server: a warning, or refused (verdict.py)
        release_with = self._release_with(replace, paths)
        cleared: list[str] = []
        last_refusal: Outcome | None = None
        attempts: dict[str, tuple[Record, str]] = {}  # lease id -> (record, oid) of each push made
        patience = self.clock.monotonic() + LOST_RACE_PATIENCE
        attempt = -1
        while self._try_again(attempt, last_refusal, patience):
            attempt += 1
            rec = make()  # a new lease id, nonce and version 1 each attempt
            oid, updates = self._grant(rec, task)
            attempts[rec.lease_id] = (rec, oid)
            out = self._push(updates + release_with + list(piggyback))
            if piggyback and not out.ok:
                refused = [u for u in piggyback if _refused_itself(out.statuses.get(u.ref, ""))]
                piggyback = ()
                if refused:  # a renewal failed the atomic push: the same acquire again, without them
                    self._undo_partial(attempts)
                    continue
            if release_with and replace is not None:  # (nothing to release with no lease to replace)
                if out.ok:
                    self.forget(replace)
                else:  # refused as a whole: the old lease stays; release it on its own, then acquire as usual
                    release_with = []
                    self._release_quietly(replace)
                    if not any(st.startswith("rejected") for st in out.statuses.values()):
                        self._undo_partial(attempts)
                        continue
            if out.ok:
                refuse_legacy_overlap(self, paths, rec, oid)  # a live lease named by an earlier version (legacy.py)
                self._remember(rec, oid, oid, task)
                return Acquired(rec.lease_id, rec, oid, tuple(cleared), bool(piggyback))
            last_refusal = out
            if any("hook declined" in st for st in out.statuses.values()):
                self._undo_partial(attempts)
                raise _declined(rec, out)
            self._heal_stale_reflogs(out)
            # only what bears on the scope, and our attempts (their remnants are found by their ids and grants)
            snap = self.snapshot(use_cache=False, paths=paths, keep=attempts)
            landed = self._landed_after_all(snap, attempts, task)
            if landed is not None:
                return Acquired(landed[0].lease_id, landed[0], landed[1], tuple(cleared))
            self._undo_partial(attempts, snap)
            snap = self._wait_out_remnants(paths, snap, set(attempts))
            self._clear_blockers(paths, snap, set(attempts), cleared)
            # nothing blocks any more (released meanwhile, or cleared, or a push that lost only a ref lock to
            # another racer's push that did not land either): again with a new version, after a pause with
            # jitter, so that racers who all lost to each other's locks do not meet again at once
            self._pause_after_lost_race(attempt, out, patience)
        raise self._refusal(paths, attempts, last_refusal)

    def _heal_stale_reflogs(self, out: Outcome) -> None:
        """Remove the stale reflogs that refused a create (``stale_reflog_refs``): a server that keeps a reflog of
        every ref (core.logAllRefUpdates=always) can be left, by two pushes racing to create ``.../services`` and
        ``.../services/billing``, with the reflog file of a ``.../services`` that was never created; git then
        refuses every later create below it, for good, while no ref is there to see. A lease on that path,
        taken and given back at once, creates its scope ref (which appends to the reflog) and deletes it (which
        deletes the reflog): an ordinary lease, signed and audited, that every server hook takes. Nothing can
        hold a path whose reflog is a stale file (no ref exists below it), so the lease is granted unless
        another writer takes it first."""
        for ref in stale_reflog_refs(out):
            parent = ref.rpartition("/")[0]
            if not is_scope_ref(parent):
                continue
            path = path_of_scope_ref(parent)
            try:
                got = self.acquire([path], ttl=max(self.settings.skew, 60))
                self.release(got.lease_id)
            except GitLeaseError:  # taken meanwhile, or the store away: the acquire's own reading decides
                continue

    def _try_again(self, attempt: int, last: Outcome | None, patience: float) -> bool:
        """Whether an acquire makes attempt ``attempt + 1``: up to ACQUIRE_ATTEMPTS in all, and after those, for
        as long as each push only lost a race (``lost_race``) and LOST_RACE_PATIENCE has not passed."""
        if attempt + 1 < ACQUIRE_ATTEMPTS:
            return True
        return last is not None and lost_race(last) and self.clock.monotonic() < patience

    def _pause_after_lost_race(self, attempt: int, out: Outcome, patience: float) -> None:
        """A jittered pause, growing with each attempt up to LOST_RACE_PAUSE_CAP, so that racers who all lost to
        each other's locks do not meet again at once; none before the last attempt."""
        import random

        if self._try_again(attempt, out, patience):
            self.clock.sleep(random.uniform(0.0, min(0.05 * 2 ** min(attempt, 8), LOST_RACE_PAUSE_CAP)))

    def _refusal(
        self, paths: tuple[str, ...], attempts: dict[str, tuple[Record, str]], last: Outcome | None
    ) -> GitLeaseError:
        """Why an acquire whose every attempt lost a race is refused: what holds the scope now (HeldError, exit
        3), else the store's last refusal."""
        if last is not None:
            snap = self._wait_out_remnants(paths, self.snapshot(use_cache=False, paths=paths), set(attempts))
            live = self._live_blockers(paths, snap, attempts)
            if live:
                return held_error(paths, live, self.clock.now(), self.settings.skew)
        why = _reasons(last) or (last.message if last else "") or "the store refused the update"
        said = [ln.strip() for ln in (last.server if last else []) if ln.strip().startswith(("error:", "fatal:"))]
        if said:  # git's own words of why (a lock held, a ref in the way)
            why += f" ({said[0]})"
        if last is not None and lost_race(last):  # nobody held it: writers kept meeting at the same refs
            why += (
                f"; lost every race for {LOST_RACE_PATIENCE:.0f}s ({len(attempts)} pushes) with no lease holding "
                "the scope: try again"
            )
        return GitLeaseError(f"could not acquire {' '.join(paths)}: {why}")

    def _owner(self, holder_pid: int, task: str | None = None) -> Owner:
        return Owner(
            task_id=task or self.settings.task,
            agent_id=self.settings.agent,
            host=os.uname().nodename,
            pid=holder_pid,
            pid_start=process_start(holder_pid) if holder_pid else None,
            key=self.signer.public_key,
        )

    def _record(
        self,
        paths: tuple[str, ...],
        ttl: int,
        holder_pid: int,
        renew_every: int | None,
        workspace: str | None,
        stop_after: int | None = None,
        task: str | None = None,
    ) -> Record:
        now = self.clock.now()
        return records.new_record(
            lease_id=records.new_lease_id(now),
            repo=self._repo_name(),
            paths=paths,
            workspace_id=workspace or self._workspace(),
            owner=self._owner(holder_pid, task),
            now=now,
            ttl=ttl,
            renew_every=renew_every,
            stop_after=stop_after,
        )

    def _check_size(self, paths: tuple[str, ...], make: Callable[[], Record]) -> None:
        """Refuse, before any push, a lease whose record (any version of it: ``make()`` gives one) readers would
        refuse, or whose release or reclaim the audit log could not record."""
        if len(paths) > records.MAX_PATHS:
            problem: str | None = f"{len(paths)} paths, over the limit of {records.MAX_PATHS} paths per lease"
        else:
            rec = make()
            problem = records.size_problem(rec) or self.release_size_problem(rec)
        if problem:
            raise UsageError(
                f"scope too large for one lease ({len(paths)} paths): {problem}; lease coarser scopes "
                "(folders instead of files: git lease plan --granularity dir)",
                paths=len(paths),
                limitBytes=records.MAX_RECORD_BYTES,
                limitPaths=records.MAX_PATHS,
            )

    def release_size_problem(self, rec: Record, task: str | None = None) -> str | None:
        """Why the release or reclaim of a lease like ``rec`` (its refs and paths listed in one audit entry,
        by a writer with the longest id) could be refused for its size, or None."""
        from gitlease.service.audit import entry_problem

        oid = "0" * (64 if self.repo.object_format == "sha256" else 40)
        refs = {id_ref(rec.lease_id): oid, **{scope_ref(p): oid for p in rec.paths}}
        if task or rec.owner.task_id:
            refs[task_ref(task or rec.owner.task_id)] = oid
        fields = {
            "action": "force-release",
            "rule": "progress-stalled",
            "by": "x" * 256,
            "leaseId": rec.lease_id,
            "version": 10**9,
            "oid": oid,
            "grant": oid,
            "refs": refs,
            "paths": list(rec.paths),
            "owner": rec.owner.to_json(),
            "expiresAt": rec.expires_at,
            "valid": True,
        }
        return entry_problem(fields, writer="x" * 256, key=self.signer.public_key, oid_hex=len(oid))

    def _grant(self, rec: Record, task: str | None = None) -> tuple[str, list[RefUpdate]]:
        """The version 1 ``rec`` written (a unique commit), and the creates of its id ref and scope refs (and of
        its task's claim, ``task``)."""
        oid = self._write_version(rec, None, "acquire")
        updates = [RefUpdate(id_ref(rec.lease_id), oid, None)] + [RefUpdate(scope_ref(p), oid, None) for p in rec.paths]
        if task:
            updates.append(RefUpdate(task_ref(task), oid, None))
        return oid, updates

    def _release_with(self, replace: str | None, paths: tuple[str, ...]) -> list[RefUpdate]:
        """The deletes releasing ``replace`` in the acquire's own push; none (released first, on its own) when
        its scope overlaps the new one (git refuses a delete and an overlapping create in one push)."""
        if replace is None:
            return []
        h = self.held_lease(replace)
        if h.pending:
            h = self._settle_pending(h)
        if scopes.sets_overlap(h.paths, paths):
            self.release(replace)
            return []
        return [RefUpdate(id_ref(replace), None, h.current)] + [
            RefUpdate(ref, None, h.grant) for ref in [scope_ref(p) for p in h.paths] + _task_refs(h)
        ]

    def _release_quietly(self, lease_id: str | None) -> None:
        if lease_id is None:
            return
        try:
            self.release(lease_id)
        except (LeaseLost, NotHeld):
            pass  # gone already: nothing of it to give back

    def _push(self, updates: Sequence[RefUpdate]) -> Outcome:
        """One atomic transaction; an unclear outcome re-read and settled (``_resolve``)."""
        out = self.store.apply(updates)
        if out.ambiguous:
            out = self._resolve(updates, out)
        return out

    def _landed_after_all(
        self, snap: Snapshot, attempts: dict[str, tuple[Record, str]], task: str | None = None
    ) -> tuple[Record, str] | None:
        """An attempt of ours that landed whole after all (it timed out, or its answer was lost, and the server
        committed it later): lease ids and objects are unique to each attempt, so it is ours."""
        for lid, (arec, aoid) in attempts.items():
            mine = snap.find(lid)
            if (
                mine is not None
                and mine.current_oid == aoid
                and mine.grant_oid == aoid
                and set(mine.scope_refs) == {scope_ref(p) for p in arec.paths}
            ):
                self._remember(arec, aoid, aoid, task)
                return arec, aoid
        return None

    def _undo_partial(self, attempts: dict[str, tuple[Record, str]], snap: Snapshot | None = None) -> list[str]:
        """Delete every ref that an attempt of ours wrote although the attempt as a whole did not land (a
        server that applied the atomic push in part, or an unclear outcome settled as "not landed"): each
        delete pinned to the attempt's own object, so nothing but our remnant can go. Returns the refs
        deleted. Left as it is when the store cannot be read or refuses the delete (then it is INVALID and
        blocks its paths, fail closed, as before)."""
        oids = {aoid for _rec, aoid in attempts.values()}
        try:
            refs = self.store.list_refs() if snap is None else {r: o for v in snap.leases for r, o in v.refs().items()}
        except RemoteUnavailable:
            return []
        stray = sorted(ref for ref, oid in refs.items() if oid in oids)
        if not stray:
            return []
        out = self._push([RefUpdate(ref, None, refs[ref]) for ref in stray])
        return stray if out.ok else []

    def _wait_out_remnants(self, paths: tuple[str, ...], snap: Snapshot, mine: set[str]) -> Snapshot:
        """When everything that blocks ``paths`` is a remnant of another writer's attempt (an id ref without
        scope refs: a push that failed part-way on the server, or one being committed as we read), look again a
        few times before refusing: such a writer deletes its remnant at once (``_undo_partial``), and without
        this every racer of a crowded race can refuse on another's remnant while no one wins. Remnants still
        there after the last look block as before (fail closed); a real lease found meanwhile refuses."""
        import random

        for k in range(REMNANT_LOOKS):
            live = self._live_blockers(paths, snap, mine)
            if not live or not all(HALF_DELETED in b.problems for b in live):
                return snap
            self.clock.sleep(random.uniform(0.02, 0.1) * (k + 1))
            snap = self.snapshot(use_cache=False, paths=paths, keep=mine)
        return snap

    def _live_blockers(self, paths: Sequence[str], snap: Snapshot, mine: Iterable[str]) -> list[LeaseView]:
        """The leases that block ``paths`` now (not expired beyond the skew margin), ours (``mine``) aside."""
        mine = set(mine)
        return [v for v in snap.blocking(paths, self.clock.now(), self.settings.skew) if v.lease_id not in mine]

    def _clear_blockers(self, paths: tuple[str, ...], snap: Snapshot, mine: set[str], cleared: list[str]) -> None:
        """HeldError when a lease that is not expired beyond the skew margin overlaps ``paths``; otherwise clear
        the expired ones (audited), adding their ids to ``cleared``. ``mine``: our own attempts (not blockers)."""
        now = self.clock.now()
        blockers = [b for b in snap.overlapping(paths) if b.lease_id not in mine]
        live = [b for b in blockers if b.state(now, self.settings.skew) != "expired"]
        if live:
            raise held_error(paths, live, now, self.settings.skew)
        for b in blockers:
            if self._clear(b):
                cleared.append(b.lease_id)

    def _remember(self, rec: Record, oid: str, grant: str, task: str | None = None) -> None:
        with self.held.locked() as held:
            held[rec.lease_id] = Held(
                lease_id=rec.lease_id,
                store=self.store.name,
                current=oid,
                grant=grant,
                record=rec.canonical().decode("utf-8"),
                paths=list(rec.paths),
                expires_at=rec.expires_at,
                version=rec.version,
                task=task or None,
            )

    def release(self, lease_id: str, *, piggyback: Sequence[RefUpdate] = ()) -> Released:
        """Delete the lease's refs at the values this worktree wrote, and record the release in this writer's
        audit log, in one atomic push. ``piggyback``: other updates sent in the same atomic push (see
        ``acquire``); ``piggybacked`` in the answer says whether they landed. Waits for a renewal of the same
        lease in this worktree (the renewal agent's, a heartbeat's) to finish first.

        A lease this worktree does not hold: released before (or reclaimed), it is gone from the store and the
        answer says ``already`` (idempotent); otherwise NotHeld says where it is held, or that no such lease
        is known (a typo)."""
        self.require_store()
        records.check_lease_id(lease_id)
        if lease_id not in self.held.load():
            return self._not_held(lease_id)
        with self._renewing(lease_id):
            return self._release(lease_id, list(piggyback))

    def _release(self, lease_id: str, piggyback: list[RefUpdate], listed: dict[str, str] | None = None) -> Released:
        """``listed``: the store's refs, read after a release built from the held state was refused while the
        lease was still at the version this worktree wrote: the refs of the lease are then taken from the store
        (every scope and task ref at its grant), not from the local state, which may only narrow them."""
        h, rec = self._releasable(lease_id)
        updates, fields = self._release_parts(h, rec, listed)
        got = self.audit.append_with(updates + piggyback, fields, pointer=h.current)
        if got.ok:
            self.forget(lease_id)
            return Released(lease_id, piggybacked=bool(piggyback), audit=got.oid)
        if piggyback and got.status == "changed":
            if any(got.refs.get(u.ref) != u.old for u in piggyback):
                return self._release(lease_id, [])  # a renewal failed the atomic push: release on its own
        if got.status == "failed":
            raise GitLeaseError(f"release of {lease_id} refused by the store: {got.message}", leaseId=lease_id)
        refs = got.refs
        if listed is None and refs.get(id_ref(lease_id)) == h.current:
            # still ours, at the version this worktree wrote: its refs differ from the local state's (held.json
            # changed outside gitlease, or an extend or narrow whose answer was lost): release what the store has
            return self._release(lease_id, [], listed=refs)
        ours = [u for u in updates if refs.get(u.ref) == u.old]
        if not ours:
            self.forget(lease_id)
            raise LeaseLost(
                f"lease lost or replaced: {lease_id} was already gone from the store (reclaimed, or cleared after "
                f"it expired: git lease log --lease {lease_id})",
                gone=True,
            )
        raise LeaseLost(f"lease lost or replaced: {lease_id} changed on the store; nothing was released")

    def _releasable(self, lease_id: str) -> tuple[Held, Record]:
        """The held state and current record of a lease this worktree may release (Forbidden for another key than
        the owner's), a pending write settled first."""
        h = self.held_lease(lease_id)
        rec = records.parse(h.record.encode("utf-8"))
        self._require_owner_key(rec, "release")
        if h.pending:
            h = self._settle_pending(h)
            rec = records.parse(h.record.encode("utf-8"))
        return h, rec

    def _release_parts(
        self, h: Held, rec: Record, listed: dict[str, str] | None = None
    ) -> tuple[list[RefUpdate], dict[str, Any]]:
        """A release's deletes (each of the lease's refs, pinned to the value this worktree wrote: from the held
        state, or ``listed``, the store's refs) and its audit entry's fields."""
        lease_id = h.lease_id
        if listed is None:
            refs_of_lease = [scope_ref(p) for p in h.paths] + _task_refs(h)
            paths = list(h.paths)
        else:
            refs_of_lease = sorted(r for r, o in listed.items() if o == h.grant and r != id_ref(lease_id))
            paths = [p for r in refs_of_lease if (p := _scope_path(r)) is not None]
        updates = [RefUpdate(id_ref(lease_id), None, h.current)] + [
            RefUpdate(ref, None, h.grant) for ref in refs_of_lease
        ]
        fields = {
            "action": "release",
            "rule": None,
            "reason": "released by its holder",
            "by": self.settings.agent,
            "leaseId": lease_id,
            "version": rec.version,
            "oid": h.current,
            "grant": h.grant,
            "refs": {u.ref: u.old for u in updates},
            "paths": paths,
            "owner": rec.owner.to_json(),
            "expiresAt": rec.expires_at,
            "valid": True,
        }
        return updates, fields

    def prepare_release(self, lease_id: str) -> PreparedRelease:
        """The release of a lease this worktree holds, made ready to push with other updates (the landing
        train's push, with the task's commit and outcome): the deletes of its refs pinned to the values this
        worktree wrote, and its audit entry's fields (the caller appends the entry in the same push:
        AuditLog.prepare_entries). The lease's renew lock is taken here without waiting (Busy when its holder
        renews it right now) and held until ``prep.close()``: nothing renews it meanwhile. NotHeld, LeaseLost,
        Forbidden as ``release``."""
        self.require_store()
        records.check_lease_id(lease_id)
        self.held_lease(lease_id)  # NotHeld before taking any lock
        fh = self._take_renew_lock(lease_id)
        try:
            h, rec = self._releasable(lease_id)
            updates, fields = self._release_parts(h, rec)
        except BaseException:
            fh.close()
            raise
        return PreparedRelease(lease_id, updates, fields, h.current, fh)

    def settle_release(self, prep: PreparedRelease, landed: bool) -> None:
        """After the push that carried ``prep``: landed, this worktree holds the lease no more (the renew lock
        stays taken until ``prep.close()``, so that its holder stops renewing first)."""
        if landed:
            self.forget(prep.lease_id)

    def _not_held(self, lease_id: str) -> Released:
        """Release of a lease this worktree does not hold: gone from the store (released before, reclaimed) is
        a success (``already``); on the store, say who holds it and where; unknown, say so."""
        try:
            view = self.snapshot(use_cache=False).find(lease_id)
        except RemoteUnavailable as exc:
            raise NotHeld(
                f"lease {lease_id} is not held by this worktree ({self.repo.cwd}), and the store cannot be "
                f"read to say more: {exc}",
                leaseId=lease_id,
            ) from None
        if view is None:
            gone = self.gone_note(lease_id)
            if gone is None:
                raise NotHeld(
                    f"no lease {lease_id} on store {self.store.name}, and no trace of it in the audit log: "
                    "this worktree never held it (a typo? 'git lease status' lists the leases)",
                    leaseId=lease_id,
                )
            return Released(lease_id, already=True, note=gone)
        raise NotHeld(
            f"lease {lease_id} is not held by this worktree ({self.repo.cwd}): {self._where_held(view)}",
            leaseId=lease_id,
        )


def _declined(rec: Record, out: Outcome) -> GitLeaseError:
    """A server hook refused the grant: say so with the server's own reasons."""
    said = [ln for ln in out.server if ln not in out.message][:5]
    return GitLeaseError(
        f"the store refused lease {rec.lease_id}: {out.message or 'a server hook declined'}"
        + "".join(f"; remote: {ln}" for ln in said),
        server=out.server,
    )


def _scope_path(ref: str) -> str | None:
    try:
        return path_of_scope_ref(ref)
    except ValueError:
        return None


def _task_refs(h: Held) -> list[str]:
    """The claim ref of the queued task a held lease works on (``acquire(task=...)``), if any."""
    return [task_ref(h.task)] if h.task else []


def lost_race(out: Outcome) -> bool:
    """Whether a refused push lost only races with other writers (every ref refused for one of RACE_REASONS),
    not a rule that would refuse it again (a hook, a permission, an unreachable server)."""
    refused = [st for st in out.statuses.values() if st.startswith("rejected")]
    return bool(refused) and all(any(r in st for r in RACE_REASONS) for st in refused)


def stale_reflog_refs(out: Outcome) -> list[str]:
    """The lease refs a push could not create because a file stands where a directory of their reflogs must be
    (git: "cannot update the ref '<ref>': unable to append to '.../logs/<ref>': Not a directory")."""
    found = []
    for line in out.server:
        m = re.search(r"(?:update|lock) (?:the )?ref '(refs/leases/[^']+)'.*Not a directory", line)
        if m and m.group(1) not in found:
            found.append(m.group(1))
    return found


def _reasons(out: Outcome | None) -> str:
    """The distinct reasons git gave for the refs it refused on their own account."""
    if out is None:
        return ""
    seen = dict.fromkeys(st.removeprefix("rejected:") for st in out.statuses.values() if _refused_itself(st))
    return "; ".join(seen)


def _refused_itself(status: str) -> bool:
    """A ref of an atomic push refused on its own account (not only because another ref failed the push)."""
    return status.startswith("rejected") and "atomic push failed" not in status
