"""The lease service as the writer for one worktree, keeping: ``renew`` (version N+1 pinned to version N, one
ref), its two steps for whoever renews (``prepare_renewal``, ``settle_renewal``, a late write of ours adopted),
``extend`` and ``narrow`` (gitlease/service/resize.py), and this worktree's held state kept in step.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING

from gitlease.core import gitcmd
from gitlease.core import record as records
from gitlease.core.errors import (
    GitLeaseError,
    LeaseLost,
    NotHeld,
    PushRejected,
    RemoteUnavailable,
)
from gitlease.core.fsutil import LockBusy, lock_file
from gitlease.core.progress import next_progress
from gitlease.core.record import Record
from gitlease.core.refnames import id_ref
from gitlease.core.state import Held
from gitlease.core.store import (
    Outcome,
    RefUpdate,
)
from gitlease.service.base import ServiceBase
from gitlease.service.results import Busy, PreparedRenewal, Renewed

if TYPE_CHECKING:
    from gitlease.service.resize import Resized


class Renewals(ServiceBase):
    """A role of ``LeaseService`` (gitlease/service/leases.py): see this module's docstring."""

    def held_lease(self, lease_id: str) -> Held:
        """What this worktree holds of ``lease_id`` (its held state), or NotHeld."""
        h = self.held.load().get(lease_id)
        if h is None:
            raise NotHeld(f"lease {lease_id} is not held by this worktree ({self.repo.cwd})")
        if h.store != self.store.name:
            raise NotHeld(f"lease {lease_id} is held on store {h.store!r}, not {self.store.name!r}")
        return h

    def renew(
        self,
        lease_id: str,
        *,
        ttl: int | None = None,
        progress: str | None = None,
        extra_refspecs: Sequence[str] = (),
        stop_after: int | None = None,
    ) -> Renewed:
        """A new version on the id ref, CAS-pinned to the one this worktree wrote. ``extra_refspecs`` (a remote
        store only) are pushed in the same atomic push: see ``push_fenced``. Renewals of one lease in one
        worktree (a heartbeat and a fenced push of its command) take turns, so they never race each other.
        ``stop_after``: see ``acquire`` (default: carried over from the version renewed)."""
        self.require_store()
        self.held_lease(records.check_lease_id(lease_id))  # before any file is named after it
        with self._renewing(lease_id):
            return self._renew(
                lease_id, ttl=ttl, progress=progress, extra_refspecs=extra_refspecs, stop_after=stop_after
            )

    def _renew_lock_path(self, lease_id: str) -> str:
        return os.path.join(self.held.folder, f"renew-{lease_id}.lock")

    @contextlib.contextmanager
    def _renewing(self, lease_id: str) -> Iterator[None]:
        """A per-lease lock file in the worktree's state folder, waited for at most the store timeout."""
        try:
            wait = gitcmd.remaining(float(self.store.timeout)) or 0.0
            fh = lock_file(self._renew_lock_path(lease_id), wait=wait, clock=self.clock)
        except LockBusy:
            raise RemoteUnavailable(f"another renewal of {lease_id} in this worktree did not finish in time") from None
        with fh:
            yield

    def _renew(
        self,
        lease_id: str,
        *,
        ttl: int | None,
        progress: str | None,
        extra_refspecs: Sequence[str],
        stop_after: int | None = None,
    ) -> Renewed:
        prep = self.prepare_renewal(lease_id, ttl=ttl, progress=progress, stop_after=stop_after)
        out = self.store.apply([prep.update], extra_refspecs=extra_refspecs)
        if not out.connected:  # git never reached the store: nothing was written, the lease is as it was
            prep.close()
            out.check_reached()
        if out.ambiguous:
            try:
                refs = self._reread(out, "write")
            except RemoteUnavailable:
                self.settle_renewal(prep, None)
                raise
            resolved = self._settled([prep.update], out, refs)
            if not resolved.ok and refs.get(prep.update.ref) == prep.update.old:
                # not there yet, but a push given up on can still land on the server (docs/protocol.md)
                self.settle_renewal(prep, None)  # kept pending: the next renewal reads which version won
                raise RemoteUnavailable(
                    f"outcome of the renewal of {lease_id} unknown: {out.message or 'no answer'}; its version "
                    "was not on the store yet and may still land; the next renewal settles it"
                )
            out = resolved
        if not out.ok and extra_refspecs and self.store.list_refs().get(prep.update.ref) == prep.update.old:
            raise PushRejected(
                f"push rejected, nothing landed: {_branch_refusal(out, prep.update.ref)}; the lease "
                f"{lease_id} is still held (not renewed)",
                statuses=out.statuses,
                server=out.server,
            )
        got = self.settle_renewal(prep, out.ok)
        if isinstance(got, GitLeaseError):
            raise got
        assert got is not None
        if not out.ok and extra_refspecs:  # an earlier renewal of ours had landed: the lease is held, the push not
            raise PushRejected(
                f"push rejected, nothing landed: the lease {lease_id} had moved on by an earlier renewal of this "
                "worktree (adopted now); push again",
                statuses=out.statuses,
                server=out.server,
            )
        return got

    def renewable(self, lease_id: str, action: str = "renew") -> tuple[Held, Record]:
        """The held state and current record of ``lease_id``, when this worktree may write its next version
        (renew, extend, narrow): a pending write settled first; Forbidden for another key than the owner's;
        LeaseLost (the lease forgotten here) once it expired or passed its stop deadline by the local clock."""
        h = self.held_lease(lease_id)
        if h.pending:
            h = self._settle_pending(h)
        current = records.parse(h.record.encode("utf-8"))
        self._require_owner_key(current, action)
        what = "renewal" if action == "renew" else action
        now = self.clock.now()
        if now >= current.expires:
            self.forget(lease_id)
            raise LeaseLost(
                f"lease {lease_id} expired at {current.expires_at}; {what} after expiry is refused "
                "(stop writing and acquire again)"
            )
        if now >= current.stop_deadline:
            self.forget(lease_id)
            raise LeaseLost(
                f"lease {lease_id} passed its stop deadline ({current.stop_by}): its holder has stopped, and the "
                f"early reclaim rules may take it; {what} is refused (stop writing and acquire again)"
            )
        return h, current

    def prepare_renewal(
        self,
        lease_id: str,
        *,
        ttl: int | None = None,
        progress: str | None = None,
        lock: bool = False,
        stop_after: int | None = None,
    ) -> PreparedRenewal:
        """The next version of a lease this worktree holds, written (objects only) and ready to push as
        ``.update`` (the id ref, pinned to the version this worktree wrote); ``settle_renewal`` follows. Refused
        (nothing written): NotHeld, LeaseLost (past its stop deadline: its holder has stopped by its own
        promise, and an expired lease may be cleared by anyone), Forbidden (another key than the owner's: a
        renewal is signed exactly as the holder signs, or not made).

        ``lock``: take the lease's renew lock here without waiting, held until ``settle_renewal`` (Busy when the
        holder is renewing or releasing it right now); otherwise the caller holds it (``renew``)."""
        self.held_lease(lease_id)  # NotHeld before taking any lock
        fh = self._take_renew_lock(lease_id) if lock else None
        try:
            h, current = self.renewable(lease_id)  # under the lock: what another renewer may just have written
            now = self.clock.now()
            prog = next_progress(progress, current.progress, now) if progress is not None else None
            nxt = current.next_version(now, ttl=ttl, progress=prog, stop_after=stop_after)
            records.validate(nxt)
            oid = self._write_version(nxt, h.current, "renew")
        except BaseException:
            if fh is not None:
                fh.close()
            raise
        return PreparedRenewal(lease_id, RefUpdate(id_ref(lease_id), oid, h.current), nxt, fh)

    def _take_renew_lock(self, lease_id: str) -> IO[str]:
        """The lease's renew lock, taken without waiting (Busy when its holder is renewing or releasing it right
        now): held by whoever keeps the file open."""
        try:
            return lock_file(self._renew_lock_path(lease_id), wait=0)
        except LockBusy:
            raise Busy(f"lease {lease_id} is being renewed or released by its holder; skipped this time") from None

    def settle_renewal(self, prep: PreparedRenewal, landed: bool | None) -> Renewed | LeaseLost | None:
        """After the push that carried ``prep.update``, as the store decided it for that ref: True, it landed
        (this worktree's held state moves on: Renewed); False, refused on its own account (the lease is lost
        or replaced: forgotten here, and the LeaseLost to report returned); None, unknown (remembered as
        pending and settled by re-reading before the next renewal). Drops the renew lock ``prep`` holds."""
        try:
            if landed:
                oid = prep.update.new
                assert oid is not None  # a renewal sets the id ref to its new version, never deletes it
                self._update_held(prep.lease_id, prep.record, oid)
                return Renewed(prep.lease_id, prep.record, oid)
            if landed is None:
                with self.held.locked() as held:
                    if prep.lease_id in held:
                        held[prep.lease_id].pending = prep.update.new
                        held[prep.lease_id].pending_record = prep.record.canonical().decode("utf-8")
                return None
            late = self._late_pending(prep.lease_id)
            if late is not None:  # refused because an earlier renewal of ours, given up on, landed after all
                return late
            self.forget(prep.lease_id)
            return LeaseLost(
                f"lease lost or replaced: {prep.lease_id} is no longer at the version this worktree wrote "
                "(stop writing)",
                leaseId=prep.lease_id,
            )
        finally:
            prep.close()

    def extend(self, lease_id: str, raw_scopes: Sequence[str], *, ttl: int | None = None) -> Resized:
        """Add paths to a lease this worktree holds, in one atomic push (gitlease/service/resize.py)."""
        from gitlease.service import resize

        return resize.extend(self, lease_id, raw_scopes, ttl=ttl)

    def narrow(self, lease_id: str, raw_scopes: Sequence[str], *, ttl: int | None = None) -> Resized:
        """Give paths of a lease this worktree holds back, in one atomic push (gitlease/service/resize.py)."""
        from gitlease.service import resize

        return resize.narrow(self, lease_id, raw_scopes, ttl=ttl)

    def _settle_pending(self, h: Held) -> Held:
        """A write of ours whose outcome was unclear: adopted when the store has it. When the store still has
        the version it replaces, it stays pending: a push given up on can still land on the server
        (docs/protocol.md), and the next write, pinned to that version, settles it (``_late_pending``). Any other
        value: not ours; dropped (the next write finds the lease lost)."""
        refs = self.store.list_refs()
        now_at = refs.get(id_ref(h.lease_id))
        with self.held.locked() as held:
            cur = held.get(h.lease_id)
            if cur is None:
                raise NotHeld(f"lease {h.lease_id} is not held by this worktree")
            if cur.pending is not None and now_at == cur.pending and cur.pending_record:
                _adopt_pending(cur)
            elif now_at != cur.current:
                cur.pending = cur.pending_record = None
            return Held(**vars(cur))

    def _late_pending(self, lease_id: str) -> Renewed | None:
        """After a write pinned to the version this worktree holds was refused: was it refused because an
        earlier write of ours (pending: its push given up on) landed meanwhile? Then that one is adopted, and it
        is the renewal (never reported lost for a write of its own)."""
        h = self.held.load().get(lease_id)
        if h is None or h.pending is None or not h.pending_record:
            return None
        try:
            now_at = self.store.list_refs().get(id_ref(lease_id))
        except RemoteUnavailable:
            return None
        if now_at != h.pending:
            return None
        with self.held.locked() as held:
            cur = held.get(lease_id)
            if cur is None or cur.pending != now_at:
                return None
            _adopt_pending(cur)
            rec = records.parse(cur.record.encode("utf-8"))
            return Renewed(lease_id, rec, cur.current)

    def _update_held(self, lease_id: str, rec: Record, oid: str) -> None:
        with self.held.locked() as held:
            if lease_id in held:
                h = held[lease_id]
                h.current, h.record, h.version, h.expires_at = (
                    oid,
                    rec.canonical().decode("utf-8"),
                    rec.version,
                    rec.expires_at,
                )
                h.paths = list(rec.paths)  # an extend or narrow changes it
                h.pending = h.pending_record = None

    def forget(self, lease_id: str) -> None:
        """This worktree holds ``lease_id`` no more (lost, released, or reclaimed by this client)."""
        with self.held.locked() as held:
            held.pop(lease_id, None)
        try:  # its renew lock: nobody takes it again (every renewal and release asks held_lease first)
            os.unlink(self._renew_lock_path(lease_id))
        except OSError:
            pass


def _adopt_pending(cur: Held) -> None:
    """The pending write found on the store: it is the current version now."""
    assert cur.pending is not None and cur.pending_record is not None
    cur.current, cur.record = cur.pending, cur.pending_record
    rec = records.parse(cur.record.encode("utf-8"))
    cur.version, cur.expires_at = rec.version, rec.expires_at
    cur.paths = list(rec.paths)  # an extend or narrow changes it
    cur.pending = cur.pending_record = None


def _branch_refusal(out: Outcome, lease_ref: str) -> str:
    """Why the non-lease refs of a fenced push were refused, from its porcelain statuses."""
    why = [
        f"{ref} {status.partition(':')[2] or status}"
        for ref, status in sorted(out.statuses.items())
        if ref != lease_ref and status.startswith("rejected")
    ]
    return "; ".join(why) or out.message or "the remote refused the push"
