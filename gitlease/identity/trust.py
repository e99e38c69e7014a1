"""Who is trusted, and whether a lease's history proves it was written by its owner.

* ``load_trust``: the allowed-signers file (OpenSSH format, principals = agent ids) from the store's default
  branch, so that changing who is trusted goes through review (docs/protocol.md, "Trust").
* ``Trust.check_chain``: every version of one lease, newest first along the commits' parents: each version
  signed (SSHSIG, namespace ``gitlease``) over its exact ``lease.json`` bytes, by the key its record names as
  the owner's, trusted for the owner's agent id, and by the same key as version 1 (owner binding); versions
  strictly advance by one from version 1, which must be the grant the scope refs point at.
* ``ChainMemo``: versions already verified, by (trust, commit id), so a read checks only the versions it has
  not seen (a renewal adds one): what a commit id names never changes (its parents, its lease.json and
  lease.sig bytes), so a verdict on it holds as long as the trust file is the same.
* ``Seen``: this machine's memory of the newest version it has seen of each lease, so a ref moved back to an
  older (validly signed) version, or a lease that reappears after it was gone, is reported as a replay.

Pure apart from ``load_trust`` (which reads through the store) and ``Seen``/``TrustCache`` (small JSON files in
the common git dir). ``cryptography`` is only imported by sshsig when a signature is actually checked.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from gitlease.core import gitq
from gitlease.core import record as records
from gitlease.core.cachenames import cache_path
from gitlease.core.clock import parse_iso
from gitlease.core.errors import InvalidRecord, RemoteUnavailable
from gitlease.core.fsutil import locked, write_json
from gitlease.core.sqlitefile import SqliteFile
from gitlease.core.store import Blob, Store
from gitlease.identity import sshsig
from gitlease.identity.signer import ADMIN_NAMESPACE, NAMESPACE

if TYPE_CHECKING:
    import sqlite3

MAX_CHAIN = 100_000  # versions walked per lease; a longer history is reported, not walked
VERIFIED, UNSIGNED, UNTRUSTED, INVALID = "verified", "unsigned", "untrusted", "invalid"


# ------------------------------------------------------------------------------------------- trust file


@dataclass(frozen=True)
class Trust:
    """The trust a reader has. ``signers`` None: no trust file (unsigned mode, or unknown when offline)."""

    signers: tuple[sshsig.AllowedSigner, ...] | None
    source: str  # for people: where the trust file was read, or why there is none
    origins: tuple[str, ...] = ()  # the file each signer came from (its line in ``signers``), where known

    @property
    def signed(self) -> bool:
        return self.signers is not None

    @functools.cached_property
    def identity(self) -> str | None:
        """What a memoised verdict depends on: the trust file's content. None when verdicts also depend on the
        time (a signer with valid-after / valid-before): then nothing is memoised."""
        if any(s.valid_after is not None or s.valid_before is not None for s in self.signers or ()):
            return None
        return hashlib.sha256(repr((self.signers, self.signed)).encode("utf-8")).hexdigest()

    def describe(self) -> str:
        if self.signed:
            return f"signed: trust from {self.source}"
        return f"unsigned: {self.source}"

    # -------------------------------------------------------------------------------- admin
    def admin_principals(self, key: str | None, when: float) -> list[str]:
        """Principals the trust file lets ``key`` use namespace gitlease-admin as (empty: not an admin)."""
        if not self.signed or not key:
            return []
        return sshsig.principals_for(self.signers or (), key, ADMIN_NAMESPACE, when=when)

    def trusted_for(self, agent: str, key: str | None, when: float) -> bool:
        return bool(self.signed and key and sshsig.allowed(self.signers or (), agent, key, NAMESPACE, when=when))

    def writer_problem(self, agent: str, key: str | None, when: float) -> str | None:
        """Why a version written by ``agent`` with ``key`` (None: unsigned) would not verify against this trust
        file, or None. Without a trust file everything a writer signs (or not) is accepted as it is."""
        if not self.signed:
            return None
        if key is None:
            return f"this store is signed ({self.source}) and lease.signingKey is not set"
        if self.trusted_for(agent, key, when):
            return None
        fp = sshsig.fingerprint_of(key)
        names = sshsig.principals_for(self.signers or (), key, NAMESPACE, when=when)
        hint = (
            f"it is trusted as {', '.join(names)}: pass --agent (or set lease.agent) to one of those"
            if names
            else "the trust file has no line for this key"
        )
        return f"key {fp} is not trusted for agent {agent!r} ({self.source}; {hint})"

    # --------------------------------------------------------------------------- versions
    def check_version(self, rec: records.Record, data: bytes, sig: bytes | None, when: float) -> VersionCheck:
        v = rec.version
        if sig is None:
            if rec.owner.key is not None:
                return VersionCheck(v, INVALID, problem=f"v{v} names an owner key but carries no signature")
            if self.signed:
                return VersionCheck(v, INVALID, problem=f"v{v} is unsigned, but this store is signed ({self.source})")
            return VersionCheck(v, UNSIGNED)
        try:
            key = sshsig.verify(sig, data, NAMESPACE)
        except InvalidRecord as exc:
            return VersionCheck(v, INVALID, problem=f"v{v}: {exc}")
        fp = sshsig.fingerprint_of(key)
        if _key_words(rec.owner.key) != key:
            return VersionCheck(
                v,
                INVALID,
                key,
                fp,
                problem=f"v{v} is signed by key {fp}, not by the owner key its record names (forged or replaced)",
            )
        if not self.signed:
            return VersionCheck(v, UNTRUSTED, key, fp)
        if not sshsig.allowed(self.signers or (), rec.owner.agent_id, key, NAMESPACE, when=when):
            return VersionCheck(
                v,
                INVALID,
                key,
                fp,
                problem=f"v{v}: key {fp} is not trusted for agent "
                f"{rec.owner.agent_id!r} (namespace {NAMESPACE}, "
                f"{self.source})",
            )
        return VersionCheck(v, VERIFIED, key, fp, rec.owner.agent_id)

    def check_chain(
        self,
        lease_id: str,
        head: str,
        grant: str | None,
        parents: Mapping[str, Sequence[str]],
        blobs: Mapping[str, Blob],
        when: float,
        known: Mapping[str, records.Record] | None = None,
        memo: ChainMemo | None = None,
    ) -> ChainCheck:
        """Check the history of one lease from ``head`` (its id ref, or the grant) back to version 1.

        ``parents``: commit -> parents (``Store.parents``); ``blobs``: commit -> ``store.Blob``; ``known``:
        records already parsed from those blobs (parsing is most of a reader's time). ``memo``: the walk stops
        at the first commit already verified under this trust; its versions are taken from the memo (the
        history rules are still checked over the whole history), and a history found valid is memoised."""
        out = ChainCheck()
        ident = self.identity if memo is not None else None
        remembered = memo if ident is not None else None  # memo and identity, or neither
        chain, base = _walk(lease_id, head, parents, out, remembered, ident)
        root_oid = base[-1].oid if base else (chain[-1] if chain else None)
        if grant is not None and root_oid is not None and root_oid != grant and not out.problems:
            out.problems.append("the id ref's history does not lead to the grant the scope refs point at")
        fresh, parsed = self._check_versions(chain, blobs, known, when, out)
        new = len(fresh)
        lost = bool(base and new and base[-1].record is None)  # never: a memoised v1 has its record (prefetch)
        if lost:
            out.problems.append("the verified cache has no record of v1: read again")
        # the memoised versions are materialised only where looked at (a read of a long history looks at v1)
        out.versions = _Joined(fresh, base) if base else fresh
        if out.versions and len(parsed) == len(chain) and not lost:
            self._chain_rules(lease_id, out, new if base else None)
        statuses = {h.check.status for h in fresh} | _statuses(base)
        if out.problems or INVALID in statuses or not out.versions:
            out.status = INVALID
        elif statuses == {VERIFIED}:
            out.status = VERIFIED
        elif UNTRUSTED in statuses:
            out.status = UNTRUSTED
        else:
            out.status = UNSIGNED
        root = out.versions[-1] if out.versions else None
        if root is not None:
            out.signer = root.check.fingerprint
            out.principal = root.check.principal
        if remembered is not None and ident is not None and out.status != INVALID and new:
            remembered.remember(ident, lease_id, out.versions, new)
        return out

    def _check_versions(
        self,
        chain: list[str],
        blobs: Mapping[str, Blob],
        known: Mapping[str, records.Record] | None,
        when: float,
        out: ChainCheck,
    ) -> tuple[list[HistoryCheck], list[tuple[str, records.Record]]]:
        """Each version of ``chain`` (newest first) read and its signature checked: (the checks, newest first;
        the records parsed). Problems go to ``out``."""
        parsed: list[tuple[str, records.Record]] = []
        fresh: list[HistoryCheck] = []
        for c in chain:
            blob = blobs.get(c) or Blob(None, None, "record missing")
            data = blob.record
            if data is None:
                out.problems.append(f"version {c[:12]}: {blob.problem or 'record missing'}")
                fresh.append(HistoryCheck(c, None, VersionCheck(None, INVALID, problem="unreadable")))
                continue
            try:
                rec = known[c] if known and c in known else records.parse(data)
            except InvalidRecord as exc:
                out.problems.append(f"version {c[:12]}: {exc}")
                fresh.append(HistoryCheck(c, None, VersionCheck(None, INVALID, problem=str(exc))))
                continue
            check = self.check_version(rec, data, blob.signature, when)
            if blob.problem:
                check = VersionCheck(rec.version, INVALID, check.key, check.fingerprint, problem=blob.problem)
            fresh.append(HistoryCheck(c, rec, check, blob.signature is not None))
            parsed.append((c, rec))
            if check.problem:
                out.problems.append(check.problem)
        return fresh, parsed

    @staticmethod
    def _chain_rules(lease_id: str, out: ChainCheck, new: int | None = None) -> None:
        """Versions strictly advance from 1; what a renewal never changes stays; one key signs them all.
        ``new``: only the first ``new`` versions are not memoised (the rest is a history found valid under this
        trust): the rules are checked for them and where they join the memoised part."""
        if new == 0:
            return  # nothing new over a history already found valid as a whole
        versions = out.versions if new is None else out.versions[:new]
        hist = [(h.oid, h.record) for h in versions]
        root = out.versions[-1].record
        assert root is not None
        root_key = out.versions[-1].check.key
        if new is None and root.version != 1:
            out.problems.append(f"history starts at v{root.version}, not v1")
        numbers = [(oid, rec.version if rec else None) for oid, rec in hist]
        if new is not None:  # where the new part joins the memoised one: by the version it was verified as
            numbers.append((out.versions[new].oid, out.versions[new].check.version))
        for (newer_oid, newer), (_, older) in zip(numbers, numbers[1:]):
            assert newer is not None and older is not None
            if newer != older + 1:
                out.problems.append(
                    f"replay: v{newer} ({newer_oid[:12]}) follows v{older}; versions must advance by one"
                )
        for oid, rec in hist:
            assert rec is not None
            if rec.lease_id != lease_id:
                out.problems.append(f"version {oid[:12]} names lease {rec.lease_id}")
            # the scope may change (extend, narrow: docs/protocol.md); the scope refs are checked against the
            # current version's scope where the views are built
            if (rec.owner, rec.acquired_at, rec.repo, rec.workspace_id) != (
                root.owner,
                root.acquired_at,
                root.repo,
                root.workspace_id,
            ):
                out.problems.append(f"v{rec.version} changes the owner or grant fields of v1")
        for h in out.versions[: len(out.versions) - 1 if new is None else new]:
            if h.check.key is not None and h.check.key != root_key:
                out.problems.append(
                    f"v{h.check.version} is signed by {h.check.fingerprint}, not by the key that "
                    f"signed v1 ({out.versions[-1].check.fingerprint}): owner binding broken"
                )
        # keep the first few, in order, without repeats
        seen: list[str] = []
        for p in out.problems:
            if p not in seen:
                seen.append(p)
        out.problems[:] = seen


class ChainMemo:
    """In-process memory of verified versions: (trust identity, commit id) -> the lease id and the version's
    HistoryCheck, with the commit id of the version before it. Only versions of a history found valid as a
    whole go in, so a hit stands for the whole history below it. Bounded: cleared when full."""

    def __init__(self, limit: int = 200_000, *, persist: bool = False) -> None:
        self.limit = limit
        self._entries: dict[tuple[str, str], tuple[str, _Entry, str | None]] = {}
        self._newest: dict[tuple[str, str], str] = {}  # (trust, lease id) -> its newest verified commit
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.persist = persist  # shared with other processes through a VerifiedCache (``attach``)
        self.disk: VerifiedCache | None = None
        self._loaded: set[tuple[str, str]] = set()  # (trust, lease id) already asked of the disk
        self._pending: list[tuple[str, str, str, str | None, HistoryCheck]] = []

    # ------------------------------------------------------------------ shared with other processes
    def attach(self, path: str) -> None:
        """Share verdicts through the verified cache at ``path`` (a memo made with ``persist``; else nothing)."""
        if not self.persist or (self.disk is not None and self.disk.path == path):
            return
        with self._lock:
            self.disk, self._loaded = VerifiedCache(path), set()

    def prefetch(self, ident: str, lease_ids: Iterable[str]) -> None:
        """Load what other processes verified of these leases under this trust (one query per 500 leases)."""
        disk = self.disk
        if disk is None:
            return
        wanted = sorted({lid for lid in lease_ids if (ident, lid) not in self._loaded})
        if not wanted:
            return
        rows = disk.load(ident, wanted)
        with self._lock:
            self._loaded.update((ident, lid) for lid in wanted)
            tops: dict[str, tuple[int, str]] = {}
            sources: dict[str, _CachedData] = {}
            for oid, lease_id, parent, version, status, key, fp, principal, signed, root in rows:
                at = (ident, oid)
                if parent is None and root is None:
                    continue  # v1 without its record: the history is not whole here (_whole), and is checked
                if at not in self._entries:
                    src = sources.get(lease_id)
                    if src is None:
                        src = sources[lease_id] = _CachedData(disk, ident)
                    # kept as the row until looked at (_Lazy): most reads look at v1 and the newest version only
                    data = root if root is not None else src
                    self._entries[at] = (lease_id, (version, status, key, fp, principal, signed, data), parent)
                v = version or 0
                if lease_id not in tops or tops[lease_id][0] < v:
                    tops[lease_id] = (v, oid)
            for lease_id, (_, oid) in tops.items():
                if self._whole(ident, lease_id, oid):  # a walk may stop only where the history below is whole
                    self._newest.setdefault((ident, lease_id), oid)

    def _whole(self, ident: str, lease_id: str, oid: str) -> bool:
        cur: str | None = oid
        for _ in range(MAX_CHAIN + 1):
            if cur is None:
                return True
            entry = self._entries.get((ident, cur))
            if entry is None or entry[0] != lease_id:
                return False
            cur = entry[2]
        return False

    def flush(self) -> None:
        """Write the verdicts remembered since the last flush to the verified cache."""
        with self._lock:
            pending, self._pending = self._pending, []
        if pending and self.disk is not None:
            self.disk.save(pending)

    def versions(self, ident: str, lease_id: str, oid: str) -> Sequence[HistoryCheck]:
        """The verified history from ``oid`` down to v1, newest first; empty when ``oid`` is not memoised. Its
        versions read from the verified cache are made into HistoryChecks where looked at (``_Lazy``)."""
        out: list[tuple[str, _Entry]] = []
        cur: str | None = oid
        with self._lock:
            while cur is not None:
                entry = self._entries.get((ident, cur))
                if entry is None or entry[0] != lease_id:
                    if out:  # a broken memo chain (cleared meanwhile): verify from scratch
                        out = []
                    break
                out.append((cur, entry[1]))
                cur = entry[2]
        if out:
            self.hits += 1
        else:
            self.misses += 1
        return _Lazy(out) if out else []

    def remember(self, ident: str, lease_id: str, versions: Sequence[HistoryCheck], new: int) -> None:
        """``versions``: a valid history, newest first; its first ``new`` entries are not memoised yet."""
        with self._lock:
            if len(self._entries) + new > self.limit:
                self._entries.clear()
                self._newest.clear()
                new = len(versions)
            for i in range(min(new, len(versions)) - 1, -1, -1):
                parent = versions[i + 1].oid if i + 1 < len(versions) else None
                self._entries[(ident, versions[i].oid)] = (lease_id, versions[i], parent)
                if self.disk is not None:
                    self._pending.append((ident, versions[i].oid, lease_id, parent, versions[i]))
            self._newest[(ident, lease_id)] = versions[0].oid

    def newest(self, ident: str, lease_ids: Iterable[str]) -> list[str]:
        """The newest verified commit of each of ``lease_ids`` that has one (a history walk can stop there)."""
        with self._lock:
            return [self._newest[(ident, lid)] for lid in lease_ids if (ident, lid) in self._newest]


MEMO = ChainMemo(persist=True)


class VerifiedCache(SqliteFile):
    """Verdicts on lease versions shared by every process of a repository: a SQLite file in the common git dir,
    one row per (trust identity, commit id) of a history found valid as a whole, with the version's verdict,
    its parent and its record's bytes. Safe to share: what a commit id names never changes, and a verdict is
    keyed by the trust file it was reached under. It remembers only verdicts (never which version is current),
    so an id ref moved back to an older version is still caught by the replay memory (``Seen``).

    Bounded: past ``LIMIT`` rows the leases written longest ago are dropped, all their versions at once (a
    history in the cache is always whole). A file that cannot be read (damaged, not a database) is removed and
    the read goes on without it: the cache only saves work, it never decides."""

    LIMIT = 400_000

    def __init__(self, path: str) -> None:
        super().__init__(path, timeout=10, shared_threads=True)
        self._lock = threading.Lock()  # one connection, used by one thread at a time

    def _setup(self, db: sqlite3.Connection) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS v (trust TEXT NOT NULL, oid TEXT NOT NULL, lease TEXT NOT NULL, "
            "parent TEXT, version INTEGER, status TEXT NOT NULL, key TEXT, fp TEXT, principal TEXT, "
            "signed INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (trust, oid))"
        )
        db.execute("CREATE INDEX IF NOT EXISTS v_lease ON v (trust, lease)")

    def load(self, ident: str, lease_ids: Sequence[str]) -> list[_Row]:
        """(oid, lease id, parent, version, status, key, fingerprint, principal, signed, v1's record bytes) of
        every cached version of these leases: the record bytes of v1 only (what a new version is checked
        against), the others' are read when asked for (``data``)."""
        ids = [lid for lid in lease_ids if lid.isascii()]  # a lease id is ASCII; a ref name that is not never is one
        with self._lock:
            return self._load(ident, ids)

    def _load(self, ident: str, lease_ids: Sequence[str]) -> list[_Row]:
        db = self._open()
        if db is None:
            return []
        import sqlite3

        out: list[_Row] = []
        try:
            for i in range(0, len(lease_ids), 500):
                chunk = lease_ids[i : i + 500]
                cur = db.execute(
                    "SELECT oid, lease, parent, version, status, key, fp, principal, signed, "
                    "CASE WHEN parent IS NULL THEN data END FROM v "
                    f"WHERE trust = ? AND lease IN ({','.join('?' * len(chunk))}) AND typeof(data) = 'blob' "
                    "AND status IN (?, ?, ?)",  # only verdicts of valid histories are ever written
                    [ident, *chunk, VERIFIED, UNSIGNED, UNTRUSTED],
                )
                for oid, lease, parent, version, status, key, fp, principal, signed, root in cur:
                    root = root if isinstance(root, bytes) else None
                    out.append((oid, lease, parent, version, status, key, fp, principal, bool(signed), root))
        except sqlite3.Error:
            self._give_up()
            return []
        return out

    def data(self, ident: str, oids: Sequence[str]) -> dict[str, bytes]:
        """The record bytes of these cached versions (those still there)."""
        with self._lock:
            db = self._open()
            if db is None:
                return {}
            import sqlite3

            out: dict[str, bytes] = {}
            try:
                for i in range(0, len(oids), 500):
                    chunk = [o for o in oids[i : i + 500] if o.isascii()]
                    cur = db.execute(
                        f"SELECT oid, data FROM v WHERE trust = ? AND oid IN ({','.join('?' * len(chunk))})",
                        [ident, *chunk],
                    )
                    out.update((oid, data) for oid, data in cur if isinstance(data, bytes))
            except sqlite3.Error:
                self._give_up()
                return {}
            return out

    def save(self, rows: Sequence[tuple[str, str, str, str | None, HistoryCheck]]) -> None:
        with self._lock:
            self._save(rows)

    def _save(self, rows: Sequence[tuple[str, str, str, str | None, HistoryCheck]]) -> None:
        db = self._open()
        if db is None:
            return
        import sqlite3

        values = []
        for ident, oid, lease_id, parent, h in rows:
            data = h.data()
            if data is None or h.check.status == INVALID or not (lease_id.isascii() and oid.isascii()):
                continue
            c = h.check
            values.append(
                (
                    ident,
                    oid,
                    lease_id,
                    parent,
                    c.version,
                    c.status,
                    c.key,
                    c.fingerprint,
                    c.principal,
                    int(h.signed),
                    data,
                )
            )
        try:
            with locked(self.path + ".lock", wait=10.0):
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.executemany("INSERT OR IGNORE INTO v VALUES (?,?,?,?,?,?,?,?,?,?,?)", values)
                    lo, hi = db.execute("SELECT min(rowid), max(rowid) FROM v").fetchone()
                    if lo is not None and hi - lo >= self.LIMIT:  # drop the oldest leases, whole
                        db.execute(
                            "DELETE FROM v WHERE lease IN (SELECT lease FROM v WHERE rowid < ?)",
                            (lo + (hi - lo) // 2,),
                        )
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except sqlite3.Error:
            self._give_up()
        except OSError:
            pass  # a lock that cannot be taken only costs what would have been remembered


@dataclass(frozen=True)
class VersionCheck:
    version: int | None
    status: str  # verified | unsigned | untrusted (signature good, no trust file) | invalid
    key: str | None = None  # "ssh-ed25519 <b64>" of a signature that verifies
    fingerprint: str | None = None
    principal: str | None = None  # the agent id the trust file vouches for
    problem: str | None = None


class HistoryCheck:
    """One version of a lease as checked: its commit, record, verdict, and whether it carries a signature. A
    version read back from the verified cache (``VerifiedCache``) keeps its record's bytes and parses them only
    when something asks for the record (``show``): a read of a long history parses what it has not seen."""

    __slots__ = ("oid", "check", "signed", "_record", "_data")

    def __init__(
        self,
        oid: str,
        record: records.Record | None,
        check: VersionCheck,
        signed: bool = False,
        *,
        data: bytes | _CachedData | None = None,
    ) -> None:
        self.oid, self.check, self.signed = oid, check, signed  # signed: a lease.sig is there
        self._record, self._data = record, data

    def _bytes(self) -> bytes | None:
        got = self._data
        return got.get(self.oid) if isinstance(got, _CachedData) else got

    @property
    def record(self) -> records.Record | None:
        if self._record is None and self._data is not None:
            data = self._bytes()
            if data is not None:
                try:
                    self._record = records.parse(data)
                except InvalidRecord:
                    pass
            self._data = None
        return self._record

    def data(self) -> bytes | None:
        """The record's canonical bytes (for the verified cache)."""
        rec = self._record
        return self._bytes() if rec is None else rec.canonical()

    def __repr__(self) -> str:
        return f"HistoryCheck({self.oid[:12]}, v{self.check.version}, {self.check.status})"


_Row: TypeAlias = "tuple[str, str, str | None, int | None, str, str | None, str | None, str | None, bool, bytes | None]"
# a memoised version: its HistoryCheck, or the verified cache's row for it until something looks at it
_Pending: TypeAlias = "tuple[int | None, str, str | None, str | None, str | None, bool, bytes | _CachedData]"
_Entry: TypeAlias = "HistoryCheck | _Pending"


class _CachedData:
    """The record bytes of versions read from the verified cache, asked of it when something needs a record:
    v1's, to check a renewal against (one query); every version's, for ``show`` (one query: ``_Lazy``)."""

    __slots__ = ("disk", "ident", "_got")

    def __init__(self, disk: VerifiedCache, ident: str) -> None:
        self.disk, self.ident = disk, ident
        self._got: dict[str, bytes] = {}

    def get(self, oid: str) -> bytes | None:
        if oid not in self._got:
            self._got.update(self.disk.data(self.ident, [oid]))
        return self._got.get(oid)

    def want(self, oids: Sequence[str]) -> None:
        missing = [o for o in oids if o not in self._got]
        if missing:
            self._got.update(self.disk.data(self.ident, missing))


def _made(oid: str, entry: _Entry) -> HistoryCheck:
    if isinstance(entry, HistoryCheck):
        return entry
    version, status, key, fp, principal, signed, src = entry
    return HistoryCheck(oid, None, VersionCheck(version, status, key, fp, principal), signed, data=src)


class _Lazy(Sequence[HistoryCheck]):
    """A memoised history (ChainMemo.versions), newest first: each version made a HistoryCheck where looked at."""

    __slots__ = ("_items", "_made")

    def __init__(self, items: list[tuple[str, _Entry]]) -> None:
        self._items = items
        self._made: dict[int, HistoryCheck] = {}

    def __len__(self) -> int:
        return len(self._items)

    def _at(self, i: int) -> HistoryCheck:
        got = self._made.get(i)
        if got is None:
            got = self._made[i] = _made(*self._items[i])
        return got

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self._at(k) for k in range(len(self._items))[i]]
        return self._at(range(len(self._items))[i])

    def __iter__(self):  # type: ignore[no-untyped-def]
        srcs: dict[int, tuple[_CachedData, list[str]]] = {}  # a walk over every version (show): one query
        for oid, entry in self._items:
            if not isinstance(entry, HistoryCheck) and isinstance(entry[6], _CachedData):
                srcs.setdefault(id(entry[6]), (entry[6], []))[1].append(oid)
        for src, oids in srcs.values():
            src.want(oids)
        return (self._at(k) for k in range(len(self._items)))

    def statuses(self) -> set[str]:
        return {e.check.status if isinstance(e, HistoryCheck) else e[1] for _, e in self._items}


class _Joined(Sequence[HistoryCheck]):
    """The versions a check found (``fresh``), newest first, then the memoised history below them (``base``)."""

    __slots__ = ("fresh", "base")

    def __init__(self, fresh: list[HistoryCheck], base: Sequence[HistoryCheck]) -> None:
        self.fresh, self.base = fresh, base

    def __len__(self) -> int:
        return len(self.fresh) + len(self.base)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        n = len(self.fresh)
        if isinstance(i, slice):
            return [self._at(k, n) for k in range(len(self))[i]]
        return self._at(range(len(self))[i], n)

    def _at(self, k: int, n: int) -> HistoryCheck:
        return self.fresh[k] if k < n else self.base[k - n]

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self.fresh
        yield from self.base


def _statuses(base: Sequence[HistoryCheck]) -> set[str]:
    if isinstance(base, _Lazy):
        return base.statuses()
    return {h.check.status for h in base}


@dataclass
class ChainCheck:
    status: str = INVALID
    problems: list[str] = field(default_factory=list)
    versions: Sequence[HistoryCheck] = field(default_factory=list)  # newest first
    signer: str | None = None  # fingerprint of the key that signed v1
    principal: str | None = None


def _walk(
    lease_id: str,
    head: str,
    parents: Mapping[str, Sequence[str]],
    out: ChainCheck,
    memo: ChainMemo | None,
    ident: str | None,
) -> tuple[list[str], Sequence[HistoryCheck]]:
    """A lease's history from ``head`` back to version 1 (newest first), one parent a version, stopping at the
    first commit ``memo`` verified already under ``ident``: (the commits walked, the memoised versions below
    them). Problems (unreadable, merges, too long) go to ``out``."""
    chain: list[str] = []
    base: Sequence[HistoryCheck] = []
    oid: str | None = head
    while oid is not None:
        if memo is not None and ident is not None:
            cached = memo.versions(ident, lease_id, oid)
            if cached:
                base = cached
                break
        ps = parents.get(oid)
        if ps is None:
            out.problems.append(f"history unreadable at {oid[:12]}")
            break
        chain.append(oid)
        if len(ps) > 1:
            out.problems.append(f"version commit {oid[:12]} has {len(ps)} parents")
            break
        if len(chain) > MAX_CHAIN:
            out.problems.append(f"history longer than {MAX_CHAIN} versions")
            break
        oid = ps[0] if ps else None
    return chain, base


def _key_words(key: str | None) -> str | None:
    """'ssh-ed25519 <b64>' of a public key text (its comment dropped), or None."""
    if not key:
        return None
    words = key.split()
    return " ".join(words[:2]) if len(words) >= 2 else None


def same_host_dead_holder(doc: Mapping[str, object]) -> bool:
    """An audit entry of a reclaim by the dead-holder rule, written on the host its lease's holder ran on (both
    host names as the writer and the holder reported them): what an ordinary trusted agent may do."""
    owner = doc.get("owner")
    host = doc.get("host")
    return (
        doc.get("action") == "reclaim"
        and doc.get("rule") == "dead-holder"
        and isinstance(owner, Mapping)
        and isinstance(host, str)
        and bool(host)
        and owner.get("host") == host
    )


def _signed_by(
    trust: Trust, doc: Mapping[str, object], data: bytes, sig: bytes | None, what: str
) -> tuple[str | None, tuple[str, float] | None]:
    """The checks an audit entry and a task outcome share: the SSHSIG (namespace gitlease) verifies over the
    exact ``data`` by the key ``doc`` names, or ``data`` is unsigned on an unsigned store. Returns (problem,
    None), or (None, (the key, when it was written)) for the caller's trust rules on a signed store, or
    (None, None): nothing more to check."""
    if sig is None:
        if doc.get("key"):
            return f"the {what} names a key but carries no signature", None
        if trust.signed:
            return f"the {what} is unsigned, but this store is signed ({trust.source})", None
        return None, None
    try:
        key = sshsig.verify(sig, data, NAMESPACE)
    except InvalidRecord as exc:
        return f"signature: {exc}", None
    named = doc.get("key")
    if _key_words(named if isinstance(named, str) else None) != key:
        return f"signed by key {sshsig.fingerprint_of(key)}, not by the key the {what} names (forged or replaced)", None
    if not trust.signed:
        return None, None
    try:
        return None, (key, parse_iso(str(doc.get("at"))))
    except ValueError:
        return f"unreadable time {doc.get('at')!r}", None


def check_audit_entry(trust: Trust, doc: Mapping[str, object], data: bytes, sig: bytes | None) -> str | None:
    """The problem with one audit entry's signature (None: fine). Same rules as a lease version: the SSHSIG
    (namespace gitlease) must verify over the exact ``entry.json`` bytes by the key the entry names; on a
    signed store that key must be trusted for the writer (``by``), and be a gitlease-admin key for what only
    an admin may do (a forced release, a reclaim of a live lease by an early rule, except a dead-holder reclaim
    written on the holder's own host: ``same_host_dead_holder``)."""
    problem, signed = _signed_by(trust, doc, data, sig, "entry")
    if signed is None:
        return problem
    key, when = signed
    fp = sshsig.fingerprint_of(key)
    admin_only = doc.get("action") == "force-release" or doc.get("rule") not in ("expired", "half-deleted", None)
    if trust.admin_principals(key, when):
        return None
    if admin_only and not same_host_dead_holder(doc):
        return (
            f"{doc.get('action')} by rule {doc.get('rule')!r} needs a {ADMIN_NAMESPACE} key, and key {fp} "
            f"is not one ({trust.source})"
        )
    if not trust.trusted_for(str(doc.get("by")), key, when):
        return f"key {fp} is not trusted for writer {doc.get('by')!r} ({trust.source})"
    return None


def check_outcome(trust: Trust, doc: Mapping[str, object], data: bytes, sig: bytes | None) -> str | None:
    """The problem with one task outcome's signature (gitlease.service.outcomes; None: fine). As an audit
    entry's: the SSHSIG (namespace gitlease) must verify over the exact ``outcome.json`` bytes by the key the
    outcome names; on a signed store that key must be trusted for its writer (``by``) when it was written."""
    problem, signed = _signed_by(trust, doc, data, sig, "outcome")
    if signed is None:
        return problem
    key, when = signed
    if not trust.trusted_for(str(doc.get("by")), key, when) and not trust.admin_principals(key, when):
        return f"key {sshsig.fingerprint_of(key)} is not trusted for writer {doc.get('by')!r} ({trust.source})"
    return None


# --------------------------------------------------------------------------------------------- loading


# The trust is the allowed-signers file and, next to it, a folder of one file per signer (a host, or an agent):
# ``.gitlease/allowed_signers`` and ``.gitlease/signers/<name>.pub``, each in allowed_signers format. Hosts that
# join at the same time each add a file of their own, so their commits never conflict (``git lease trust``).
SIGNERS_DIR = "signers"
SIGNER_SUFFIX = ".pub"
_FILE_MARK = "# gitlease-trust-file: "  # where each file starts in the combined text the trust cache keeps


def signers_dir(path: str) -> str:
    """The folder of per-signer files that goes with the trust file ``path`` (``.gitlease/signers``)."""
    if os.path.isabs(os.path.expanduser(path)):
        return os.path.join(os.path.dirname(os.path.expanduser(path)), SIGNERS_DIR)
    head = path.rsplit("/", 1)[0] if "/" in path else ""
    return f"{head}/{SIGNERS_DIR}" if head else SIGNERS_DIR


def signer_file(path: str, name: str) -> str:
    """Where signer ``name``'s file goes: ``.gitlease/signers/<name>.pub``."""
    return f"{signers_dir(path)}/{name}{SIGNER_SUFFIX}"


def read_trust_files(
    commit: str, path: str, *, cwd: str | None, keep_repo_env: bool = False
) -> list[tuple[str, bytes]]:
    """(path, bytes) of the trust file and of each ``<signers>/<name>.pub`` in ``commit`` (already local),
    trust file first, then the signer files by name: two git processes, whatever the number of signers.
    InvalidRecord when they hold more than the trust limit (1 MiB) together."""
    where = gitq.At(cwd=cwd, hook_env=keep_repo_env)
    folder = signers_dir(path)
    blobs = [
        (name, oid)
        for name, oid in gitq.tree_blobs(where, commit, [path, folder + "/"])
        if name == path
        or (name.startswith(folder + "/") and "/" not in name[len(folder) + 1 :] and name.endswith(SIGNER_SUFFIX))
    ]
    blobs.sort(key=lambda b: (b[0] != path, b[0]))
    if not blobs:
        return []
    contents = gitq.read_objects(where, {oid for _, oid in blobs})
    out = [(name, contents[oid][1]) for name, oid in blobs if oid in contents]
    if sum(len(data) for _, data in out) > sshsig_limit():
        raise InvalidRecord(f"the trust files ({path}, {folder}/) are too large together", trustFile=path)
    return out


def combine(files: Sequence[tuple[str, bytes]]) -> bytes:
    """The trust files as one allowed_signers text (what the trust cache keeps): each file after a comment line
    naming it, so that ``parse_files`` can say which file a line came from."""
    parts = []
    for name, data in files:
        text = data if data.endswith(b"\n") or not data else data + b"\n"
        parts.append(_FILE_MARK.encode() + name.encode("utf-8", "surrogateescape") + b"\n" + text)
    return b"".join(parts)


def split_combined(data: bytes) -> list[tuple[str, bytes]]:
    """``combine``'s files back; a text without marks (an older cache) is one file, named ``?``."""
    mark = _FILE_MARK.encode()
    if not data.startswith(mark):
        return [("?", data)]
    out: list[tuple[str, bytes]] = []
    for i, chunk in enumerate(data.split(b"\n" + mark)):
        name, _, body = (chunk[len(mark) :] if i == 0 else chunk).partition(b"\n")
        out.append((name.decode("utf-8", "surrogateescape"), body))
    return out


def parse_files(
    files: Sequence[tuple[str, bytes]], where: str
) -> tuple[tuple[sshsig.AllowedSigner, ...], tuple[str, ...]]:
    """The signers of every file, in order, and the file each came from. A file that does not parse raises
    InvalidRecord naming it (one bad file refuses the whole trust: fail closed)."""
    signers: list[sshsig.AllowedSigner] = []
    origins: list[str] = []
    for name, data in files:
        got = _parse(data, f"{name} on {where}" if where else name)
        signers += got
        origins += [name] * len(got)
    return tuple(signers), tuple(origins)


def describe_files(path: str, files: Sequence[tuple[str, bytes]]) -> str:
    """``.gitlease/allowed_signers and .gitlease/signers/ (3 files)``: which trust files there are."""
    n = sum(1 for name, _ in files if name != path)
    has_file = any(name == path for name, _ in files)
    folder = f"{signers_dir(path)}/ ({n} file{'s' if n != 1 else ''})" if n else ""
    if has_file and folder:
        return f"{path} and {folder}"
    return path if has_file else folder


def load_trust(store: Store, path: str, *, cache_dir: str, required: bool, offline: bool = False) -> Trust:
    """Read the allowed-signers file and the signer files next to it (``read_trust_files``). ``path``
    relative: a file in the store's default branch (the remote's HEAD branch by ``git ls-remote --symref``,
    fetched by oid; for the local store the repository's own HEAD branch). ``path`` absolute (or ``~/...``): a
    local file (and the ``signers`` folder beside it), for a single machine or a test.

    ``required`` (a signing key is configured): a missing file raises InvalidRecord (exit 5). A file that does
    not parse always raises InvalidRecord. ``offline`` or an unreachable store: the last trust read from this
    store is used (marked as such); when there is none, trust is unknown (signatures checked, keys not)."""
    cache = TrustCache(cache_dir, store.name)
    expanded = os.path.expanduser(path)
    if os.path.isabs(expanded):
        return _from_local_file(expanded, required)
    if offline:
        return cache.load() or Trust(
            None, "trust unknown: the store is unreachable and no trust file was read from it before"
        )
    try:
        head = store.default_head()
    except RemoteUnavailable:
        cached = cache.load()
        if cached is None:
            raise
        return cached
    where = f"the default branch of {store.name}"
    neither = f"{path} nor {signers_dir(path)}/*{SIGNER_SUFFIX}"
    if head is None:
        data = None
        where = (
            f"the default branch of {store.name}, which has no commits (or the remote's HEAD names a branch "
            "that does not exist: set the host's default branch, or `git symbolic-ref HEAD refs/heads/main` "
            "in a bare repository)"
        )
        source = f"{path} (not found: {where})"
    else:
        branch, commit = head
        short = branch[len("refs/heads/") :] if branch.startswith("refs/heads/") else branch
        where = f"{short} ({commit[:12]}) of {store.name}"
        known = cache.at(commit, path, where)  # what this commit holds never changes: read it once
        if known is None:
            files = read_trust_files(commit, path, cwd=store.repo_dir)
            data = combine(files) if files else None
        else:
            data = known[0]
        source = (
            f"{describe_files(path, split_combined(data))} on {where}"
            if data is not None
            else f"no trust file (neither {neither} on {where})"
        )
    if data is None:
        if required:
            raise InvalidRecord(
                f"lease.signingKey is set but there is no trust file: neither {neither} is on {where}; "
                "trust this host's key there (git lease trust add), or unset lease.signingKey",
                trustFile=path,
            )
        trust = Trust(None, source)
    else:
        signers, origins = parse_files(split_combined(data), where)
        trust = Trust(signers, source, origins)
    cache.save(trust, data, (head[1], path, where) if head else None)
    return trust


def _from_local_file(path: str, required: bool) -> Trust:
    folder = signers_dir(path)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(SIGNER_SUFFIX))
    except OSError:
        names = []
    files: list[tuple[str, bytes]] = []
    for name in [path] + [os.path.join(folder, n) for n in names]:
        try:
            with open(name, "rb") as fh:
                files.append((name, fh.read(sshsig_limit() + 1)))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise InvalidRecord(f"trust file {name} cannot be read: {exc.strerror}", trustFile=name) from None
    if not files:
        if required:
            raise InvalidRecord(
                f"lease.signingKey is set but the trust file {path} does not exist", trustFile=path
            ) from None
        return Trust(None, f"no trust file ({path} does not exist)")
    if sum(len(data) for _, data in files) > sshsig_limit():
        raise InvalidRecord(f"trust file {path} is too large", trustFile=path)
    signers, origins = parse_files(files, "")
    return Trust(
        signers, f"{describe_files(path, files)} (a local file, not reviewed through the default branch)", origins
    )


def sshsig_limit() -> int:
    return 1024 * 1024


def _parse(data: bytes, where: str) -> tuple[sshsig.AllowedSigner, ...]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRecord(f"trust file {where} does not parse: not UTF-8 text", trustFile=where) from None
    try:
        return tuple(sshsig.parse_allowed_signers(text))
    except InvalidRecord as exc:
        raise InvalidRecord(f"trust file {where} does not parse: {exc}", trustFile=where) from None


def _cache_name(folder: str, prefix: str, store_name: str) -> str:
    return cache_path(folder, prefix, store_name)


def _write_json(path: str, doc: object) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, doc)
    except OSError:
        pass  # a cache that cannot be written only costs what it would have remembered


