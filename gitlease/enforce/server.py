"""The server side: ``git lease server-hook pre-receive`` on a self-hosted remote (a bare repository over ssh,
Gitea or GitLab server hooks). Hooks on clients can be skipped; this cannot.

It refuses, for the whole push (git applies all or none of a push a pre-receive hook refuses):

* lease ref updates that are not what gitlease itself writes: a create must be version 1 of a canonical
  record, without parents, with its id ref and exactly its scope refs created together at that commit; a
  renewal must be a commit whose only parent is the version it replaces, ``version + 1``, the same lease
  (id, owner, acquiredAt, repo, workspace), renewed before the old version expired (by the records'
  own timestamps: no server clock involved); a renewal that changes the scope (extend, narrow) must create,
  at the lease's grant, exactly the scope refs of the paths it adds and delete exactly those of the paths it
  removes, in the same push; scope refs never move; nothing else lives under ``refs/leases/``. Deletes
  (release, clearing an expired lease) are compare-and-swap updates the client pins; they must be whole
  leases (or a narrow's). Signatures: ``signature_problem`` verifies each version against the server's trust file.
* branch and tag updates whose new commits touch a path inside a lease held by someone else: a push claims
  leases with push options (``git push -o lease=lease_...``) or ``Lease:`` trailers in its commits; without
  signatures such a claim is not proof (docs/limits.md).

The pushed objects are still in git's quarantine while this runs: every read of them keeps git's
environment (``keep_repo_env``), which points at the quarantine.
"""

from __future__ import annotations

import functools
import json
import os
import re

from gitlease.core import gitq
from gitlease.core import record as records
from gitlease.core.errors import InvalidRecord, RemoteUnavailable
from gitlease.core.gitq import HOOK, commit_parents
from gitlease.core.objects import PROBE_FILE, PROBE_MAGIC, PROBE_MAX_BYTES, RECORD_FILE, SIGNATURE_FILE
from gitlease.core.refnames import (
    AUDIT_NAMESPACE,
    AUDIT_PREFIX,
    ID_PREFIX,
    NAMESPACE,
    OUTCOME_PREFIX,
    PROBE_PREFIX,
    QUARANTINE_PREFIX,
    SCOPE_REF,
    TASK_PREFIX,
    VERDICT_PREFIX,
    decode_segment,
    is_scope_ref,
    path_of_scope_ref,
    scope_ref,
)
from gitlease.core.store import Blob
from gitlease.enforce import claims as claims_mod
from gitlease.enforce import rules as enforce

ZERO = re.compile(r"^0+$")
MAX_AUDIT_CHAIN = 2000  # entries one push may append to one audit ref (a batched sweep: ops.sweep.MAX_BATCH_REFS)
LEASE_OPTION = re.compile(r"lease=(lease_[0-9a-z]{6,40})")  # fullmatch: "lease=ID\n" is no claim


def read_objects(oids) -> tuple[dict[str, Blob], dict[str, tuple[str, ...]]]:
    """Record and signature bytes, and parents, of lease commits (quarantined or not)."""
    oids = sorted(set(oids))
    if not oids:
        return {}, {}
    got = _cat([n for o in oids for n in (o, f"{o}:{RECORD_FILE}", f"{o}:{SIGNATURE_FILE}")])
    blobs, parents = {}, {}
    for o in oids:
        kind, body = got.get(o, (None, b""))
        parents[o] = commit_parents(body) if kind == "commit" else ()
        rec = got.get(f"{o}:{RECORD_FILE}")
        sig = got.get(f"{o}:{SIGNATURE_FILE}")
        problem = None if kind == "commit" and rec and rec[0] == "blob" else "not a lease commit (no lease.json)"
        blobs[o] = Blob(
            rec[1] if rec and rec[0] == "blob" and len(rec[1]) <= records.MAX_RECORD_BYTES else None,
            sig[1] if sig and sig[0] == "blob" else None,
            problem,
        )
    return blobs, parents


def signature_problem(blob: Blob, rec: records.Record, previous: records.Record | None) -> str | None:
    """Why a pushed lease version's signature does not verify against the server's own trust file (the
    allowed_signers file on this repository's HEAD branch, the one clients read), or None.

    No trust file on the server: unsigned mode, nothing to verify (a signed version must still carry a good
    signature by the key its record names). The owner binding (the key never changes between versions) is
    checked with the other fields that must stay the same."""
    from gitlease.core.clock import SYSTEM
    from gitlease.identity.trust import INVALID

    trust = _server_trust()
    got = trust.check_version(rec, blob.record, blob.signature, SYSTEM.now())
    return got.problem if got.status == INVALID else None


_TRUST_CACHE: list = []


def _server_trust():
    """The trust file at this repository's HEAD, read once per hook run."""
    if _TRUST_CACHE:
        return _TRUST_CACHE[0]
    from gitlease.core.config import resolve
    from gitlease.identity.trust import Trust, describe_files, parse_files, read_trust_files

    try:
        config = gitq.config_matching(HOOK, r"^lease\.")
    except ValueError:
        config = {}
    path = resolve(config, env={}).allowed_signers
    files = read_trust_files("HEAD", path, cwd=None, keep_repo_env=True)  # and the signer files beside it
    if not files:
        trust = Trust(None, f"no trust file ({path} not on this repository's HEAD)")
    else:
        signers, origins = parse_files(files, "HEAD")
        trust = Trust(signers, f"{describe_files(path, files)} on HEAD", origins)
    _TRUST_CACHE.append(trust)
    return trust


