"""The lease service: acquire, renew, release, status, show, can-start.

It owns the protocol (docs/protocol.md): which refs a lease has, how each change is one compare-and-swap
transaction, how ambiguous outcomes are resolved by re-reading, and when an expired blocker may be cleared.
It prints nothing and never exits; the CLI renders what it returns.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from gitlease.core import gitcmd
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
    UntrustedWriter,
    UsageError,
)
from gitlease.core.fsutil import LockBusy, lock_file, write_json
from gitlease.core.objects import ObjectWriter, ident_for
from gitlease.core.procs import process_start
from gitlease.core.progress import next_progress
from gitlease.core.record import Owner, Record
from gitlease.core.refnames import id_ref, path_of_scope_ref, scope_ref, task_ref
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
from gitlease.service.legacy import refuse_legacy_overlap
from gitlease.service.verdict import doctor_gate
from gitlease.service.views import (
    HALF_DELETED,
    INVALID,
    HistoryEntry,
    LeaseView,
    Parsed,
    Snapshot,
    build_views,
    foreign_refs,
    held_error,
    parse_blob,
    restrict_refs,
)

if TYPE_CHECKING:  # verification and the audit log are imported where used: not on every command's start-up
    from gitlease.identity.replay import Memory
    from gitlease.identity.trust import Trust
    from gitlease.service.audit import Appended, AuditLog
    from gitlease.service.recordcache import RecordCache
    from gitlease.service.resize import Resized


ACQUIRE_ATTEMPTS = 4
REMNANT_LOOKS = 5  # reads of the store while only other writers' remnants block (_wait_out_remnants)


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


@dataclass
class PreparedRenewal:
    """A renewal ready to push (``LeaseService.prepare_renewal``): the id-ref update and the new record; and,
    when it took one, the lease's renew lock (held until ``settle_renewal`` or ``close``)."""

    lease_id: str
    update: RefUpdate
    record: Record
    lock: IO | None = None

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()  # closing the file drops the flock
            self.lock = None


class Busy(GitLeaseError):
    """The lease is being renewed or released by its holder right now: not renewed this time."""

    kind = "busy"


@dataclass(frozen=True)
class Listing:
    """The store's refs from one ``ls-remote`` that also answered the remote's HEAD (``LeaseService.listing``),
    with the replay memory as it was before that listing began: what a snapshot of it is judged against."""

    refs: dict[str, str]
    head: str | None  # the commit of the remote's HEAD, or None
    before: Memory