TRUST_CACHE_FORMAT = 2  # 2: the text is the trust file and the signer files (``combine``)


class TrustCache:
    """The last trust file read from a store, so a stale ``status`` (store unreachable) still verifies; and,
    with the commit and path it was read at, what that commit holds, so the next read of the same default
    branch commit asks git nothing more (``at``). Safe like the verified cache: a commit id names its tree, so
    the file at a path of it never changes. The file is rewritten only when what it says changes."""

    def __init__(self, folder: str, store_name: str) -> None:
        self.path = _cache_name(folder, "trust", store_name)
        self._doc: dict[str, object] | None = None  # as read from the file (None: not read yet)

    def _read(self) -> dict[str, object]:
        if self._doc is None:
            try:
                with open(self.path, encoding="utf-8") as fh:
                    doc = json.load(fh)
            except (OSError, ValueError):
                doc = None
            self._doc = doc if isinstance(doc, dict) else {}
        return self._doc

    def at(self, commit: str, path: str, where: str) -> tuple[bytes | None] | None:
        """(the trust file's bytes, None when the commit has none) as last read at ``commit``, ``path`` and
        ``where`` (branch and store), or None when the last read was not of exactly that."""
        doc = self._read()
        text = doc.get("text")
        if doc.get("commit") != commit or doc.get("path") != path or doc.get("where") != where:
            return None
        if doc.get("format") != TRUST_CACHE_FORMAT:  # read before the signer files were: read again
            return None
        if text is None:
            return (None,)
        return (text.encode("utf-8"),) if isinstance(text, str) else None

    def save(self, trust: Trust, data: bytes | None, at: tuple[str, str, str] | None = None) -> None:
        """Remember ``trust`` (read as ``data``), and ``at``: the (commit, path, where) it was read at."""
        doc: dict[str, object] = {
            "source": trust.source,
            "text": data.decode("utf-8") if data is not None else None,
            "format": TRUST_CACHE_FORMAT,
        }
        if at is not None:
            doc.update(commit=at[0], path=at[1], where=at[2])
        if doc != self._read():
            _write_json(self.path, doc)
            self._doc = doc

    def load(self, *, label: bool = True) -> Trust | None:
        """The trust last read (None: never); ``label``: its source says it is used because the store is
        unreachable."""
        try:
            doc = self._read()
            source, text = str(doc["source"]), doc["text"]
        except (KeyError, TypeError):
            return None
        label_text = f"{source}, as last read (store unreachable)" if label else f"{source}, as last read"
        if text is None:
            return Trust(None, label_text)
        try:
            signers, origins = parse_files(split_combined(str(text).encode("utf-8")), "")
        except InvalidRecord:
            return None
        return Trust(signers, label_text, origins)