def _parse(blob: Blob | None) -> tuple[records.Record | None, str | None]:
    if blob is None or blob.record is None:
        return None, (blob.problem if blob else None) or "missing record"
    try:
        return records.parse(blob.record), None
    except InvalidRecord as exc:
        return None, exc.message


SAME = ("lease_id", "acquired_at", "owner", "repo", "workspace_id", "schema")  # the scope: see _scope_changes


# ------------------------------------------------------------------------ lease and audit refs
# Every ref under refs/leases/ and refs/leases-audit/ must be one of gitlease's own shapes. ``shape`` names the
# shape of a ref name; ``_Push.check_write`` dispatches a create or update to the checker of its shape, and
# ``_Push.check_deletes`` judges the push's deletes together. A new shape is one more line in ``shape`` and
# one checker method.


def in_namespaces(ref: str) -> bool:
    return ref in (NAMESPACE, AUDIT_NAMESPACE) or ref.startswith((NAMESPACE + "/", AUDIT_PREFIX))


def parked(ref: str) -> bool:
    """A failed attempt's work parked by the queue runner (refnames.QUARANTINE_PREFIX): its paths are not judged
    (nothing lands by it); its commits are, when they reach a branch."""
    return ref.startswith(QUARANTINE_PREFIX)


def shape(ref: str) -> str | None:
    """id | scope | task | outcome | probe | verdict | audit for a ref name of one of gitlease's shapes, else
    None."""
    if ref.startswith(ID_PREFIX):
        return "id" if records.LEASE_ID.match(ref[len(ID_PREFIX) :]) else None
    if is_scope_ref(ref):
        try:
            path_of_scope_ref(ref)
        except ValueError:
            return None
        return "scope"
    for prefix, kind in ((TASK_PREFIX, "task"), (OUTCOME_PREFIX, "outcome")):
        if ref.startswith(prefix):
            return kind if _one_segment(ref[len(prefix) :]) else None
    if ref.startswith(PROBE_PREFIX):
        return "probe" if len(ref) > len(PROBE_PREFIX) else None
    if ref.startswith(VERDICT_PREFIX):
        return "verdict" if re.fullmatch(r"[0-9a-f]{20}", ref[len(VERDICT_PREFIX) :]) else None
    if ref.startswith(AUDIT_PREFIX):
        name = ref[len(AUDIT_PREFIX) :]
        return "audit" if name and "/" not in name else None
    return None


def _one_segment(name: str) -> bool:
    """Whether ``name`` is one encoded path segment (a task id in a ref name)."""
    try:
        decode_segment(name)
    except ValueError:
        return False
    return bool(name) and "/" not in name


LEASE_SHAPES = ("id", "scope", "task")  # the refs of a lease, deleted together


