"""The lease service: acquire, renew, release, status, show, can-start.

It owns the protocol (docs/protocol.md): which refs a lease has, how each change is one compare-and-swap
transaction, how ambiguous outcomes are resolved by re-reading, and when an expired blocker may be cleared.
It prints nothing and never exits; the CLI renders what it returns.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gitlease.core import record as records
from gitlease.core import scope as scopes
from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.config import NO_STORE, Settings
from gitlease.core.errors import (
    Forbidden,
    GitLeaseError,
    LeaseLost,
    NotHeld,
    PushRejected,
    RemoteUnavailable,
    UsageError,
)
from gitlease.core.fsutil import write_json
from gitlease.core.objects import ObjectWriter, ident_for
from gitlease.core.procs import process_start
from gitlease.core.progress import next_progress
from gitlease.core.record import Owner, Record
from gitlease.core.refnames import id_ref, scope_ref
from gitlease.core.repo import Repo
from gitlease.core.state import Held, HeldState
from gitlease.core.store import (
    Blob,
    Outcome,
    RefUpdate,
    RemoteStore,
    Store,
    open_store,
    same_remote,
)
from gitlease.identity.signer import ADMIN_NAMESPACE, UNSIGNED, Signer
from gitlease.service.views import (
    INVALID,
    HistoryEntry,
    LeaseView,
    Snapshot,
    _parse_blob,
    build_views,
    foreign_refs,
    held_error,
)

if TYPE_CHECKING:  # verification and the audit log are imported where used: not on every command's start-up
    from gitlease.identity.trust import Trust
    from gitlease.service.audit import Appended, AuditLog


ACQUIRE_ATTEMPTS = 4


# --------------------------------------------------------------------------------- views


@dataclass(frozen=True)
class Acquired:
    lease_id: str
    record: Record
    oid: str
    cleared: tuple[str, ...] = ()  # expired leases cleared on the way
    piggybacked: bool = False  # the ``piggyback`` updates landed in the same push


@dataclass(frozen=True)
class Renewed:
    lease_id: str
    record: Record
    oid: str


class LeaseService:
    def __init__(
        self,
        repo: Repo,
        settings: Settings,
        *,
        store: Store | None = None,
        clock: Clock = SYSTEM,
        signer: Signer = UNSIGNED,
    ) -> None:
        self.repo = repo
        self.settings = settings
        self.store = store or open_store(repo.cwd, settings.remote, timeout=settings.timeout)
        self.clock = clock
        self.signer = signer
        self.objects = ObjectWriter(repo.objects_dir, repo.object_format)
        self.held = HeldState(repo.private_dir())
        self._trust: Trust | None = None

    # ------------------------------------------------------------------ writing versions
    def _write_version(self, rec: Record, parent: str | None, action: str) -> str:
        data = rec.canonical()
        sig = self.signer.sign(data)
        msg = f"{action} {rec.lease_id} v{rec.version}\n\nscope: {' '.join(rec.paths)}\nexpires: {rec.expires_at}"
        return self.objects.lease_commit(
            data,
            sig,
            (parent,) if parent else (),
            ident_for(rec.owner.agent_id, rec.owner.host),
            int(self.clock.now()),
            msg,
        )

    def _repo_name(self) -> str:
        if self.settings.repo_name:
            return self.settings.repo_name
        if self.settings.remote:
            return _strip_userinfo(self.settings.remote)
        return "local:" + os.path.basename(self.repo.worktree or self.repo.common_dir.rstrip("/"))

    def _workspace(self) -> str:
        if self.settings.workspace:
            return self.settings.workspace
        return os.path.basename(self.repo.worktree or self.repo.git_dir.rstrip("/")) or "workspace"

    # --------------------------------------------------------------------------- identity
    def trust(self, *, offline: bool = False) -> Trust:
        """The trust file of this store (read once per service; see trust.load_trust). With a signing key
        configured a missing trust file is an error (InvalidRecord, exit 5); an unparsable one always is."""
        if self._trust is not None:
            return self._trust
        from gitlease.identity.trust import load_trust

        trust = load_trust(
            self.store,
            self.settings.allowed_signers,
            cache_dir=self.repo.shared_dir(),
            required=self.signer.public_key is not None,
            offline=offline,
        )
        if not offline:
            self._trust = trust
        return trust

    def require_admin(self, action: str) -> str:
        """The identity allowed to ``action`` (a forced release, a reclaim of a live lease), or Forbidden.

        Unsigned mode (no key, no trust file) has no identities to tell apart: anyone may, and the returned
        name says it was unsigned. Signed mode: only a key the trust file allows namespace ``gitlease-admin``
        (returned as "<principal> (<fingerprint>)"); a store with a trust file refuses a client without a key."""
        trust = self.trust()
        key = self.signer.public_key
        if key is None:
            if trust.signed:
                raise Forbidden(
                    f"{action} needs a {ADMIN_NAMESPACE} key: this store is signed ({trust.source}) "
                    "and lease.signingKey is not set"
                )
            return f"unsigned:{self.settings.agent}"
        principals = trust.admin_principals(key, self.clock.now())
        if not principals:
            raise Forbidden(
                f"{action} needs a {ADMIN_NAMESPACE} key: key {self.signer.fingerprint} is not allowed "
                f"namespace {ADMIN_NAMESPACE} in {trust.source}"
            )
        from gitlease.identity.sshsig import allowed

        name = (
            self.settings.agent
            if allowed(trust.signers or (), self.settings.agent, key, ADMIN_NAMESPACE, when=self.clock.now())
            else principals[0]
        )
        return f"{name} ({self.signer.fingerprint})"

    def _require_owner_key(self, rec: Record, action: str) -> None:
        """Owner binding on the writer's side: a lease is renewed or released only with the key that signed
        its version 1 (or, unsigned, only without a key)."""
        if rec.owner.key == self.signer.public_key:
            return
        if rec.owner.key is None:
            raise Forbidden(
                f"cannot {action} {rec.lease_id}: it was acquired unsigned, and lease.signingKey is "
                "now set (unset it to renew or release this lease)"
            )
        from gitlease.identity.sshsig import fingerprint_of

        mine = self.signer.fingerprint or "no key (lease.signingKey is not set)"
        raise Forbidden(
            f"cannot {action} {rec.lease_id}: it is owned by key {fingerprint_of(rec.owner.key)}, "
            f"and this client signs with {mine}"
        )

    # ------------------------------------------------------------------------- acquire
    def require_store(self) -> None:
        """Writes need a store chosen on purpose: with no ``lease.remote`` in a repository that has remotes,
        a lease written to this clone's own refs would exclude nobody (UsageError, exit 2)."""
        if self.settings.store_unset and self.repo.remotes and self.store.kind == "local":
            raise UsageError(NO_STORE)

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
    ) -> Acquired:
        """One push creating the lease's refs. ``replace``: a lease this worktree holds, released in the same
        atomic push (a worker moving to its next task pays one push, not two) when the two scopes do not
        overlap; otherwise, or when the combined push is refused, it is released first on its own.
        ``piggyback``: other updates (the renewal agent's due renewals, gitlease/liveness/agent.py) sent in the same
        atomic push; when one of them is refused the acquire is retried without them, and ``piggybacked``
        in the answer says whether they landed. A refused or unclear attempt leaves none of its refs behind:
        whatever of it landed is deleted again (``_undo_partial``)."""
        self.require_store()
        paths = scopes.normalize_all(raw_scopes)
        ttl = ttl or self.settings.ttl
        self._check_size(paths, ttl, holder_pid, renew_every, workspace)
        release_with = self._release_with(replace, paths)
        cleared: list[str] = []
        last_refusal: Outcome | None = None
        attempts: dict[str, tuple[Record, str]] = {}  # lease id -> (record, oid) of each push made
        for _attempt in range(ACQUIRE_ATTEMPTS):
            rec, oid, updates = self._grant(paths, ttl, holder_pid, renew_every, workspace)
            attempts[rec.lease_id] = (rec, oid)
            out = self._push(updates + release_with + list(piggyback))
            if piggyback and not out.ok:
                refused = [u for u in piggyback if _refused_itself(out.statuses.get(u.ref, ""))]
                piggyback = ()
                if refused:  # a renewal failed the atomic push: the same acquire again, without them
                    self._undo_partial(attempts)
                    continue
            if release_with:
                if out.ok:
                    self._forget(replace)
                else:  # refused as a whole: the old lease stays; release it on its own, then acquire as usual
                    release_with = []
                    self._release_quietly(replace)
                    if not any(st.startswith("rejected") for st in out.statuses.values()):
                        self._undo_partial(attempts)
                        continue
            if out.ok:
                self._remember(rec, oid, oid)
                return Acquired(rec.lease_id, rec, oid, tuple(cleared), bool(piggyback))
            last_refusal = out
            if any("hook declined" in st for st in out.statuses.values()):
                self._undo_partial(attempts)
                said = [ln for ln in out.server if ln not in out.message][:5]
                raise GitLeaseError(
                    f"the store refused lease {rec.lease_id}: {out.message or 'a server hook declined'}"
                    + "".join(f"; remote: {ln}" for ln in said),
                    server=out.server,
                )
            snap = self.snapshot(use_cache=False)
            landed = self._landed_after_all(snap, attempts)
            if landed is not None:
                return Acquired(landed[0].lease_id, landed[0], landed[1], tuple(cleared))
            self._undo_partial(attempts, snap)
            self._clear_blockers(paths, snap, set(attempts), cleared)
            # nothing blocks any more (released meanwhile, or cleared): try again with a new version
        raise GitLeaseError(
            f"could not acquire {' '.join(paths)}: "
            f"{(last_refusal.message if last_refusal else '') or 'the store refused the update'}"
        )

    def _owner(self, holder_pid: int) -> Owner:
        return Owner(
            task_id=self.settings.task,
            agent_id=self.settings.agent,
            host=os.uname().nodename,
            pid=holder_pid,
            pid_start=process_start(holder_pid) if holder_pid else None,
            key=self.signer.public_key,
        )

    def _record(
        self, paths: tuple[str, ...], ttl: int, holder_pid: int, renew_every: int | None, workspace: str | None
    ) -> Record:
        now = self.clock.now()
        return records.new_record(
            lease_id=records.new_lease_id(now),
            repo=self._repo_name(),
            paths=paths,
            workspace_id=workspace or self._workspace(),
            owner=self._owner(holder_pid),
            now=now,
            ttl=ttl,
            renew_every=renew_every,
        )

    def _check_size(
        self, paths: tuple[str, ...], ttl: int, holder_pid: int, renew_every: int | None, workspace: str | None
    ) -> None:
        """Refuse, before any push, a lease whose record (any version of it) readers would refuse."""
        if len(paths) > records.MAX_PATHS:
            problem: str | None = f"{len(paths)} paths, over the limit of {records.MAX_PATHS} paths per lease"
        else:
            problem = records.size_problem(self._record(paths, ttl, holder_pid, renew_every, workspace))
        if problem:
            raise UsageError(
                f"scope too large for one lease ({len(paths)} paths): {problem}; lease coarser scopes "
                "(folders instead of files: git lease plan --granularity dir)",
                paths=len(paths),
                limitBytes=records.MAX_RECORD_BYTES,
                limitPaths=records.MAX_PATHS,
            )

    def _grant(
        self, paths: tuple[str, ...], ttl: int, holder_pid: int, renew_every: int | None, workspace: str | None
    ) -> tuple[Record, str, list[RefUpdate]]:
        """A new lease's version 1 (a unique commit) and the creates of its id ref and scope refs."""
        rec = self._record(paths, ttl, holder_pid, renew_every, workspace)
        oid = self._write_version(rec, None, "acquire")
        updates = [RefUpdate(id_ref(rec.lease_id), oid, None)] + [RefUpdate(scope_ref(p), oid, None) for p in paths]
        return rec, oid, updates

    def _release_with(self, replace: str | None, paths: tuple[str, ...]) -> list[RefUpdate]:
        """The deletes releasing ``replace`` in the acquire's own push; none (released first, on its own) when
        its scope overlaps the new one (git refuses a delete and an overlapping create in one push)."""
        if replace is None:
            return []
        h = self._held(replace)
        if h.pending:
            h = self._settle_pending(h)
        if scopes.sets_overlap(h.paths, paths):
            self.release(replace)
            return []
        return [RefUpdate(id_ref(replace), None, h.current)] + [RefUpdate(scope_ref(p), None, h.grant) for p in h.paths]

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

    def _landed_after_all(self, snap: Snapshot, attempts: dict[str, tuple[Record, str]]) -> tuple[Record, str] | None:
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
                self._remember(arec, aoid, aoid)
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

    def _clear(self, view: LeaseView) -> bool:
        """CAS-delete exactly the refs of an expired lease, at the values we read, with its audit entry."""
        if not view.refs():
            return False
        exp = view.expires()
        reason = f"expired={int(self.clock.now() - exp)}s" if exp is not None else "expired"
        return self.reclaim(view, action="clear", rule="expired", reason=reason).ok

    # ------------------------------------------------------------------ reclaim (audited)
    @functools.cached_property
    def audit(self) -> AuditLog:
        """This writer's audit log (``refs/leases-audit/<agent>``: one ref per writer, no contention)."""
        from gitlease.service.audit import AuditLog, writer_id

        return AuditLog(self.store, self.objects, self.signer, self.clock, writer=writer_id(self.settings.agent))

    def reclaim(self, view: LeaseView, *, action: str, rule: str, reason: str, by: str | None = None) -> Appended:
        """Delete exactly ``view``'s refs at the values read AND append the audit entry (who, which lease,
        which version, why, when) in ONE atomic transaction: never a reclaim without its record. A lease that
        changed since it was read (renewed, released, reclaimed by another) makes it all fail: ``changed``."""
        self.require_store()
        rec = view.record
        fields = {
            "action": action,
            "rule": rule,
            "reason": reason,
            "by": by or self.settings.agent,
            "leaseId": view.lease_id,
            "version": rec.version if rec else None,
            "oid": view.current_oid,
            "grant": view.grant_oid,
            "refs": view.refs(),
            "paths": list(view.paths),
            "owner": rec.owner.to_json() if rec else None,
            "expiresAt": rec.expires_at if rec else None,
            "valid": view.valid,
        }
        deletes = [RefUpdate(ref, None, oid) for ref, oid in sorted(view.refs().items())]
        return self.audit.append_with(deletes, fields, pointer=view.current_oid or view.grant_oid)

    def _resolve(self, updates: Sequence[RefUpdate], out: Outcome, what: str = "write") -> Outcome:
        """After an unclear outcome, re-read and compare with what we meant to write (a delete landed when
        the ref is absent). Never retry blindly."""
        try:
            refs = self.store.list_refs()
        except RemoteUnavailable as exc:
            raise RemoteUnavailable(
                f"outcome of the {what} unknown: {out.message or 'no answer'}; and the store "
                f"cannot be re-read ({exc}); nothing is assumed"
            ) from None
        landed = all(refs.get(u.ref) == u.new for u in updates)
        return Outcome(
            ok=landed,
            statuses={u.ref: "ok" if refs.get(u.ref) == u.new else "rejected:not landed" for u in updates},
            message=out.message,
        )

    def _remember(self, rec: Record, oid: str, grant: str) -> None:
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
            )

    # --------------------------------------------------------------------------- renew
    def _held(self, lease_id: str) -> Held:
        h = self.held.load().get(lease_id)
        if h is None:
            raise NotHeld(f"lease {lease_id} is not held by this worktree ({self.repo.cwd})")
        if h.store != self.store.name:
            raise NotHeld(f"lease {lease_id} is held on store {h.store!r}, not {self.store.name!r}")
        return h

    def renew(
        self, lease_id: str, *, ttl: int | None = None, progress: str | None = None, extra_refspecs: Sequence[str] = ()
    ) -> Renewed:
        """A new version on the id ref, CAS-pinned to the one this worktree wrote. ``extra_refspecs`` (a remote
        store only) are pushed in the same atomic push: see ``push_fenced``. Renewals of one lease in one
        worktree (a heartbeat and a fenced push of its command) take turns, so they never race each other."""
        self.require_store()
        with self._renewing(lease_id):
            return self._renew(lease_id, ttl=ttl, progress=progress, extra_refspecs=extra_refspecs)

    @contextlib.contextmanager
    def _renewing(self, lease_id: str) -> Iterator[None]:
        """A per-lease lock file in the worktree's state folder, waited for at most the store timeout."""
        os.makedirs(self.held.folder, exist_ok=True)
        with open(os.path.join(self.held.folder, f"renew-{lease_id}.lock"), "a+") as fh:
            give_up = self.clock.monotonic() + float(self.store.timeout)
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.clock.monotonic() >= give_up:
                        raise RemoteUnavailable(
                            f"another renewal of {lease_id} in this worktree did not finish in time"
                        ) from None
                    self.clock.sleep(0.02)
            yield

    def _renew(self, lease_id: str, *, ttl: int | None, progress: str | None, extra_refspecs: Sequence[str]) -> Renewed:
        h = self._held(lease_id)
        if h.pending:
            h = self._settle_pending(h)
        current = records.parse(h.record.encode("utf-8"))
        self._require_owner_key(current, "renew")
        now = self.clock.now()
        if now >= current.expires:
            self._forget(lease_id)
            raise LeaseLost(
                f"lease {lease_id} expired at {current.expires_at}; renewal after expiry is refused "
                "(stop writing and acquire again)"
            )
        prog = next_progress(progress, current.progress, now) if progress is not None else None
        nxt = current.next_version(now, ttl=ttl, progress=prog)
        records.validate(nxt)
        oid = self._write_version(nxt, h.current, "renew")
        update = RefUpdate(id_ref(lease_id), oid, h.current)
        out = self.store.apply([update], extra_refspecs=extra_refspecs)
        if out.ambiguous:
            try:
                out = self._resolve([update], out)
            except RemoteUnavailable:
                with self.held.locked() as held:
                    if lease_id in held:
                        held[lease_id].pending = oid
                        held[lease_id].pending_record = nxt.canonical().decode("utf-8")
                raise
        if out.ok:
            self._update_held(lease_id, nxt, oid)
            return Renewed(lease_id, nxt, oid)
        if extra_refspecs and self.store.list_refs().get(update.ref) == h.current:
            raise PushRejected(
                f"push rejected, nothing landed: {_branch_refusal(out, update.ref)}; the lease "
                f"{lease_id} is still held (not renewed)",
                statuses=out.statuses,
                server=out.server,
            )
        self._forget(lease_id)
        raise LeaseLost(
            f"lease lost or replaced: {lease_id} is no longer at the version this worktree wrote (stop writing)"
        )

    def push_fenced(self, lease_id: str, remote: str, refspecs: Sequence[str], *, ttl: int | None = None) -> Renewed:
        """Push ``refspecs`` (branches; never ``+``) and renew ``lease_id`` in ONE atomic push to the lease
        store, so the branches land only if the lease is still at the version this worktree wrote: a holder
        whose lease was taken over cannot land its commits (docs/protocol.md, "Fenced pushes").

        Only when the lease store is the remote pushed to; anything else is refused (UsageError). Paths are not
        checked here: ``gitlease.enforce.push.fenced_push`` checks them first, and is what callers use."""
        self.check_fence(remote)
        for spec in refspecs:
            if spec.startswith("+") or spec.startswith(":") or ":" not in spec:
                raise UsageError(f"refspec {spec!r}: a fenced push takes src:dst, without '+' and no deletes")
        return self.renew(lease_id, ttl=ttl, extra_refspecs=list(refspecs))

    def check_fence(self, remote: str) -> None:
        """UsageError unless a fenced push to ``remote`` can carry this store's lease renewal."""
        self.require_store()
        if not isinstance(self.store, RemoteStore):
            raise UsageError(
                "a fenced push needs the lease store on the remote you push to, but leases are "
                "in this repository's own refs (no lease.remote); set lease.remote to that remote, "
                "or use 'git lease renew' and then 'git push' (not fenced)"
            )
        if not same_remote(self.repo.cwd, self.store.remote, remote):
            raise UsageError(
                f"a fenced push needs the lease store and the branch on one remote, but leases are "
                f"on {self.store.remote!r} and the branch goes to {remote!r}; push to "
                f"{self.store.remote!r}, or use 'git lease renew' and then 'git push' (not fenced)"
            )

    def _settle_pending(self, h: Held) -> Held:
        refs = self.store.list_refs()
        now_at = refs.get(id_ref(h.lease_id))
        with self.held.locked() as held:
            cur = held.get(h.lease_id)
            if cur is None:
                raise NotHeld(f"lease {h.lease_id} is not held by this worktree")
            if now_at == cur.pending and cur.pending_record:
                cur.current, cur.record = cur.pending, cur.pending_record
                rec = records.parse(cur.record.encode("utf-8"))
                cur.version, cur.expires_at = rec.version, rec.expires_at
            cur.pending = cur.pending_record = None
            return Held(**vars(cur))

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
                h.pending = h.pending_record = None

    def _forget(self, lease_id: str) -> None:
        with self.held.locked() as held:
            held.pop(lease_id, None)

    # ------------------------------------------------------------------------- release
    def release(self, lease_id: str, *, piggyback: Sequence[RefUpdate] = ()) -> bool:
        """Delete the lease's refs at the values this worktree wrote. ``piggyback``: other updates sent in the
        same atomic push (see ``acquire``); True when they landed. Waits for a renewal of the same lease in
        this worktree (the renewal agent's, a heartbeat's) to finish first."""
        self.require_store()
        with self._renewing(lease_id):
            return self._release(lease_id, list(piggyback))

    def _release(self, lease_id: str, piggyback: list[RefUpdate]) -> bool:
        h = self._held(lease_id)
        self._require_owner_key(records.parse(h.record.encode("utf-8")), "release")
        if h.pending:
            h = self._settle_pending(h)
        updates = [RefUpdate(id_ref(lease_id), None, h.current)] + [
            RefUpdate(scope_ref(p), None, h.grant) for p in h.paths
        ]
        out = self.store.apply(updates + piggyback)
        if out.ambiguous:
            out = self._resolve(updates + piggyback, out, what="release")
        if piggyback and not out.ok:
            if any(_refused_itself(out.statuses.get(u.ref, "")) for u in piggyback):
                return self._release(lease_id, [])  # a renewal failed the atomic push: release on its own
            piggyback = []
        if out.ok:
            self._forget(lease_id)
            return bool(piggyback)
        refs = self.store.list_refs()
        ours = [u for u in updates if refs.get(u.ref) == u.old]
        if not ours:
            self._forget(lease_id)
            raise LeaseLost(f"lease lost or replaced: {lease_id} was already gone from the store")
        raise LeaseLost(f"lease lost or replaced: {lease_id} changed on the store; nothing was released")

    # ---------------------------------------------------------------------------- read
    def snapshot(self, *, use_cache: bool = True) -> Snapshot:
        """Every lease on the store, each verified (signatures, trust, owner binding, replay: trust.py).
        When the store cannot be read and ``use_cache``, the last listing fetched (its objects are local) is
        returned, marked stale with its age."""
        from gitlease.identity.trust import Seen

        cache = _RefsCache(self.repo.shared_dir(), self.store.name)
        seen = Seen(self.repo.shared_dir(), self.store.name)
        before = seen.load()  # before listing: see Seen
        try:
            refs = self.store.list_refs()
            fetched_at = self.clock.now()
            blobs = self.store.read(set(refs.values()))
        except RemoteUnavailable as exc:
            if not use_cache:
                raise
            cached = cache.load()
            if cached is None:
                raise RemoteUnavailable(f"{exc}; and no earlier state is known") from None
            refs, fetched_at = cached
            blobs = self.store.read(set(refs.values()), fetch=False)
            trust = self.trust(offline=True)
            views = build_views(refs, blobs)
            self._verify(views, blobs, trust, before)
            return Snapshot(
                views,
                fetched_at,
                stale=True,
                error=str(exc),
                trust=trust.describe(),
                signed_store=trust.signed,
                foreign=foreign_refs(refs),
            )
        cache.save(refs, fetched_at)
        trust = self.trust()
        views = build_views(refs, blobs)
        self._verify(views, blobs, trust, before)
        seen.update(
            before,
            [
                (v.lease_id, v.record.version, v.current_oid, v.record.expires)
                for v in views
                if v.valid and v.record is not None and v.current_oid
            ],
            {v.lease_id for v in views},
            self.clock.now(),
        )
        return Snapshot(
            views, fetched_at, trust=trust.describe(), signed_store=trust.signed, foreign=foreign_refs(refs)
        )

    def _verify(
        self, views: list[LeaseView], blobs: dict[str, Blob], trust: Trust, before: dict[str, dict[str, object]]
    ) -> None:
        """Check each lease's whole history (trust.Trust.check_chain) and this machine's replay memory; every
        problem makes the view invalid, so its scope stays blocked (fail closed)."""
        from gitlease.identity.trust import MEMO

        now = self.clock.now()
        heads = {v.current_oid or v.grant_oid for v in views if v.record is not None}
        heads.discard(None)
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
        known = {
            v.current_oid or v.grant_oid: v.record
            for v in views
            if v.record is not None and not v.problems and (v.current_oid or v.grant_oid)
        }
        for v in views:
            head = v.current_oid or v.grant_oid
            if v.record is None or head is None:
                v.verification = INVALID
                continue
            chk = trust.check_chain(
                v.lease_id, head, v.grant_oid if v.current_oid else None, parents, blobs, now, known, memo=MEMO
            )
            v.chain, v.verification, v.signer = chk, chk.status, chk.signer
            v.problems.extend(p for p in chk.problems if p not in v.problems)
            if v.current_oid:
                from gitlease.identity.trust import Seen

                replay = Seen.replay_problem(before, v.lease_id, v.record.version, v.current_oid)
                if replay:
                    v.problems.append(replay)

    def status(self) -> Snapshot:
        return self.snapshot()

    def can_start(self, raw_scopes: Sequence[str]) -> tuple[tuple[str, ...], list[LeaseView], Snapshot]:
        paths = scopes.normalize_all(raw_scopes)
        snap = self.snapshot(use_cache=False)
        return paths, snap.blocking(paths, self.clock.now(), self.settings.skew), snap

    def show(self, lease_id: str) -> tuple[LeaseView | None, list[HistoryEntry], Snapshot]:
        snap = self.snapshot()
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
                rec, problem = _parse_blob(b)
                entries.append(HistoryEntry(oid, rec, problem, b.signature is not None))
        return view, entries, snap

    def held_here(self) -> dict[str, Held]:
        return self.held.load()