@dataclass(frozen=True)
class Released:
    """What ``release`` did (always true as a value). ``already``: the lease was gone before this call (released
    earlier, or reclaimed), and ``note`` says how; ``piggybacked``: the ``piggyback`` updates landed in the same
    push; ``audit``: the commit of the audit entry that records the release."""

    lease_id: str
    already: bool = False
    piggybacked: bool = False
    audit: str | None = None
    note: str = ""


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
        self.warnings: list[str] = []  # said once per service, not printed (verdict.doctor_gate)
        if self.store.capabilities.network and self.store.on_applied is None:
            # what lands is written into the last listing the hooks and the edit guard read (no network there):
            # a lease released here stops blocking at once, a new one blocks at once
            self.store.on_applied = _RefsCache(repo.shared_dir(), self.store.name).patch

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
            required=self.signer.configured,  # known without loading the key (signer.KeySigner)
            offline=offline,
        )
        if not offline:
            self._trust = trust
        return trust

    def _needs_trust_file(self) -> bool:
        """Whether the next read of the trust file will ask the store (its default branch's HEAD): not once
        read by this service, nor when the trust file is a local path."""
        return self._trust is None and not os.path.isabs(os.path.expanduser(self.settings.allowed_signers))

    def check_writer(self) -> None:
        """Refuse (UntrustedWriter, exit 5) to write what every reader would report INVALID: on a store whose
        trust file does not trust this client's key (or its lack of one) for its agent id, a lease blocks its
        scope until an admin clears it. Judged by the trust file this clone last read (no network when that
        says yes); a "no" is confirmed by reading the trust file again (the key may have been added since).
        Unsigned and never having read a trust file: nothing to judge, nothing is read."""
        from gitlease.core.fsutil import cache_path

        key = self.signer.public_key
        path = cache_path(self.repo.shared_dir(), "trust", self.store.name)
        cached = os.path.exists(path)
        if key is None and not os.path.isabs(os.path.expanduser(self.settings.allowed_signers)):
            if not cached or _unsigned_cache(path):
                return  # unsigned, and no trust file known: nothing to judge (and no verification code loaded)
        from gitlease.identity.trust import TrustCache, load_trust

        def fresh() -> Trust:
            return load_trust(
                self.store, self.settings.allowed_signers, cache_dir=self.repo.shared_dir(), required=False
            )

        cache = TrustCache(self.repo.shared_dir(), self.store.name)
        trust = self._trust or (cache.load(label=False) if cached else None)
        if os.path.isabs(os.path.expanduser(self.settings.allowed_signers)) or trust is None:
            trust = fresh()
        now = self.clock.now()
        problem = trust.writer_problem(self.settings.agent, key, now)
        if problem and trust is not self._trust:
            try:
                trust = fresh()
            except RemoteUnavailable:
                pass  # the store is unreachable: the write fails there anyway; judge by what was read
            else:
                problem = trust.writer_problem(self.settings.agent, key, now)
        if problem:
            raise UntrustedWriter(
                f"{problem}: every reader would report this lease INVALID and its scope would stay blocked "
                "until an admin clears it; nothing was written",
                agent=self.settings.agent,
                key=self.signer.fingerprint,
                trust=trust.source,
            )

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

    def require_trusted(self, action: str) -> str:
        """This agent's id, when its key is trusted for it (namespace ``gitlease``), for what an ordinary agent
        may do to another's lease (a same-host dead-holder reclaim); or Forbidden. Unsigned stores: anyone."""
        trust = self.trust()
        key = self.signer.public_key
        agent = self.settings.agent
        if key is None:
            if trust.signed:
                raise Forbidden(
                    f"{action} needs a key trusted for agent {agent!r}: this store is signed ({trust.source}) "
                    "and lease.signingKey is not set"
                )
            return agent
        if not trust.trusted_for(agent, key, self.clock.now()):
            raise Forbidden(
                f"{action} needs a key trusted for agent {agent!r} (or a {ADMIN_NAMESPACE} key): key "
                f"{self.signer.fingerprint} is not, in {trust.source}"
            )
        return agent

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
        """Writes, and the reads a user acts on (status, show, can-start, plan, log), need a store chosen on
        purpose: with no ``lease.remote`` in a repository that has remotes, a lease written to this clone's own
        refs would exclude nobody, and a read of them would answer "free" while the scope is held on the shared
        store (UsageError, exit 2)."""
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
        self._check_size(paths, ttl, holder_pid, renew_every, workspace, stop_after)
        self.check_writer()
        doctor_gate(self)  # no passing doctor verdict for this server: a warning, or refused (verdict.py)
        release_with = self._release_with(replace, paths)
        cleared: list[str] = []
        last_refusal: Outcome | None = None
        attempts: dict[str, tuple[Record, str]] = {}  # lease id -> (record, oid) of each push made
        for _attempt in range(ACQUIRE_ATTEMPTS):
            rec, oid, updates = self._grant(paths, ttl, holder_pid, renew_every, workspace, stop_after, task)
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
                said = [ln for ln in out.server if ln not in out.message][:5]
                raise GitLeaseError(
                    f"the store refused lease {rec.lease_id}: {out.message or 'a server hook declined'}"
                    + "".join(f"; remote: {ln}" for ln in said),
                    server=out.server,
                )
            # only what bears on the scope, and our attempts (their remnants are found by their ids and grants)
            snap = self.snapshot(use_cache=False, paths=paths, keep=attempts)
            landed = self._landed_after_all(snap, attempts, task)
            if landed is not None:
                return Acquired(landed[0].lease_id, landed[0], landed[1], tuple(cleared))
            self._undo_partial(attempts, snap)
            snap = self._wait_out_remnants(paths, snap, set(attempts))
            self._clear_blockers(paths, snap, set(attempts), cleared)
            # nothing blocks any more (released meanwhile, or cleared): try again with a new version
        if last_refusal is not None:  # every attempt lost a race: refuse by what holds the scope now, if anything
            snap = self._wait_out_remnants(paths, self.snapshot(use_cache=False, paths=paths), set(attempts))
            live = self._live_blockers(paths, snap, attempts)
            if live:
                raise held_error(paths, live, self.clock.now(), self.settings.skew)
        raise GitLeaseError(
            f"could not acquire {' '.join(paths)}: "
            f"{(last_refusal.message if last_refusal else '') or 'the store refused the update'}"
        )

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

    def _check_size(
        self,
        paths: tuple[str, ...],
        ttl: int,
        holder_pid: int,
        renew_every: int | None,
        workspace: str | None,
        stop_after: int | None = None,
    ) -> None:
        """Refuse, before any push, a lease whose record (any version of it) readers would refuse, or whose
        release or reclaim the audit log could not record."""
        if len(paths) > records.MAX_PATHS:
            problem: str | None = f"{len(paths)} paths, over the limit of {records.MAX_PATHS} paths per lease"
        else:
            rec = self._record(paths, ttl, holder_pid, renew_every, workspace, stop_after)
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

    def _grant(
        self,
        paths: tuple[str, ...],
        ttl: int,
        holder_pid: int,
        renew_every: int | None,
        workspace: str | None,
        stop_after: int | None = None,
        task: str | None = None,
    ) -> tuple[Record, str, list[RefUpdate]]:
        """A new lease's version 1 (a unique commit) and the creates of its id ref and scope refs (and of its
        task's claim, ``task``)."""
        rec = self._record(paths, ttl, holder_pid, renew_every, workspace, stop_after, task)
        oid = self._write_version(rec, None, "acquire")
        updates = [RefUpdate(id_ref(rec.lease_id), oid, None)] + [RefUpdate(scope_ref(p), oid, None) for p in paths]
        if task:
            updates.append(RefUpdate(task_ref(task), oid, None))
        return rec, oid, updates

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
        from gitlease.core.fsutil import cache_path
        from gitlease.service.audit import AuditLog, writer_id

        writer = writer_id(self.settings.agent)
        return AuditLog(
            self.store,
            self.objects,
            self.signer,
            self.clock,
            writer=writer,
            head_cache=cache_path(self.repo.shared_dir(), f"audit-{writer}", self.store.name),
        )

    def reclaim(self, view: LeaseView, *, action: str, rule: str, reason: str, by: str | None = None) -> Appended:
        """Delete exactly ``view``'s refs at the values read AND append the audit entry (who, which lease,
        which version, why, when) in ONE atomic transaction: never a reclaim without its record. A lease that
        changed since it was read (renewed, released, reclaimed by another) makes it all fail: ``changed``."""
        self.require_store()
        fields = self._reclaim_fields(view, action=action, rule=rule, reason=reason, by=by)
        deletes = [RefUpdate(ref, None, oid) for ref, oid in sorted(view.refs().items())]
        return self.audit.append_with(deletes, fields, pointer=view.current_oid or view.grant_oid)

    def reclaim_many(self, items: Sequence[tuple[LeaseView, str, str, str, str | None]]) -> tuple[list[Appended], int]:
        """``reclaim`` of many leases ((view, action, rule, reason, by) each) in as few pushes as git allows:
        one atomic push with all their deletes and audit entries; a lease that changed since it was read is
        ``changed`` and the others go again without it (``AuditLog.append_many``). Returns one result per item
        and the number of pushes."""
        self.require_store()
        batch = []
        for view, action, rule, reason, by in items:
            fields = self._reclaim_fields(view, action=action, rule=rule, reason=reason, by=by)
            deletes = [RefUpdate(ref, None, oid) for ref, oid in sorted(view.refs().items())]
            batch.append((deletes, fields, view.current_oid or view.grant_oid))
        return self.audit.append_many(batch)

    def _reclaim_fields(
        self, view: LeaseView, *, action: str, rule: str, reason: str, by: str | None
    ) -> dict[str, object]:
        rec = view.record
        return {
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

    def _resolve(self, updates: Sequence[RefUpdate], out: Outcome, what: str = "write") -> Outcome:
        """After an unclear outcome, re-read and compare with what we meant to write (a delete landed when
        the ref is absent). Never retry blindly."""
        return self._settled(updates, out, self._reread(out, what))

    def _reread(self, out: Outcome, what: str) -> dict[str, str]:
        """The store's refs after an unclear outcome; RemoteUnavailable (nothing assumed) when it cannot be read."""
        out.check_reached()
        try:
            return self.store.list_refs()
        except RemoteUnavailable as exc:
            raise RemoteUnavailable(
                f"outcome of the {what} unknown: {out.message or 'no answer'}; and the store "
                f"cannot be re-read ({exc}); nothing is assumed"
            ) from None

    @staticmethod
    def _settled(updates: Sequence[RefUpdate], out: Outcome, refs: dict[str, str]) -> Outcome:
        landed = all(refs.get(u.ref) == u.new for u in updates)
        return Outcome(
            ok=landed,
            statuses={u.ref: "ok" if refs.get(u.ref) == u.new else "rejected:not landed" for u in updates},
            message=out.message,
        )

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

    # --------------------------------------------------------------------------- renew
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

    # One renewal in two steps, for whoever renews: ``renew`` above, the batch of the renewal agent
    # (gitlease/liveness/batch.py: many leases in one push, or riding in an acquire's or release's push).
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
        fh = None
        if lock:
            try:
                fh = lock_file(self._renew_lock_path(lease_id), wait=0)
            except LockBusy:
                raise Busy(f"lease {lease_id} is being renewed or released by its holder; skipped this time") from None
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

    # ------------------------------------------------------------------------- release
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
        h = self.held_lease(lease_id)
        rec = records.parse(h.record.encode("utf-8"))
        self._require_owner_key(rec, "release")
        if h.pending:
            h = self._settle_pending(h)
            rec = records.parse(h.record.encode("utf-8"))
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
                f"it expired: git lease log --lease {lease_id})"
            )
        raise LeaseLost(f"lease lost or replaced: {lease_id} changed on the store; nothing was released")

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

    # ---------------------------------------------------------------------------- read
    def snapshot(
        self,
        *,
        use_cache: bool = True,
        paths: Sequence[str] | None = None,
        keep: Iterable[str] = (),
        listing: Listing | None = None,
    ) -> Snapshot:
        """Every lease on the store, each verified (signatures, trust, owner binding, replay: trust.py).
        When the store cannot be read and ``use_cache``, the last listing fetched (its objects are local) is
        returned, marked stale with its age.

        ``paths``: only the leases that bear on these (normalised) paths, and those named in ``keep``: the same
        views of them, and the same answers from ``blocking``/``overlapping`` on ``paths``, as the full read
        (views.restrict_refs), without building the others (for the hooks and ``can-start``; the snapshot's
        ``restricted_to`` says so). Such a read answers from the store or fails: never from the last listing.

        ``listing``: the store as the caller just listed it (``listing()``), read instead of listing again."""
        from gitlease.identity.replay import Seen
        from gitlease.service.recordcache import RecordCache

        cache = _RefsCache(self.repo.shared_dir(), self.store.name)
        seen = Seen(self.repo.shared_dir(), self.store.name)
        before = listing.before if listing is not None else seen.load()  # before listing: see Seen
        kept = RecordCache(self.repo.shared_dir())
        present: set[str] | None = None
        try:
            try:
                refs = listing.refs if listing is not None else self.store.list_refs(head=self._needs_trust_file())
                fetched_at = self.clock.now()
                head = self.store.listed_head()  # the trust file's commit, fetched with the lease objects
                used = refs
                if paths is not None:
                    used, present = self._restrict(kept, refs, paths, keep)
                blobs, parsed = self._read_records(kept, set(used.values()), set(refs.values()), also=head)
            except RemoteUnavailable as exc:
                if not use_cache or paths is not None:
                    raise
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
        finally:
            kept.close()
        if paths is None:  # a restricted read leaves most objects unfetched: not a listing to answer from later
            cache.save(refs, fetched_at)
        trust = self.trust()
        views = build_views(used, blobs, parsed)
        self._verify(views, blobs, trust, before)
        seen.update(
            before,
            [
                (v.lease_id, v.record.version, v.current_oid, v.record.expires)
                for v in views
                if v.valid and v.record is not None and v.current_oid
            ],
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

    def listing(self) -> Listing:
        """The store's refs and its HEAD by one ``ls-remote``, for a caller that needs HEAD before it reads the
        store (the pre-push hook, when the push goes to the lease store) and then ``snapshot(listing=...)``.
        The replay memory is loaded first, as ``snapshot`` does: see Seen."""
        from gitlease.identity.replay import Seen

        before = Seen(self.repo.shared_dir(), self.store.name).load()
        refs = self.store.list_refs(head=True)
        return Listing(refs, self.store.listed_head(), before)

    def _restrict(
        self, kept: RecordCache, refs: dict[str, str], paths: Sequence[str], keep: Iterable[str]
    ) -> tuple[dict[str, str], set[str]]:
        """views.restrict_refs, with each listed commit's lease and paths from the record cache (the commits
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
        self, kept: RecordCache, oids: set[str], listed: set[str], *, also: str | None = None, fetch: bool = True
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
                rec, problem = parse_blob(b)
                entries.append(HistoryEntry(oid, rec, problem, b.signature is not None))
        return view, entries, snap

    def held_here(self) -> dict[str, Held]:
        return self.held.load()


# ------------------------------------------------------------------------- view building


def _adopt_pending(cur: Held) -> None:
    """The pending write found on the store: it is the current version now."""
    assert cur.pending is not None and cur.pending_record is not None
    cur.current, cur.record = cur.pending, cur.pending_record
    rec = records.parse(cur.record.encode("utf-8"))
    cur.version, cur.expires_at = rec.version, rec.expires_at
    cur.paths = list(rec.paths)  # an extend or narrow changes it
    cur.pending = cur.pending_record = None


def _scope_path(ref: str) -> str | None:
    try:
        return path_of_scope_ref(ref)
    except ValueError:
        return None


def _task_refs(h: Held) -> list[str]:
    """The claim ref of the queued task a held lease works on (``acquire(task=...)``), if any."""
    return [task_ref(h.task)] if h.task else []


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

    def patch(self, updates: Sequence[RefUpdate]) -> None:
        """The writes that just landed, applied to the kept listing (when there is one)."""
        got = self.load()
        if got is None:
            return
        refs, fetched_at = got
        for u in updates:
            if u.new is None:
                refs.pop(u.ref, None)
            else:
                refs[u.ref] = u.new
        self.save(refs, fetched_at)

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
    "PreparedRenewal",
    "Busy",
    "Released",
    "Listing",
    "HistoryEntry",
    "id_ref",
    "scope_ref",
    "build_views",
    "held_error",
]