class _Push:
    """The lease-namespace updates of one push, and what is needed to judge them."""

    def __init__(self, updates: list[tuple[str, str, str]]) -> None:
        self.updates = updates
        self.ours = [(o, n, r) for o, n, r in updates if in_namespaces(r)]
        wanted = {x for o, n, r in self.ours if shape(r) in LEASE_SHAPES for x in (o, n) if not ZERO.match(x)}
        self.blobs, self.parents = read_objects(wanted)
        self.problems: list[str] = []
        self.scope_creates: dict[str, set[str]] = {}  # oid -> paths of the scope refs created at it
        self.id_creates: dict[str, str] = {}  # oid -> lease id
        self.task_creates: dict[str, set[str]] = {}  # oid -> task ids of the task refs created at it
        self.scope_deletes: dict[str, set[str]] = {}  # oid -> paths of the scope refs deleted (pinned to it)
        self.scope_changes: list[tuple[str, str, set[str], set[str]]] = []  # (id ref, new version, added, removed)
        self.resized: set[str] = set()  # scope refs an extend or a narrow of this push creates or deletes
        self.audit: list[dict] = []  # audit entries appended (parsed)
        self.outcome_objects: dict[str, tuple[str, bytes]] = {}  # what every outcome written needs, read at once
        self.landed: list[tuple[str, str, str, str]] = []  # (outcome ref, commit it says landed, branch, tip)

    def check(self) -> list[str]:
        outcomes = [(o, n) for o, n, r in self.ours if shape(r) == "outcome" and not ZERO.match(n)]
        if outcomes:  # one read for them all (a landing train's push writes one a task)
            self.outcome_objects = _cat([x for o, n in outcomes for x in _outcome_names(o, n)])
        for old, new, ref in self.ours:
            kind = shape(ref)
            if kind is None:
                self.problems.append(
                    f"{ref}: not a gitlease ref (only {ID_PREFIX}<lease>, {SCOPE_REF}[/<path>], "
                    f"{TASK_PREFIX}<task>, {OUTCOME_PREFIX}<task>, {PROBE_PREFIX}..., {VERDICT_PREFIX}<server> and "
                    f"{AUDIT_PREFIX}<writer> "
                    "live here)"
                )
            elif not ZERO.match(new):
                getattr(self, f"_write_{kind}")(old, new, ref)
            elif kind == "scope":
                try:
                    self.scope_deletes.setdefault(old, set()).add(path_of_scope_ref(ref))
                except ValueError:
                    pass
        self._check_landed()
        self._scope_changes()
        self._pair_creates()
        self._check_parked()
        self._check_deletes()
        return self.problems

    # -- creates and updates, one checker per shape
    def _write_id(self, old: str, new: str, ref: str) -> None:
        lid = ref[len(ID_PREFIX) :]
        rec, why = _parse(self.blobs.get(new))
        if rec is None:
            self.problems.append(f"{ref}: invalid record: {why}")
            return
        if rec.lease_id != lid:
            self.problems.append(f"{ref}: the record names lease {rec.lease_id}")
            return
        prev = None
        if ZERO.match(old):
            if rec.version != 1 or self.parents.get(new):
                self.problems.append(f"{ref}: a new lease must be version 1 without a parent commit")
                return
            self.id_creates[new] = lid
        else:
            prev, pwhy = _parse(self.blobs.get(old))
            if prev is None:
                self.problems.append(f"{ref}: the version it replaces is invalid ({pwhy})")
                return
            if self.parents.get(new) != (old,):
                self.problems.append(f"{ref}: not a next version (its parent must be exactly {old[:12]})")
                return
            if rec.version != prev.version + 1:
                self.problems.append(f"{ref}: version {rec.version} does not follow version {prev.version}")
                return
            changed = [f for f in SAME if getattr(rec, f) != getattr(prev, f)]
            if rec.paths != prev.paths:
                self.scope_changes.append(
                    (ref, new, set(rec.paths) - set(prev.paths), set(prev.paths) - set(rec.paths))
                )
            if changed:
                self.problems.append(f"{ref}: a renewal may not change {', '.join(changed)}")
                return
            if rec.renewed_at >= prev.expires_at:
                self.problems.append(
                    f"{ref}: renewed at {rec.renewed_at}, after the lease expired at {prev.expires_at}"
                )
                return
        sig = signature_problem(self.blobs[new], rec, prev)
        if sig:
            self.problems.append(f"{ref}: signature: {sig}")

    def _write_scope(self, old: str, new: str, ref: str) -> None:
        if not ZERO.match(old):
            self.problems.append(f"{ref}: scope refs never move while their lease lives")
            return
        self.scope_creates.setdefault(new, set()).add(path_of_scope_ref(ref))

    def _write_task(self, old: str, new: str, ref: str) -> None:
        if not ZERO.match(old):
            self.problems.append(f"{ref}: task refs never move while their lease lives")
            return
        self.task_creates.setdefault(new, set()).add(decode_segment(ref[len(TASK_PREFIX) :]))

    def _write_outcome(self, old: str, new: str, ref: str) -> None:
        """A queued task's outcome (gitlease.service.outcomes): a commit holding only its canonical record (and,
        signed, its signature), naming that task, whose first parent is the outcome it replaces (none for the
        first); signed by a key trusted for its writer on a signed store; moving only forward (a final outcome
        reopened only by a rerun); and, for a task done, naming a landed commit that the branch it names holds
        (after this push)."""
        from gitlease.service.outcomes import FILE, SIG_FILE, move_problem, parse_record

        got = self.outcome_objects
        kind, body = got.get(new, (None, b""))
        parents = commit_parents(body)
        kind_f, data = got.get(f"{new}:{FILE}", (None, b""))
        sig = got.get(f"{new}:{SIG_FILE}", (None, None))[1]
        tree = got.get(f"{new}^{{tree}}", (None, b""))[1]
        task = decode_segment(ref[len(OUTCOME_PREFIX) :])
        problem, doc = None, None
        if kind != "commit" or kind_f != "blob" or sorted(_tree_names(tree) or ()) not in ([FILE], [FILE, SIG_FILE]):
            problem = f"a commit holding only {FILE} (and, signed, {SIG_FILE})"
        elif parents != (() if ZERO.match(old) else (old,)):
            problem = "its parent must be exactly the outcome it replaces"
        else:
            doc, problem = parse_record(data, task)
        if doc is not None:
            from gitlease.identity.trust import check_outcome

            previous = None if ZERO.match(old) else parse_record(got.get(f"{old}:{FILE}", (None, b""))[1], task)[0]
            problem = (
                check_outcome(_server_trust(), doc, data, sig)
                or move_problem(previous, doc)
                or self._landed_problem(ref, doc)
            )
        if problem:
            self.problems.append(f"{ref}: not a gitlease task outcome ({problem})")

    def _landed_problem(self, ref: str, doc: dict) -> str | None:
        """A ``done`` outcome naming a commit: that commit must be on the branch it names, as this push leaves
        that branch (judged for all of the push's outcomes at once: _check_landed)."""
        landed, branch = doc.get("landed"), doc.get("branch")
        if doc.get("state") != "done" or landed is None or branch is None:
            return None
        if not isinstance(branch, str) or not branch.startswith("refs/heads/"):
            return f"the branch it landed on must be a branch, not {branch!r}"
        tip = next((n for _o, n, r in self.updates if r == branch), None)
        if tip is None:
            tip = gitq.rev_parse(HOOK, branch) or ""
        if not tip or ZERO.match(tip):
            return f"it names {branch}, which this repository does not have"
        self.landed.append((ref, str(landed), branch, tip))
        return None

    def _check_landed(self) -> None:
        """Each commit the push's outcomes say landed is on the branch each names (``_landed_problem``): one walk
        a branch for all of them, one check each only when that walk finds one that is not."""
        by_tip: dict[str, list[tuple[str, str, str]]] = {}
        for ref, landed, branch, tip in self.landed:
            by_tip.setdefault(tip, []).append((ref, landed, branch))
        for tip, claims in by_tip.items():
            commits = [landed for _r, landed, _b in claims]
            if gitq.all_reached(HOOK, tip, commits):
                continue
            for ref, landed, branch in claims:
                if not gitq.is_ancestor(HOOK, landed, tip):
                    self.problems.append(
                        f"{ref}: not a gitlease task outcome (the commit it says landed ({landed[:12]}) is not on "
                        f"{branch})"
                    )

    def _write_probe(self, old: str, new: str, ref: str) -> None:
        got = _cat([new, f"{new}^{{tree}}", f"{new}:{PROBE_FILE}"])
        kind, body = got.get(new, (None, b""))
        tree = got.get(f"{new}^{{tree}}", (None, b""))[1]
        kind_f, data = got.get(f"{new}:{PROBE_FILE}", (None, b""))
        parents = commit_parents(body)
        ok = (
            kind == "commit"
            and parents in ((), () if ZERO.match(old) else (old,))  # new, or a fast-forward of the probe before
            and kind_f == "blob"
            and data.startswith(PROBE_MAGIC)
            and len(data) <= PROBE_MAX_BYTES
            and _tree_names(tree) == [PROBE_FILE]
        )
        if not ok:
            self.problems.append(
                f"{ref}: not a doctor probe (a commit holding only {PROBE_FILE}, parentless or on top of the "
                f"probe it replaces); nothing else "
                f"may be parked under {PROBE_PREFIX}"
            )

    def _write_verdict(self, old: str, new: str, ref: str) -> None:
        """doctor's verdict (gitlease/service/verdict.py): a commit holding only its record (and, signed, its
        signature), on top of the verdict it replaces. Its signature is checked by its readers."""
        from gitlease.service.verdict import FILE, MAX_BYTES, SCHEMA, SIG

        got = _cat([new, f"{new}^{{tree}}", f"{new}:{FILE}"])
        kind, body = got.get(new, (None, b""))
        parents = commit_parents(body)
        names = _tree_names(got.get(f"{new}^{{tree}}", (None, b""))[1])
        kind_f, data = got.get(f"{new}:{FILE}", (None, b""))
        try:
            doc = json.loads(data.decode("utf-8")) if kind_f == "blob" and len(data) <= MAX_BYTES else None
        except (ValueError, UnicodeDecodeError):
            doc = None
        ok = (
            kind == "commit"
            and parents == (() if ZERO.match(old) else (old,))
            and names in ([FILE], sorted([FILE, SIG]))
            and isinstance(doc, dict)
            and doc.get("schema") == SCHEMA
        )
        if not ok:
            self.problems.append(
                f"{ref}: not a doctor verdict (a commit holding only {FILE} of schema {SCHEMA}, and {SIG} when "
                "signed, on top of the verdict it replaces)"
            )

    def _write_audit(self, old: str, new: str, ref: str) -> None:
        """An audit ref gains a chain of entries (a batched sweep appends several in one push): each a commit
        holding only the canonical entry (and, signed, its signature) whose first parent is the entry before it
        and, for the writer's first entry, at most the reclaimed version as its one parent; writer, prev and seq
        continue the log from ``old``. Every entry of the chain is judged and recorded."""
        from gitlease.service.audit import ENTRY_FILE, ENTRY_SIG

        where = f"{ref}: not a gitlease audit entry"
        before = None if ZERO.match(old) else old
        candidates = gitq.first_parents(HOOK, new, before, limit=MAX_AUDIT_CHAIN + 1) or [new]
        got = _cat([n for o in candidates for n in (o, f"{o}^{{tree}}", f"{o}:{ENTRY_FILE}", f"{o}:{ENTRY_SIG}")])
        chain = self._audit_chain(where, got, new, before)
        if chain is not None and self._audit_continues(ref, where, chain, before):
            self.audit.extend(doc for _cur, doc, _data, _sig in reversed(chain))

    def _audit_chain(
        self, where: str, got: dict[str, tuple[str, bytes]], new: str, old: str | None
    ) -> list[tuple[str, dict, bytes, bytes | None]] | None:
        """The entries from ``new`` down to ``old`` (None: the writer's first), newest first, each (commit,
        entry, its bytes, its signature), read from ``got``; None when one is not an entry (said in problems)."""
        from gitlease.service.audit import ENTRY_FILE, ENTRY_SIG, MAX_ENTRY_BYTES, SCHEMA, canonical

        chain: list[tuple[str, dict, bytes, bytes | None]] = []
        cur: str | None = new
        while cur is not None:
            if len(chain) >= MAX_AUDIT_CHAIN:
                self.problems.append(f"{where}: one push appends at most {MAX_AUDIT_CHAIN} entries")
                return None
            kind, body = got.get(cur, (None, b""))
            parents = commit_parents(body)
            kind_e, data = got.get(f"{cur}:{ENTRY_FILE}", (None, b""))
            sig = got.get(f"{cur}:{ENTRY_SIG}", (None, None))[1]
            tree = got.get(f"{cur}^{{tree}}", (None, b""))[1]
            expect = sorted([ENTRY_FILE, ENTRY_SIG] if sig is not None else [ENTRY_FILE])
            if (
                kind != "commit"
                or kind_e != "blob"
                or len(data) > MAX_ENTRY_BYTES
                or sorted(_tree_names(tree) or ()) != expect
            ):
                self.problems.append(f"{where} (a commit holding {ENTRY_FILE} and, signed, {ENTRY_SIG})")
                return None
            try:
                doc = json.loads(data.decode("utf-8"))
                if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or canonical(doc) != data:
                    raise ValueError("schema")
            except (ValueError, UnicodeDecodeError, RecursionError):
                self.problems.append(f"{where} ({ENTRY_FILE} is not a canonical {SCHEMA} entry)")
                return None
            chain.append((cur, doc, data, sig))
            prev = doc.get("prev")
            if prev is None or (old is not None and prev == old):
                if old is None and len(parents) > 1:
                    self.problems.append(f"{where}: a first entry has at most one parent (the reclaimed version)")
                    return None
                if old is not None and (not parents or parents[0] != old or len(parents) > 2):
                    self.problems.append(f"{where}: an entry's first parent is the entry before it ({old[:12]})")
                    return None
                cur = None
            elif not isinstance(prev, str) or not parents or parents[0] != prev or len(parents) > 2:
                self.problems.append(f"{where}: an entry's first parent is the entry before it ({str(prev)[:12]})")
                return None
            else:
                cur = prev
        return chain

    def _audit_continues(
        self, ref: str, where: str, chain: list[tuple[str, dict, bytes, bytes | None]], old: str | None
    ) -> bool:
        """Whether the entries of ``chain`` (newest first) continue the writer's log after ``old`` (None: the
        writer's first): writer, prev and seq, and on a signed store each entry's signature."""
        from gitlease.service.audit import ENTRY_FILE

        writer = ref[len(AUDIT_PREFIX) :]
        prev_seq: object = 0
        if old is not None:
            before = _cat([f"{old}:{ENTRY_FILE}"]).get(f"{old}:{ENTRY_FILE}", (None, b""))[1]
            try:
                prev_seq = json.loads(before.decode("utf-8")).get("seq")
            except (ValueError, UnicodeDecodeError, AttributeError):
                prev_seq = None
        expected_prev = old
        trust = _server_trust()
        for cur, doc, data, sig in reversed(chain):  # oldest first
            if (
                doc.get("writer") != writer
                or doc.get("prev") != expected_prev
                or not isinstance(prev_seq, int)
                or doc.get("seq") != prev_seq + 1
            ):
                self.problems.append(
                    f"{where}: writer, prev and seq must continue the log ({writer}, {str(expected_prev)[:12]}, "
                    f"{prev_seq + 1 if isinstance(prev_seq, int) else '?'})"
                )
                return False
            if trust.signed:
                from gitlease.identity.trust import check_audit_entry

                problem = check_audit_entry(trust, doc, data, sig)
                if problem:
                    self.problems.append(f"{ref}: audit entry signature: {problem}")
                    return False
            expected_prev, prev_seq = cur, prev_seq + 1
        return True

    # -- what must hold across the push
    def _scope_changes(self) -> None:
        """An extend or a narrow (a renewal whose scope differs from its parent's) creates, at the lease's
        grant, exactly the scope refs of the paths it adds, and deletes exactly those of the paths it removes,
        in the same push (docs/protocol.md, "Extend and narrow"). What it accounts for is taken out of the
        creates and deletes the other checks judge."""
        for ref, new, added, removed in self.scope_changes:
            grant = _root(new)
            made = self.scope_creates.get(grant, set()) if grant is not None and grant not in self.id_creates else set()
            gone = self.scope_deletes.get(grant, set()) if grant is not None else set()
            if grant is None or made != added or gone != removed:
                self.problems.append(
                    f"{ref}: a renewal may not change paths unless the same push creates, at the lease's grant, "
                    f"exactly the scope refs of the paths it adds ({' '.join(sorted(added)) or 'none'}) and deletes "
                    f"exactly those of the paths it removes ({' '.join(sorted(removed)) or 'none'})"
                )
                continue
            self.scope_creates.pop(grant, None)
            self.scope_deletes.pop(grant, None)
            self.resized |= {scope_ref(p) for p in added | removed}

    def _pair_creates(self) -> None:
        for oid, paths in self.scope_creates.items():
            rec, _ = _parse(self.blobs.get(oid))
            if oid not in self.id_creates or rec is None:
                self.problems.append(
                    f"scope refs {', '.join(sorted(paths))} created without their lease's id ref in the same push"
                )
            elif set(rec.paths) != paths:
                self.problems.append(
                    f"lease {rec.lease_id}: its scope refs must be created together and match its "
                    f"scope ({' '.join(rec.paths)})"
                )
        for oid, lid in self.id_creates.items():
            if oid not in self.scope_creates:
                self.problems.append(f"lease {lid}: created without its scope refs")
        for oid, tasks in self.task_creates.items():
            rec, _ = _parse(self.blobs.get(oid))
            if oid not in self.id_creates or rec is None or tasks != {rec.owner.task_id}:
                self.problems.append(
                    f"task refs {', '.join(sorted(tasks))}: created only with the lease of that task, at its "
                    "version 1, in the same push"
                )

    def _check_parked(self) -> None:
        """Task outcomes and parked work only move forward: an outcome ref, or a quarantine ref (created once,
        never overwritten), is deleted only by a prune that an audit entry of the same push records
        (``git lease work --prune``): otherwise deleting a done task's outcome would let it land again."""
        pruned = {r for d in self.audit if d.get("action") == "prune" for r in (d.get("refs") or {})}
        for old, new, ref in self.updates:
            if not (shape(ref) == "outcome" or parked(ref)) or ZERO.match(old):
                continue
            if not ZERO.match(new):
                if parked(ref):
                    self.problems.append(f"{ref}: parked work is never overwritten")
            elif ref not in pruned:
                self.problems.append(
                    f"{ref}: outcomes and parked work are deleted only by a recorded prune "
                    "(git lease work --prune AGE), never by a plain delete"
                )

    def _check_deletes(self) -> None:
        """Deletes of lease refs must be a release or a clear: whole leases (every ref the lease has here), and
        at most one lease that no audit entry of the same push names. A push that also updates other refs (a
        branch) may delete only leases their holders release in it: the landing train's push, which lands a
        task's commit and gives its lease back together (``released_by_holder``). Audit entries are never
        deleted. (A ``git push --mirror`` from a clone deletes every lease while it updates other refs:
        refused.)"""
        deletes = [(o, r) for o, n, r in self.ours if ZERO.match(n) and shape(r) != "probe" and r not in self.resized]
        if not deletes:
            return
        for _o, r in deletes:
            if shape(r) == "audit":
                self.problems.append(f"{r}: the audit log is append-only; its refs are never deleted")
        lease_deletes = [(o, r) for o, r in deletes if shape(r) in LEASE_SHAPES]
        if not lease_deletes:
            return
        on_server = _lease_refs_here()
        lease_of = _lease_ids({o for o in on_server.values()} | {o for o, _r in lease_deletes})
        deleted = {r for _o, r in lease_deletes}
        touched: dict[str, set[str]] = {}  # lease id (or ?oid) -> refs deleted
        for o, r in lease_deletes:
            touched.setdefault(_owner_of(r, o, lease_of), set()).add(r)
        for lid in sorted(touched):
            mine = {r for r, o in on_server.items() if _owner_of(r, o, lease_of) == lid}
            left = sorted(mine - deleted)
            if left:
                self.problems.append(
                    f"lease {lid}: a release or a clear deletes all its refs together; this push leaves "
                    f"{', '.join(left[:3])}{' ...' if len(left) > 3 else ''}"
                )
        named = {str(d.get("leaseId")) for d in self.audit}
        for d in self.audit:
            refs = got if isinstance(got := d.get("refs"), dict) else {}
            missing = [r for r in refs if r not in deleted]
            if missing:
                self.problems.append(
                    f"audit entry for {d.get('leaseId')}: the refs it records are not deleted by this push "
                    f"({', '.join(sorted(missing)[:3])})"
                )
        others = sorted(r for _o, _n, r in self.updates if not in_namespaces(r))
        unreleased = sorted(lid for lid in touched if not self.released_by_holder(lid, lease_deletes))
        if others and unreleased:
            self.problems.append(
                f"a push that deletes leases ({', '.join(unreleased[:3])}{' ...' if len(unreleased) > 3 else ''}) "
                f"may carry other refs (it also updates {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}) "
                "only when each lease it deletes is released in it by its holder (a release entry naming the "
                "version deleted, by the owner's key on a signed store): a release or a clear is its own push"
            )
            return
        unaudited = sorted(lid for lid in touched if lid not in named)
        if len(unaudited) > 1:
            self.problems.append(
                f"this push deletes {len(unaudited)} leases ({', '.join(unaudited[:3])}"
                f"{' ...' if len(unaudited) > 3 else ''}) with no audit entry: a release gives back one "
                "lease, a clear records each lease it removes (a git push --mirror deletes every lease)"
            )

    def released_by_holder(self, lease_id: str, lease_deletes: list[tuple[str, str]]) -> bool:
        """Whether this push gives ``lease_id`` back as its holder does: its id ref deleted at a valid version,
        and an audit entry of the push recording the release of exactly that version (on a signed store,
        signed by the key that version names as its owner's: ``_audit_continues`` checked the signature).
        Such a release is also the push's claim on the lease for the commits it lands (``releasing``)."""
        old = next((o for o, r in lease_deletes if r == ID_PREFIX + lease_id), None)
        rec = _parse(self.blobs.get(old))[0] if old is not None else None
        if rec is None or rec.lease_id != lease_id:
            return False
        entry = next(
            (
                d
                for d in self.audit
                if d.get("action") == "release" and d.get("leaseId") == lease_id and d.get("oid") == old
            ),
            None,
        )
        if entry is None:
            return False
        if _server_trust().signed:
            from gitlease.identity.commitsig import key_words

            owner = key_words(rec.owner.key)
            return owner is not None and key_words(entry.get("key")) == owner
        return True