# ------------------------------------------------------------------------- view building


def _refused_itself(status: str) -> bool:
    """A ref of an atomic push refused on its own account (not only because another ref failed the push)."""
    return status.startswith("rejected") and "atomic push failed" not in status


def _branch_refusal(out: Outcome, lease_ref: str) -> str:
    """Why the non-lease refs of a fenced push were refused, from its porcelain statuses."""
    why = [
        f"{ref} {status.partition(':')[2] or status}"
        for ref, status in sorted(out.statuses.items())
        if ref != lease_ref and status.startswith("rejected")
    ]
    return "; ".join(why) or out.message or "the remote refused the push"


def _strip_userinfo(url: str) -> str:
    if "://" in url:
        scheme, rest = url.split("://", 1)
        host, sep, path = rest.partition("/")
        return f"{scheme}://{host.rpartition('@')[2]}{sep}{path}"
    return url


class _RefsCache:
    """The last listing of a store, so reads still answer (marked stale) when the store is unreachable."""

    def __init__(self, folder: str, store_name: str) -> None:
        import hashlib

        self.path = os.path.join(folder, "cache", hashlib.sha1(store_name.encode()).hexdigest()[:16] + ".json")

    def save(self, refs: dict[str, str], fetched_at: float) -> None:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            write_json(self.path, {"fetchedAt": fetched_at, "refs": refs})
        except OSError:
            pass  # a cache that cannot be written only costs freshness

    def load(self) -> tuple[dict[str, str], float] | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                doc = json.load(fh)
            return {str(k): str(v) for k, v in doc["refs"].items()}, float(doc["fetchedAt"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


__all__ = [
    "LeaseService",
    "LeaseView",
    "Snapshot",
    "Acquired",
    "Renewed",
    "HistoryEntry",
    "id_ref",
    "scope_ref",
    "build_views",
    "held_error",
]
