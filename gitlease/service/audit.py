"""The audit log: an append-only, signed record of every reclaim and forced release, kept in the store.

Layout (docs/protocol.md, "Audit log"): one ref per writer, ``refs/leases-audit/<writer>``, outside
``refs/leases/`` so that no lease reader ever mistakes an audit ref for a lease (a foreign ref under
``refs/leases/`` fails closed and blocks paths). Each entry is a commit whose tree holds ``entry.json`` (the
canonical entry) and, when signed, ``entry.sig``; its first parent is the writer's previous entry, its second
parent (when there is one) the lease version it reclaimed, so the reclaimed lease's history stays reachable.

An entry is appended *in the same atomic transaction* as the deletes it records (``append_with``): the
writer's ref is CAS-pinned to its previous entry, the lease refs to the values read. Either the reclaim and its
record land together, or neither does. Writers never contend (one ref each); two processes sharing one writer
id do contend, and the loser re-reads its head and tries again while the lease refs are still as read.

Standard library only; no lease semantics (the service builds the entry's fields).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gitlease.core import gitq
from gitlease.core.clock import iso
from gitlease.core.errors import GitLeaseError, RemoteUnavailable
from gitlease.core.fsutil import write_json
from gitlease.core.objects import ObjectWriter, ident_for
from gitlease.core.record import canonical
from gitlease.core.refnames import AUDIT_PREFIX, encode_segment
from gitlease.core.store import Outcome, RefUpdate, Store, _batch_check, _batch_contents
from gitlease.identity.signer import Signer

ENTRY_FILE = "entry.json"
ENTRY_SIG = "entry.sig"
SCHEMA = "gitlease.audit/1"
# The one limit of an entry's size, for writers and the server hook alike: a lease that can be granted can be
# released and reclaimed (its entry lists its refs and paths: ``entry_problem`` is checked before it is granted).
MAX_ENTRY_BYTES = 256 * 1024
MAX_REASON = 1000  # characters of an entry's reason kept
APPEND_ATTEMPTS = 50  # only processes sharing one writer id contend: each round one of them wins; back off, go again
MAX_ENTRIES = 100_000  # per writer, read back at most


def writer_id(name: str) -> str:
    """A writer name (the agent id) as one ref component: ``refs/leases-audit/<writer_id>``."""
    enc = encode_segment(name.strip() or "unknown")
    return enc[:200]


def audit_ref(writer: str) -> str:
    return AUDIT_PREFIX + writer


@dataclass(frozen=True)
class AuditEntry:
    """One entry as read back. ``doc`` is the parsed entry.json (empty when unreadable: see ``problem``)."""

    oid: str
    ref: str
    doc: dict[str, Any]
    signed: bool
    problem: str | None = None
    pointer: str | None = None  # the reclaimed lease version kept reachable (second parent)

    @property
    def lease_id(self) -> str | None:
        return self.doc.get("leaseId")

    @property
    def at(self) -> str:
        return str(self.doc.get("at") or "")

    def to_json(self) -> dict[str, Any]:
        return dict(
            self.doc, oid=self.oid, ref=self.ref, signed=self.signed, problem=self.problem, pointer=self.pointer
        )


@dataclass
class Appended:
    """What ``append_with`` did. ``status``: ok (deletes and entry landed together) | changed (a lease ref was
    no longer at the value read: nothing happened) | failed (the store refused for another reason)."""

    status: str
    oid: str | None = None
    entry: dict[str, Any] | None = None
    refs: dict[str, str] = field(default_factory=dict)  # the lease refs as re-read after a refusal
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def entry_problem(fields: dict[str, Any], *, writer: str, key: str | None, oid_hex: int) -> str | None:
    """Why an entry with ``fields`` (a release's or a reclaim's, its reason at its longest) could be over
    ``MAX_ENTRY_BYTES`` once written, or None."""
    doc = dict(fields, reason="x" * MAX_REASON)
    doc.update(
        schema=SCHEMA,
        writer=writer,
        seq=10**12,
        prev="0" * oid_hex,
        at="2000-01-01T00:00:00Z",
        nonce="0" * 32,
        key=key,
        signing="sshsig" if key else "unsigned",
        host=os.uname().nodename,
    )
    size = len(canonical(doc))
    if size > MAX_ENTRY_BYTES:
        return f"its release or reclaim would be recorded in {size} bytes, over the {MAX_ENTRY_BYTES}-byte limit"
    return None


class AuditLog:
    def __init__(
        self,
        store: Store,
        objects: ObjectWriter,
        signer: Signer,
        clock,
        *,
        writer: str,
        host: str | None = None,
        head_cache: str | None = None,
    ) -> None:
        self.head_cache = head_cache  # a file remembering our last entry: an append then needs no read first
        self.store = store
        self.objects = objects
        self.signer = signer
        self.clock = clock
        self.writer = writer
        self.host = host or os.uname().nodename
        self._head: tuple[str | None, int] | None = None  # (oid, seq) of our last entry, once known

    @property
    def ref(self) -> str:
        return audit_ref(self.writer)

    # -------------------------------------------------------------------------- writing
    def read_head(self) -> tuple[str | None, int]:
        """Our ref's current entry and its sequence number (0 before the first entry)."""
        oid = list_audit_refs(self.store, self.ref).get(self.ref)
        if oid is None:
            return None, 0
        self.store.ensure_objects([oid])
        doc, _sig, problem = _read_entries(self.store.repo_dir, [oid]).get(oid, ({}, None, "missing"))
        seq = doc.get("seq") if not problem else None
        if not isinstance(seq, int) or isinstance(seq, bool):
            # Someone wrote a non-entry under our ref; count the chain instead of trusting it.
            seq = len(_chain(self.store.repo_dir, oid)[0])
        return oid, seq

    def _entry_commit(
        self, fields: dict[str, Any], parent: str | None, seq: int, pointer: str | None
    ) -> tuple[str, dict[str, Any]]:
        doc = dict(fields)
        if isinstance(doc.get("reason"), str):
            doc["reason"] = doc["reason"][:MAX_REASON]
        doc.update(
            schema=SCHEMA,
            writer=self.writer,
            seq=seq,
            prev=parent,
            at=iso(self.clock.now()),
            nonce=os.urandom(16).hex(),
            key=self.signer.public_key,
            signing="sshsig" if self.signer.public_key else "unsigned",
            host=self.host,  # the writer's host (self-reported): a dead-holder reclaim is trusted only from there
        )
        data = canonical(doc)
        sig = self.signer.sign(data)
        if sig is None and self.signer.public_key:
            raise GitLeaseError("the signer returned no signature for an audit entry")
        files = {ENTRY_FILE: self.objects.blob(data)}
        if sig is not None:
            files[ENTRY_SIG] = self.objects.blob(sig)
        parents = tuple(p for p in (parent, pointer) if p)
        msg = (
            f"{doc.get('action')} {doc.get('leaseId')} v{doc.get('version')}: {doc.get('reason')}\n\n"
            f"by: {doc.get('by')}\nseq: {seq}"
        )
        oid = self.objects.commit(
            self.objects.tree(files), parents, ident_for(str(doc.get("by")), self.host), int(self.clock.now()), msg
        )
        return oid, doc

    def append_with(
        self, deletes: Sequence[RefUpdate], fields: dict[str, Any], *, pointer: str | None = None
    ) -> Appended:
        """Apply ``deletes`` (CAS deletes at the values read) and append one entry, in ONE atomic transaction."""
        if pointer and not _is_commit(self.store.repo_dir, pointer):
            pointer = None
        head, seq = self._head or self._cached_head() or self.read_head()
        last = ""
        for attempt in range(APPEND_ATTEMPTS):
            oid, doc = self._entry_commit(fields, head, seq + 1, pointer)
            mine = RefUpdate(self.ref, oid, head)
            out = self.store.apply([*deletes, mine])
            if out.ambiguous:
                out = self._resolve(mine, out)
            if out.ok:
                self._head = (oid, seq + 1)
                self._save_head()
                return Appended("ok", oid, doc)
            last = out.reason
            refs = self.store.list_refs()
            if any(refs.get(u.ref) != u.old for u in deletes):
                # Our ref did not move by us; if another process under our writer id moved it, the next
                # append finds out (its CAS fails) and re-reads then.
                self._head = (head, seq)
                return Appended("changed", refs=refs, message=last)
            now_head, now_seq = self.read_head()
            transient = "lock" in out.statuses.get(self.ref, "") + last  # a concurrent update held the ref lock
            if now_head == head and not transient:
                self._head = None
                return Appended("failed", refs=refs, message=last or "the store refused the audit entry")
            head, seq = now_head, now_seq  # another process appended under our writer id: go again
            self.clock.sleep(random.uniform(0, min(0.5, 0.02 * (attempt + 1))))
        self._head = None
        return Appended("failed", message=f"the audit ref {self.ref} kept moving: {last}")

    def append_many(
        self, items: Sequence[tuple[Sequence[RefUpdate], dict[str, Any], str | None]]
    ) -> tuple[list[Appended], int]:
        """Many reclaims in one atomic push: each item's deletes (CAS at the values read) and its entry, the
        entries chained one after another on our ref. Atomic, so an entry lands exactly when its deletes do.
        A lease that changed since it was read (a lost CAS) fails the push: the refs are re-read, the items
        whose refs moved are ``changed`` (nothing of theirs landed) and the rest go again without them, so one
        lost race never fails the others. Returns one ``Appended`` per item, in order, and the pushes made."""
        results: list[Appended | None] = [None] * len(items)
        todo = list(range(len(items)))
        pointers = dict(enumerate(self._commits_only([p for _, _, p in items])))
        head, seq = self._head or self._cached_head() or self.read_head()
        pushes, last = 0, ""
        for attempt in range(APPEND_ATTEMPTS):
            if not todo:
                break
            entries = self._chain([(items[i][1], pointers[i]) for i in todo], head, seq)
            prev, n = entries[-1][0], seq + len(entries)
            mine = RefUpdate(self.ref, prev, head)
            deletes = [u for i in todo for u in items[i][0]]
            out = self.store.apply([*deletes, mine])
            pushes += 1
            if out.ambiguous:
                out = self._resolve(mine, out)
            if out.ok:
                for i, (oid, doc) in zip(todo, entries):
                    results[i] = Appended("ok", oid, doc)
                self._head = (prev, n)
                self._save_head()
                todo = []
                break
            last = out.reason
            refs = self.store.list_refs()
            lost = [i for i in todo if any(refs.get(u.ref) != u.old for u in items[i][0])]
            for i in lost:
                results[i] = Appended("changed", refs=refs, message=last)
            todo = [i for i in todo if i not in set(lost)]
            if lost:
                continue  # the others again, without the leases that changed
            now_head, now_seq = self.read_head()
            transient = "lock" in out.statuses.get(self.ref, "") + last
            if now_head == head and not transient:
                break  # refused for another reason: every remaining item failed
            head, seq = now_head, now_seq  # another process appended under our writer id: go again
            self.clock.sleep(random.uniform(0, min(0.5, 0.02 * (attempt + 1))))
        if todo:
            self._head = None
        done = [r or Appended("failed", message=last or "the store refused the audited reclaims") for r in results]
        return done, pushes

    def prepare_entries(self, items: Sequence[tuple[dict[str, Any], str | None]]) -> tuple[RefUpdate, tuple[str, int]]:
        """Entries for ``items`` (fields, the lease version each points at), chained on our ref after its last
        entry and written (objects only), for a push the caller makes with the writes they record (the landing
        train's releases): (our ref's update, pinned to its head; our head and sequence number once that push
        lands: give them to ``landed``). A push refused for our ref: ``reread`` before preparing again."""
        head, seq = self._head or self._cached_head() or self.read_head()
        entries = self._chain(list(zip([f for f, _ in items], self._commits_only([p for _, p in items]))), head, seq)
        return RefUpdate(self.ref, entries[-1][0], head), (entries[-1][0], seq + len(entries))

    def landed(self, after: tuple[str, int]) -> None:
        """The push carrying ``prepare_entries``' update landed: ``after`` is our head now."""
        self._head = after
        self._save_head()

    def reread(self) -> None:
        """Our ref is not where this clone last wrote it (another process under our writer id appended, or a
        push's outcome is unknown): the next entries are chained on what the store has."""
        self._head = self.read_head()
        self._save_head()

    def _commits_only(self, pointers: Sequence[str | None]) -> list[str | None]:
        """Each pointer kept when it names a commit here (an entry's second parent), else None."""
        wanted = sorted({p for p in pointers if p})
        commits = {o for o, (kind, _) in _batch_check(self.store.repo_dir, wanted).items() if kind == "commit"}
        return [p if p in commits else None for p in pointers]

    def _chain(
        self, items: Sequence[tuple[dict[str, Any], str | None]], head: str | None, seq: int
    ) -> list[tuple[str, dict[str, Any]]]:
        """An entry commit for each of ``items`` (fields, pointer), each after the one before, the first after
        ``head`` (number ``seq``): [(oid, entry)] in order."""
        entries: list[tuple[str, dict[str, Any]]] = []
        prev, n = head, seq
        for fields, pointer in items:
            n += 1
            oid, doc = self._entry_commit(fields, prev, n, pointer)
            entries.append((oid, doc))
            prev = oid
        return entries

    def _cached_head(self) -> tuple[str | None, int] | None:
        """Our last entry as this clone wrote it (a guess: a stale one only fails the CAS, then we re-read)."""
        if not self.head_cache:
            return None
        try:
            with open(self.head_cache, encoding="utf-8") as fh:
                doc = json.load(fh)
            oid, seq = doc["oid"], doc["seq"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(oid, str) or not isinstance(seq, int) or not _is_commit(self.store.repo_dir, oid):
            return None
        return oid, seq

    def _save_head(self) -> None:
        if self.head_cache and self._head is not None:
            try:
                os.makedirs(os.path.dirname(self.head_cache), exist_ok=True)
                write_json(self.head_cache, {"oid": self._head[0], "seq": self._head[1]})
            except OSError:
                pass  # only costs a read before the next append

    def _resolve(self, mine: RefUpdate, out: Outcome) -> Outcome:
        """An unclear outcome: our entry is unique to us, so it landed exactly when our ref points at it (and
        then, atomically, the deletes landed too)."""
        out.check_reached()
        try:
            now = list_audit_refs(self.store, self.ref).get(self.ref)
        except RemoteUnavailable as exc:
            raise RemoteUnavailable(
                f"outcome of the audited write unknown: {out.message or 'no answer'}; and the store "
                f"cannot be re-read ({exc}); nothing is assumed"
            ) from None
        return Outcome(ok=now == mine.new, message=out.message)

    # -------------------------------------------------------------------------- reading
    def read_all(self, *, fetch: bool = True) -> list[AuditEntry]:
        return read_log(self.store, fetch=fetch)


Verify = Callable[[bytes, "bytes | None", dict], "str | None"]


def read_log(store: Store, *, fetch: bool = True, verify: Verify | None = None) -> list[AuditEntry]:
    """Every entry of every writer, oldest first (by time, then writer, then sequence).

    ``verify(entry_bytes, signature, entry)`` returns a problem (or None) for an entry that is otherwise well
    formed: the seam for checking ``entry.sig`` against the trust file (the signing work plugs in here)."""
    heads = list_audit_refs(store)
    if fetch and heads:
        store.ensure_objects(sorted(set(heads.values())))
    out: list[AuditEntry] = []
    for ref, oid in heads.items():
        chain, docs = _chain(store.repo_dir, oid)
        n = len(chain)
        for idx, (oid, parents) in enumerate(chain):
            doc, sig, problem = docs.get(oid, ({}, None, "missing"))
            expected = n - idx
            if not problem and doc.get("seq") != expected:
                problem = f"sequence number {doc.get('seq')!r} where {expected} belongs (an entry lost or doubled)"
            if not problem and verify is not None:
                problem = verify(canonical(doc), sig, doc)  # canonical: the stored bytes exactly
            pointer = next((p for p in parents if p != doc.get("prev")), None)
            out.append(AuditEntry(oid, ref, doc, sig is not None, problem, pointer))
    out.sort(key=lambda e: (e.at, e.ref, e.doc.get("seq") if isinstance(e.doc.get("seq"), int) else 0))
    return out


def list_audit_refs(store: Store, only: str | None = None) -> dict[str, str]:
    """{audit ref: oid}, all writers (or just ``only``)."""
    refs = store.list_namespace(AUDIT_PREFIX)
    return {r: o for r, o in refs.items() if only is None or r == only}


def _chain(repo_dir: str, head: str):
    """A writer's entries, newest first: from ``head`` along each entry's ``prev`` (its first parent; the
    first entry has none, and its only parent, if any, is the lease version it reclaimed). One walk, one read."""
    parents = gitq.first_parent_chain(repo_dir, head, limit=MAX_ENTRIES)
    docs = _read_entries(repo_dir, parents)
    chain: list[tuple[str, tuple[str, ...]]] = []
    cur: str | None = head
    while cur is not None and cur in parents and len(chain) < MAX_ENTRIES:
        chain.append((cur, parents[cur]))
        doc, _sig, problem = docs.get(cur, ({}, None, "missing"))
        nxt = doc.get("prev") if not problem else None
        cur = nxt if isinstance(nxt, str) and nxt in parents[cur] else None
    return chain, docs


def _read_entries(repo_dir: str, oids: Iterable[str]) -> dict[str, tuple[dict[str, Any], bytes | None, str | None]]:
    oids = sorted(set(oids))
    names = [f"{o}:{f}" for o in oids for f in (ENTRY_FILE, ENTRY_SIG)]
    sizes = _batch_check(repo_dir, names)
    small = [n for n in names if sizes.get(n, (None, -1))[0] == "blob" and sizes[n][1] <= MAX_ENTRY_BYTES]
    contents = _batch_contents(repo_dir, small) if small else {}
    out: dict[str, tuple[dict[str, Any], bytes | None, str | None]] = {}
    for o in oids:
        raw = contents.get(f"{o}:{ENTRY_FILE}")
        sig = contents.get(f"{o}:{ENTRY_SIG}")
        if raw is None:
            out[o] = ({}, sig, "not an audit entry (no entry.json)")
            continue
        try:
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
                raise ValueError("schema")
            if canonical(doc) != raw:
                out[o] = (doc, sig, "entry bytes are not in canonical form")
                continue
        except (ValueError, UnicodeDecodeError, RecursionError):
            out[o] = ({}, sig, "entry.json is not a gitlease audit entry")
            continue
        if doc.get("signing") == "sshsig" and sig is None:
            out[o] = (doc, sig, "entry says it is signed but has no entry.sig")
            continue
        out[o] = (doc, sig, None)
    return out


def _is_commit(repo_dir: str, oid: str) -> bool:
    return _batch_check(repo_dir, [oid]).get(oid, ("", 0))[0] == "commit"


__all__ = [
    "AuditLog",
    "AuditEntry",
    "Appended",
    "AUDIT_PREFIX",
    "audit_ref",
    "writer_id",
    "read_log",
    "list_audit_refs",
]