def _root(oid: str) -> str | None:
    """Version 1 of the lease whose version ``oid`` is: the root of its history (one parent per version)."""
    roots = gitq.root_commits(HOOK, oid)
    return roots[0] if len(roots) == 1 else None


def _tree_names(body: bytes) -> list[str] | None:
    """The entry names of a raw tree object (``<mode> <name>\\0<binary object id>`` each; the id may hold NUL
    bytes), or None when it does not parse."""
    size = 32 if _object_format() == "sha256" else 20
    names, pos = [], 0
    while pos < len(body):
        sp = body.find(b" ", pos)
        nul = body.find(b"\0", sp + 1)
        if sp < 0 or nul < 0 or nul + 1 + size > len(body):
            return None
        names.append(body[sp + 1 : nul].decode("utf-8", "surrogateescape"))
        pos = nul + 1 + size
    return names


def _object_format() -> str:
    """The repository's object format, asked of git once per repository a hook process judges (every tree of a
    push is parsed with it)."""
    return _object_format_of(os.environ.get("GIT_DIR"), os.getcwd())


@functools.lru_cache(maxsize=4)
def _object_format_of(_git_dir: str | None, _cwd: str) -> str:
    return gitq.object_format(HOOK)


def _outcome_names(old: str, new: str) -> list[str]:
    """The objects judging the write of a task outcome from ``old`` to ``new`` reads (_Push._write_outcome)."""
    from gitlease.service.outcomes import FILE, SIG_FILE

    return [new, f"{new}^{{tree}}", f"{new}:{FILE}", f"{new}:{SIG_FILE}", f"{old}:{FILE}"]


def _cat(names: list[str]) -> dict[str, tuple[str, bytes]]:
    """{name: (type, content)} of the objects ``names`` name here (the quarantine included)."""
    return gitq.read_objects(HOOK, names)


def _lease_refs_here() -> dict[str, str]:
    """{ref: oid} of the lease refs (id, scope, task) on this repository now."""
    return {ref: oid for ref, oid in gitq.refs(HOOK, SCOPE_REF, NAMESPACE + "/").items() if shape(ref) in LEASE_SHAPES}


def _lease_ids(oids) -> dict[str, str]:
    """{oid: lease id its record names} for the lease commits among ``oids``."""
    blobs, _ = read_objects(oids)
    out = {}
    for oid, blob in blobs.items():
        rec, _ = _parse(blob)
        if rec is not None:
            out[oid] = rec.lease_id
    return out


def _owner_of(ref: str, oid: str, lease_of: dict[str, str]) -> str:
    """The lease a lease ref belongs to: the id ref's name, else the lease its (grant) record names, else the
    object itself (an unreadable record: refs at one object belong together)."""
    if ref.startswith(ID_PREFIX):
        return ref[len(ID_PREFIX) :]
    return lease_of.get(oid) or f"?{oid[:12]}"


def check_lease_updates(updates: list[tuple[str, str, str]]) -> list[str]:
    """Problems with the updates of one push under refs/leases/ and refs/leases-audit/ (``(old, new, ref)``,
    zero oids for none): anything that is not gitlease's own record shapes (``_Push``)."""
    push = _Push(updates)
    if not push.ours and not any(parked(r) for _o, _n, r in updates):
        return []
    return push.check()


def push_claims() -> set[str]:
    """Leases a push claims with ``-o lease=ID`` push options (a commit's ``Lease:`` trailers are its own)."""
    claims = set()
    for value in push_options():
        m = LEASE_OPTION.fullmatch(value)
        if m:
            claims.add(m.group(1))
    return claims


def push_options() -> list[str]:
    """GIT_PUSH_OPTION_0 .. GIT_PUSH_OPTION_<COUNT-1>. A COUNT that is not a plain number gives none (fewer
    claims: fail closed); a huge one costs no more than the environment holds."""
    count = os.environ.get("GIT_PUSH_OPTION_COUNT", "")
    n = int(count) if count.isascii() and count.isdigit() else 0
    prefix = "GIT_PUSH_OPTION_"
    found = {
        int(k[len(prefix) :]): v
        for k, v in os.environ.items()
        if k.startswith(prefix) and k[len(prefix) :].isascii() and k[len(prefix) :].isdigit()
    }
    return [found[i] for i in sorted(found) if i < n]


def pushed_commits(updates: list[tuple[str, str, str]]) -> list[claims_mod.Commit]:
    """The commits each branch or tag update brings to its ref: those its new value has and its old value has
    not (a new ref: those the default branch, HEAD, has not; before the first push, all of them). Not
    "those no ref has": a commit parked elsewhere first is judged when it reaches a branch. Every update in one
    walk (``claims.gained``), however many refs the push updates."""
    head = gitq.rev_parse_commit(HOOK, "HEAD")
    judged = [(o, n) for o, n, r in updates if not ZERO.match(n) and not in_namespaces(r) and not parked(r)]
    olds = {o for o, _n in judged if not ZERO.match(o)}
    found = _cat(sorted(olds)) if olds else {}
    known = {o for o in olds if found.get(o, ("", b""))[0] == "commit"}
    # an old value that is not a commit here (git always sends one it has): judged as a new ref
    ranges = [(new, (old,) if old in known else ((head,) if head else ())) for old, new in judged]
    return claims_mod.gained(HOOK, ranges)


def _anonymous(v: enforce.Violation) -> enforce.Violation:
    """The violation without the holder's lease id: the server hook prints how to claim a lease, and must not
    hand out another holder's id next to that."""
    h = v.holder
    if h is None:
        return v
    if h.invalid is not None:
        reason = f"held by an invalid lease ({h.invalid})"
    else:
        left = h.seconds_left
        when = "" if left is None else (f", {left}s left" if left >= 0 else ", expired, within the skew margin")
        reason = f"held by another lease (task={h.task} agent={h.agent}{when})"
    return enforce.Violation(v.path, v.scope, reason, h, v.code)


def check_branch_updates(updates: list[tuple[str, str, str]]) -> tuple[list[str], list[str]]:
    """Refusal lines (and notes) for branch and tag updates bringing commits that touch paths leased to someone
    else, judged commit by commit with the leases each may claim (gitlease.enforce.claims)."""
    if not any(not ZERO.match(n) and not in_namespaces(r) and not parked(r) for _o, n, r in updates):
        return [], []  # lease refs only (a claim, a renewal): none of the imports below, most of a hook's start
    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo
    from gitlease.service.leases import LeaseService

    repo = Repo.discover(".")
    settings = resolve(repo.config)
    mode = settings.enforce or "others"
    if mode == "off":
        return [], []
    commits = pushed_commits(updates)
    if not any(c.paths for c in commits):
        return [], []
    # only the leases bearing on the pushed paths, and those the push may claim (bearing.restrict_refs)
    touched = sorted({p for c in commits for p in c.paths})
    pushed_options = push_claims()
    claimed = (
        {lid for c in commits for lid in c.trailers}
        | pushed_options
        | {r[len(ID_PREFIX) :] for _o, _n, r in updates if shape(r) == "id"}
    )
    svc, untrusted = LeaseService(repo, settings), None
    try:
        snap = svc.snapshot(use_cache=False, paths=touched, keep=claimed)
    except RemoteUnavailable as exc:
        return [f"cannot read the lease store ({exc.message}); refusing rather than guessing"], []
    except InvalidRecord as exc:
        untrusted = exc.message
        svc, snap = _read_untrusted(repo, settings, touched, claimed)
    now = svc.clock.now()
    options = pushed_options if untrusted is None else set()
    # a fenced push (git lease push) renews its lease in the same push: that renewal, a valid next version
    # (signed by the owner key on a signed store: check_lease_updates), claims the lease for the push
    renewing = (
        {r[len(ID_PREFIX) :] for o, n, r in updates if shape(r) == "id" and not ZERO.match(o) and not ZERO.match(n)}
        if untrusted is None
        else set()
    )
    # the landing train's push releases the lease as it lands the task's commit: a push that deletes a lease
    # and updates a branch passes check_lease_updates (the same pre-receive run: any problem there refuses the
    # push) only when its holder releases it there (_Push.released_by_holder), which claims it like a renewal
    releasing = (
        {r[len(ID_PREFIX) :] for o, n, r in updates if shape(r) == "id" and not ZERO.match(o) and ZERO.match(n)}
        if untrusted is None
        else set()
    )
    renewing |= releasing
    check_mode = "strict" if mode == "strict" else "others"
    judged = claims_mod.judge(
        commits,
        (lambda c: c.trailers | options | renewing) if untrusted is None else (lambda c: set()),
        snap,
        check_mode,
        now,
        settings.skew,
        signed=snap.signed_store,
        raw=lambda oids: claims_mod.raw_commits(HOOK, oids),
        object_format=repo.object_format,
        proven=renewing,
    )
    if not judged.violations:
        return [], []
    lines = _refusal(judged, check_mode, mode == "warn", untrusted, snap.signed_store)
    if mode == "warn":
        return [], lines
    return lines, []


def _read_untrusted(repo, settings, paths: list[str], claimed: set[str]):
    """(a service, a snapshot of the leases bearing on ``paths`` and ``claimed``) read without trust: the trust
    file on HEAD does not parse. Refusing every push would also refuse the push that fixes it (this hook cannot
    be skipped): the leases are read without trust and no claim is honoured, so that every path inside any
    lease is refused and only paths outside all leases pass."""
    import dataclasses

    from gitlease.service.leases import LeaseService

    unread = os.path.join(repo.git_dir, "gitlease", "no-trust-file")  # absent: no trust, nothing required
    svc = LeaseService(repo, dataclasses.replace(settings, allowed_signers=unread))
    return svc, svc.snapshot(use_cache=False, paths=paths, keep=claimed)


def _refusal(judged: claims_mod.Judged, check_mode: str, warn: bool, untrusted: str | None, signed: bool) -> list[str]:
    """The server's refusal of the violations ``judged`` found (holders anonymous), with its notes and how a
    holder claims a lease."""
    violations = [_anonymous(v) for v in judged.violations]
    lines = [
        ln.removeprefix("gitlease: ")
        for ln in enforce.refusal(
            "push", check_mode, violations, warn=warn, why="server", mine="the leases this push may claim"
        )
    ]
    if lines[-1].startswith("acquire the scope first"):
        lines.pop()
    lines += judged.notes
    if judged.unsigned:
        lines.append(claims_mod.unsigned_hint(judged.unsigned, "BASE (where the branch starts)"))
    if untrusted is not None:
        lines.append(f"no lease claim is honoured until the trust file is fixed: {untrusted}")
    elif signed:
        lines.append(
            "a lease's holder claims it with git push -o lease=LEASE_ID (needs receive.advertisePushOptions) or "
            "a 'Lease: LEASE_ID' commit trailer, in commits signed (gpg.format=ssh) with the lease's owner key; "
            "see git lease status"
        )
    else:
        lines.append(
            "a lease's holder claims it with git push -o lease=LEASE_ID (needs receive.advertisePushOptions) or "
            "a 'Lease: LEASE_ID' commit trailer; on this unsigned store claims are not verified (docs/limits.md)"
        )
    return lines


parse_receive_lines = gitq.parse_pre_receive  # the hook's stdin (UsageError, exit 2, for a line git never gives)


def pre_receive(data: bytes) -> tuple[list[str], list[str]]:
    updates = parse_receive_lines(data)
    problems = check_lease_updates(updates)
    refusals, notes = check_branch_updates(updates)
    return problems + refusals, notes
