"""The independent checker: replays the server's transaction log (serverlog.py) and the lease objects in the
server's repository, and reports every anomaly. It trusts nothing the workers say, with one exception that can
only excuse, never accuse: a worker's "release-intent" line explains why an unexpired lease was deleted.

Properties checked (docs/reliability.md):
  P1  a scope ref is created or deleted, never moved from one lease to another (a `+` push would);
  P2  a lease's refs appear together in one transaction (id ref and every scope ref at version 1) and
      disappear together in one transaction;
  P3  every id-ref update is a proper successor: parent = previous version, version + 1, same lease, owner
      and key, made no later than the previous version's expiry (plus tolerance); its scope changes only
      with exactly the matching scope refs created (extend: at the lease's grant) or deleted (narrow) in
      the same transaction;
  P4  no two overlapping leases exist at once (read from the server's refs, not from git's refusal);
  P5  never two overlapping *active* leases: a lease is active from its grant until its last expiry unless its
      holder released it (or died: an audited ``dead-holder`` reclaim); every deletion other than a release is
      an audited reclaim (else an anomaly), and an audited reclaim before expiry for another reason is one;
  P6  fencing: every branch update lands in the same transaction as a proper renewal (P3 and P8 clean: CAS
      successor, made before the previous version's expiry by the server's clock + tolerance) of a lease that
      is live then (its refs exist, so it was not taken over), whose scope covers every path the update changes
      (``git diff`` of the old branch tip against the new one, in the server's repository);
  P7  the run ends with no lease left on the server (after one sweep, and an admin's forced release of what
      half-landed transactions left: invalid leases, which gitlease never reclaims by a rule);
  P8  signed runs (``signed=True``): every lease version carries ``lease.sig``, an SSHSIG (namespace gitlease)
      over its exact ``lease.json`` bytes by the key its record names as the owner's, and the trust file on the
      server's default branch (``.gitlease/allowed_signers``, parsed here, not by gitlease) lists that key for
      the owner's agent id with namespace gitlease; every audit entry is signed by a key the trust file lists.
      Signatures are checked in-process with ``gitlease.identity.sshsig.verify``; a random sample of lease versions is
      checked again, independently, with ``ssh-keygen -Y verify`` (OpenSSH's own code).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gitlease.core import record as records
from gitlease.core import refnames  # noqa: E402
from gitlease.core import scope as scopes
from gitlease.core.errors import InvalidRecord  # noqa: E402
from gitlease.core.refnames import ID_PREFIX, SCOPE_REF  # noqa: E402
from gitlease.identity import sshsig

from .serverlog import Txn, is_zero  # noqa: E402

AUDIT_PREFIXES = ("refs/leases-audit/",)
EARLY_RULES = ("dead-holder", "forced")  # audited reclaims that may come before expiry


@dataclass
class Lease:
    lease_id: str
    grant: str
    paths: tuple[str, ...]
    key: str | None
    created: float
    versions: list[tuple[str, records.Record]] = field(default_factory=list)
    complete: bool = True  # granted whole: its id ref and every scope ref in one transaction that fully landed
    present: set[str] = field(default_factory=set)  # its refs that exist now
    ended: float | None = None  # when a transaction first deleted any of its refs (a release or a reclaim)
    how: str = ""  # released | reclaimed | unexplained

    @property
    def expires(self) -> float:
        return self.versions[-1][1].expires


@dataclass
class Report:
    anomalies: list[str] = field(default_factory=list)
    transactions: int = 0
    leases: int = 0
    renewals: int = 0
    releases: int = 0
    reclaims: int = 0
    early_reclaims: int = 0
    branch_updates: int = 0
    fenced_updates: int = 0  # branch updates that passed P6
    signatures: int = 0  # lease versions and audit entries whose signature was verified (P8)
    ssh_keygen_verified: int = 0  # of those, lease versions verified again with ssh-keygen -Y verify
    half_landed: int = 0  # transactions a server death cut in the middle (git's files backend; docs/limits.md)
    half_grants: int = 0  # grants of which only some refs landed: never an active lease (nobody got it)
    remnants_cleared: int = 0  # refs left by a half-landed transaction, deleted later (audited)
    half_grants_undone: int = 0  # half grants deleted by their writer after its unclear push (not audited)

    def to_json(self) -> dict:
        return dict(self.__dict__)


class Objects:
    """Commit parents and blobs (a record and its signature) from the server's repository, one cat-file batch
    per request."""

    def __init__(self, bare: Path) -> None:
        self.bare = bare
        self.cache: dict[str, tuple[tuple[str, ...], bytes | None, bytes | None]] = {}

    def load(self, oids: set[str], blob: str = "lease.json", sig: str = "lease.sig") -> None:
        todo = sorted(o for o in oids if o not in self.cache)
        if not todo:
            return
        lines = "".join(f"{o}\n{o}:{blob}\n{o}:{sig}\n" for o in todo).encode()
        out = subprocess.run(
            ["git", "cat-file", "--batch"], cwd=self.bare, input=lines, capture_output=True, check=True
        ).stdout
        pos = 0
        for o in todo:
            parents, pos = self._commit(out, pos)
            data, pos = self._entry(out, pos)
            signature, pos = self._entry(out, pos)
            self.cache[o] = (parents, data, signature)

    @staticmethod
    def _entry(out: bytes, pos: int) -> tuple[bytes | None, int]:
        end = out.index(b"\n", pos)
        head = out[pos:end].split(b" ")
        if head[-1] == b"missing" or len(head) < 3:
            return None, end + 1
        size = int(head[2])
        body = out[end + 1 : end + 1 + size]
        return body, end + 1 + size + 1

    def _commit(self, out: bytes, pos: int) -> tuple[tuple[str, ...], int]:
        body, pos = self._entry(out, pos)
        parents = []
        for line in (body or b"").split(b"\n"):
            if not line:
                break
            if line.startswith(b"parent "):
                parents.append(line[7:].decode())
        return tuple(parents), pos

    def data(self, oid: str) -> bytes | None:
        return self.cache.get(oid, ((), None, None))[1]

    def signature(self, oid: str) -> bytes | None:
        return self.cache.get(oid, ((), None, None))[2]

    def record(self, oid: str) -> records.Record | None:
        blob = self.data(oid)
        if blob is None:
            return None
        try:
            return records.parse(blob)
        except Exception:
            return None

    def entry(self, oid: str) -> dict:
        blob = self.data(oid)
        try:
            return json.loads(blob) if blob else {}
        except ValueError:
            return {}

    def parents(self, oid: str) -> tuple[str, ...]:
        return self.cache.get(oid, ((), None, None))[0]


TRUST_FILE = ".gitlease/allowed_signers"


def read_trust(bare: Path) -> dict[str, tuple[set[str], str]] | None:
    """The trust file on the server's default branch, parsed here (the harness writes plain lines:
    ``principal[,principal...] namespaces="a,b" ssh-ed25519 <b64>``): principal -> (namespaces, key). None when
    there is none. Anything this simple parser does not understand is left out, so it can only refuse more."""
    out = subprocess.run(["git", "show", f"HEAD:{TRUST_FILE}"], cwd=bare, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    trust: dict[str, tuple[set[str], str]] = {}
    for line in out.stdout.splitlines():
        words = line.split()
        if len(words) < 4 or line.startswith("#") or not words[1].startswith('namespaces="'):
            continue
        namespaces = set(words[1][len('namespaces="') :].rstrip('"').split(","))
        for principal in words[0].split(","):
            trust[principal] = (namespaces, f"{words[2]} {words[3]}")
    return trust


class Signatures:
    """P8: signature checks against the server's trust file, and the sample for ``ssh-keygen -Y verify``."""

    def __init__(self, bare: Path, objs: Objects, trust: dict[str, tuple[set[str], str]] | None) -> None:
        self.bare, self.objs, self.trust = bare, objs, trust
        self.checked = 0
        self.verified: list[tuple[str, str]] = []  # (oid, principal) of lease versions that verified

    def _signer(self, oid: str, what: str, sig_file: str) -> tuple[str | None, str | None]:
        """(the key whose SSHSIG over ``oid``'s bytes verifies, None) or (None, the problem)."""
        if self.trust is None:
            return None, f"no trust file {TRUST_FILE} on the server's default branch"
        sig, data = self.objs.signature(oid), self.objs.data(oid)
        if sig is None or data is None:
            return None, f"{what}unsigned (no {sig_file})"
        try:
            key = sshsig.verify(sig.decode("ascii", "replace"), data, "gitlease")
        except InvalidRecord as exc:
            return None, f"{what}signature: {exc}"
        self.checked += 1
        return key, None

    def lease_version(self, oid: str, rec: records.Record) -> str | None:
        """A problem with the signature of lease version ``oid`` (None: signed by its owner)."""
        key, problem = self._signer(oid, "", "lease.sig")
        if key is None:
            return problem
        owner_key = " ".join((rec.owner.key or "").split()[:2])
        if key != owner_key:
            return f"signed by {sshsig.fingerprint_of(key)}, not by the owner key its record names"
        namespaces, trusted = self.trust.get(rec.owner.agent_id, (set(), ""))
        if trusted != key or "gitlease" not in namespaces:
            return f"key {sshsig.fingerprint_of(key)} is not the trust file's key for {rec.owner.agent_id!r}"
        self.verified.append((oid, rec.owner.agent_id))
        return None

    def audit_entry(self, oid: str) -> str | None:
        key, problem = self._signer(oid, "audit entry ", "entry.sig")
        if key is None:
            return problem
        if not any(k == key for _, k in self.trust.values()):
            return f"audit entry signed by {sshsig.fingerprint_of(key)}, a key the trust file does not list"
        return None

    def ssh_keygen(self, sample: int, seed: int | None) -> tuple[int, list[str]]:
        """Verify ``sample`` random verified lease versions again with ``ssh-keygen -Y verify`` against the
        trust file as committed on the server (OpenSSH's parser and crypto, not gitlease's)."""
        picks = random.Random(seed).sample(self.verified, min(sample, len(self.verified)))
        if not picks:
            return 0, []
        problems = []
        with tempfile.TemporaryDirectory(prefix="soak-verify-") as tmp:
            allowed = Path(tmp) / "allowed_signers"
            allowed.write_bytes(
                subprocess.run(
                    ["git", "show", f"HEAD:{TRUST_FILE}"], cwd=self.bare, capture_output=True, check=True
                ).stdout
            )
            sigfile = Path(tmp) / "lease.sig"
            for oid, principal in picks:
                sigfile.write_bytes(self.objs.signature(oid) or b"")
                res = subprocess.run(
                    [
                        "ssh-keygen",
                        "-Y",
                        "verify",
                        "-f",
                        str(allowed),
                        "-I",
                        principal,
                        "-n",
                        "gitlease",
                        "-s",
                        str(sigfile),
                    ],
                    input=self.objs.data(oid),
                    capture_output=True,
                )
                if res.returncode != 0:
                    problems.append(
                        f"ssh-keygen -Y verify refuses version {oid[:10]} of {principal}: "
                        f"{res.stderr.decode(errors='replace').strip()[:120]}"
                    )
        return len(picks) - len(problems), problems


def changed_paths(bare: Path, old: str, new: str) -> list[str]:
    argv = (
        ["git", "diff", "--name-only", "--no-renames", "-z", old, new]
        if not is_zero(old)
        else ["git", "ls-tree", "-r", "--name-only", "-z", new]
    )
    out = subprocess.run(argv, cwd=bare, capture_output=True, check=True).stdout.decode("utf-8", "replace")
    return [p for p in out.split("\0") if p]


def check(
    bare: Path,
    txns: list[Txn],
    *,
    tolerance: float,
    release_intents: set[str] = frozenset(),
    final_refs: dict[str, str] | None = None,
    signed: bool = False,
    ssh_keygen_sample: int = 0,
    seed: int | None = None,
) -> Report:
    """Replay ``txns`` (the server's committed transactions, in order) and report anomalies.

    ``tolerance``: seconds of disagreement allowed between the server's clock and the times in the records
    (workers' clock offsets, the records' one-second resolution, scheduling).

    A transaction the server process died in while committing (``Txn.partial``: git's files backend renames
    ref locks one by one) is not itself an anomaly, but what it leaves is checked: a grant of which only some
    refs landed was never answered, so nobody holds it (it must never be renewed, and it must not let an
    overlapping scope ref in); a release or reclaim of which only some refs landed ends the lease (its holder
    was told nothing was released, and stops), and what it left behind must later go by an audited reclaim."""
    rep = Report(transactions=len(txns))
    bad = rep.anomalies.append
    objs = Objects(bare)
    every = [u for t in txns for u in (t.prepared or t.updates)]
    objs.load(
        {
            new
            for _, new, ref in every
            if not is_zero(new) and ref.startswith("refs/leases/") and not ref.startswith(AUDIT_PREFIXES)
        }
    )
    objs.load(
        {new for _, new, ref in every if not is_zero(new) and ref.startswith(AUDIT_PREFIXES)},
        blob="entry.json",
        sig="entry.sig",
    )
    sigs = Signatures(bare, objs, read_trust(bare)) if signed else None
    state: dict[str, str] = {}
    leases: dict[str, Lease] = {}  # every lease seen, by id
    owner_of: dict[str, Lease] = {}  # lease ref that exists now -> its lease
    gone: list[Lease] = []  # ended leases, for P5

    def proper_renewal(lease: Lease | None, old: str, new: str, t: Txn) -> tuple[list[str], records.Record | None]:
        rec = objs.record(new)
        if lease is None or rec is None:
            return ["no known lease, or no readable record"], rec
        if not lease.complete:
            return ["renewal of a lease that was never granted whole (nobody was told it was theirs)"], rec
        if lease.ended is not None:
            return ["renewal after the lease began to be released or reclaimed"], rec
        prev_oid, prev = lease.versions[-1]
        problems = []
        if old != prev_oid:
            problems.append("old value is not the current version")
        if objs.parents(new) != (prev_oid,):
            problems.append("parent is not the previous version")
        if rec.version != prev.version + 1:
            problems.append(f"version {rec.version} after {prev.version}")
        if (rec.lease_id, rec.acquired_at, rec.owner.key, rec.owner.agent_id) != (
            prev.lease_id,
            prev.acquired_at,
            prev.owner.key,
            prev.owner.agent_id,
        ):
            problems.append("lease, acquiredAt or owner changed")
        if rec.paths != prev.paths:  # an extend or a narrow: the scope refs change with it, in this transaction
            added = {_scope_ref(p) for p in set(rec.paths) - set(prev.paths)}
            removed = {_scope_ref(p) for p in set(prev.paths) - set(rec.paths)}
            made = {r for o, n, r in t.updates if is_zero(o) and n == lease.grant and not r.startswith(ID_PREFIX)}
            gone_now = {r for o, n, r in t.updates if is_zero(n) and o == lease.grant and not r.startswith(ID_PREFIX)}
            if made != added or gone_now != removed:
                problems.append("scope changed without exactly the matching scope refs created or deleted")
        if t.time > prev.expires + tolerance:
            problems.append(f"renewed {t.time - prev.expires:.1f}s after expiry")
        if sigs is not None:  # P8
            problem = sigs.lease_version(new, rec)
            if problem:
                problems.append(problem)
        return problems, rec

    for t in txns:
        ups = t.updates
        for old, new, ref in ups:
            seen = state.get(ref, "0" * 40)
            if not (is_zero(old) and is_zero(seen)) and old != seen:
                bad(f"txn {t.seq}: {ref} changed from {old[:10]} but the server log had it at {seen[:10]}")
        if t.partial:
            rep.half_landed += 1
        entries = [objs.entry(n) for _, n, ref in ups if ref.startswith(AUDIT_PREFIXES) and not is_zero(n)]
        if sigs is not None:  # P8, audit entries
            for _, n, ref in ups:
                if ref.startswith(AUDIT_PREFIXES) and not is_zero(n):
                    problem = sigs.audit_entry(n)
                    if problem:
                        bad(f"txn {t.seq}: {ref} at {n[:10]}: {problem}")
        # a holder's release is recorded in the audit log too (action "release", issue 21): that is a release,
        # judged by the harness's release intents below, not an audited reclaim
        logged_releases = {e.get("leaseId") for e in entries if e.get("action") == "release"}
        entries = [e for e in entries if e.get("action") != "release"]
        audited = bool(entries)
        early_ok = {e.get("leaseId") for e in entries if e.get("rule") in EARLY_RULES}
        lease_ups = [
            (o, n, r) for o, n, r in ups if r.startswith(ID_PREFIX) or r == SCOPE_REF or r.startswith(SCOPE_REF + "/")
        ]
        branches = [(o, n, r) for o, n, r in ups if r.startswith("refs/heads/")]
        for old, new, ref in lease_ups:  # P1
            if not ref.startswith(ID_PREFIX) and not is_zero(old) and not is_zero(new):
                bad(f"txn {t.seq}: scope ref {ref} moved from {old[:10]} to {new[:10]} (a lease overwritten)")

        # leases whose id ref moves in this transaction (a renewal, an extend, a narrow): scope refs of theirs
        # deleted (a narrow) or created at their grant (an extend) are not an end or a grant
        moving = {
            ref[len(ID_PREFIX) :]
            for old, new, ref in lease_ups
            if ref.startswith(ID_PREFIX) and not is_zero(old) and not is_zero(new)
        }

        # ---- deletions: releases, reclaims, and the clearing of what half-landed transactions left
        deleted: dict[str, list[str]] = {}
        for old, new, ref in lease_ups:
            if is_zero(new) and not is_zero(old):
                holder = owner_of.get(ref)
                if holder is not None and holder.lease_id in moving and not ref.startswith(ID_PREFIX):
                    owner_of.pop(ref)  # a narrow: the holder gives the path back (P3 checks it matches)
                    holder.present.discard(ref)
                    continue
                lease = owner_of.pop(ref, None)
                if lease is None:
                    bad(f"txn {t.seq}: {ref} deleted but no lease was known to have it")
                    continue
                lease.present.discard(ref)
                deleted.setdefault(lease.lease_id, []).append(ref)
        forced = {e.get("leaseId") for e in entries if e.get("rule") == "forced"}
        for lid in sorted(str(x) for x in logged_releases - set(deleted)):
            bad(f"txn {t.seq}: a release of {lid} logged, but none of its refs deleted in that transaction")
        for lid, refs in deleted.items():
            lease = leases[lid]
            if lid in forced and lease.complete and lease.ended is None:  # only the harness's admin forces
                bad(f"txn {t.seq}: {lid} force-released whole: only what a half-landed transaction left may be")
            if lease.present and not t.partial:  # P2
                bad(f"txn {t.seq}: {lid} deleted without all of its refs ({sorted(lease.present)[:3]} stay)")
            if lease.ended is not None or not lease.complete:  # a remnant (or a half grant) cleared
                if audited or lid in release_intents:
                    rep.remnants_cleared += 1
                elif lease.ended is None:
                    # a half grant (never answered: nobody held it) deleted unaudited: its writer's own clean-up
                    # after the unclear push (LeaseService._undo_partial, pinned to its own objects)
                    rep.half_grants_undone += 1
                else:
                    bad(f"txn {t.seq}: refs of {lid} ({refs[:2]}) deleted with neither a release nor an audit entry")
                continue
            lease.ended = t.time
            early = lease.expires > t.time + tolerance
            if audited:
                lease.how = "reclaimed"
                rep.reclaims += 1
                if early and lid in early_ok:
                    rep.early_reclaims += 1  # its holder was gone (or an admin forced it): not active
                    lease.how = "released"
                elif early:
                    bad(f"txn {t.seq}: {lid} reclaimed {lease.expires - t.time:.1f}s before its expiry")
            elif lid in release_intents:
                lease.how = "released"
                rep.releases += 1
            elif lid in logged_releases:
                lease.how = "unexplained"
                bad(f"txn {t.seq}: {lid} released (audit log) by someone other than its holder")
            else:
                lease.how = "unexplained"
                bad(
                    f"txn {t.seq}: {lid} deleted ({lease.expires - t.time:.1f}s before its expiry) with neither "
                    f"a release by its holder nor an audit entry: an unaudited reclaim"
                )
            gone.append(lease)

        # ---- grants (whole, or half-landed)
        created: dict[str, list[str]] = {}  # grant oid -> refs created at it
        for old, new, ref in lease_ups:
            if is_zero(old) and not is_zero(new):
                created.setdefault(new, []).append(ref)
        for grant, refs in created.items():
            rec = objs.record(grant)
            lid = rec.lease_id if rec else "?"
            if lid in moving and lid in leases and leases[lid].grant == grant and id_ref_of(lid) not in refs:
                lease = leases[lid]  # an extend (P3 checks it matches the new version's scope)
                new_paths = [path_of(r) for r in refs]
                for other in {id(x): x for x in owner_of.values()}.values():  # P4
                    theirs = [path_of(r) for r in other.present if not r.startswith(ID_PREFIX)]
                    if other is not lease and scopes.sets_overlap(theirs, new_paths):
                        bad(
                            f"txn {t.seq}: {lid} extended by {' '.join(new_paths)} while {other.lease_id} "
                            f"({' '.join(theirs)}) still holds scope refs"
                        )
                lease.present.update(refs)
                for r in refs:
                    owner_of[r] = lease
                continue
            if rec is None or rec.version != 1:
                bad(f"txn {t.seq}: {refs[:2]} created at {grant[:10]}, which is not version 1 of a lease")
                continue
            want = sorted([id_ref_of(lid)] + [_scope_ref(p) for p in rec.paths])
            if any(r not in want for r in refs):
                bad(f"txn {t.seq}: {lid} granted with refs {sorted(refs)[:3]}, its record says {want[:3]}")
                continue
            problem = sigs.lease_version(grant, rec) if sigs is not None else None
            if problem:  # P8
                bad(f"txn {t.seq}: grant of {lid}: {problem}")
            if lid in leases:
                bad(f"txn {t.seq}: {lid} granted a second time")
                continue
            complete = sorted(refs) == want
            if not complete and not t.partial:  # P2
                bad(f"txn {t.seq}: {lid} granted with refs {sorted(refs)}, its record says {want}")
            if not complete:
                rep.half_grants += 1
            new_paths = [path_of(r) for r in refs if r != id_ref_of(lid)]
            for other in {id(x): x for x in owner_of.values()}.values():  # P4, from the scope refs on the server
                theirs = [path_of(r) for r in other.present if not r.startswith(ID_PREFIX)]
                if scopes.sets_overlap(theirs, new_paths):
                    bad(
                        f"txn {t.seq}: {lid} ({' '.join(rec.paths)}) granted while {other.lease_id} "
                        f"({' '.join(theirs)}) still holds scope refs"
                    )
            if complete:
                for prev in gone:  # P5
                    if (
                        scopes.sets_overlap(prev.paths, rec.paths)
                        and prev.how != "released"
                        and prev.expires > t.time + tolerance
                    ):
                        bad(
                            f"txn {t.seq}: {lid} granted {prev.expires - t.time:.1f}s before the expiry of "
                            f"{prev.lease_id}, which was {prev.how or 'removed'} (not released by its holder)"
                        )
                rep.leases += 1
            lease = Lease(
                lid, grant, rec.paths, rec.owner.key, t.time, [(grant, rec)], complete=complete, present=set(refs)
            )
            leases[lid] = lease
            for r in refs:
                owner_of[r] = lease

        # ---- renewals (P3), and which of them fence a branch update in this transaction (P6)
        renewed: list[Lease] = []
        landed = {r for _, _, r in ups}
        for old, new, ref in [u for u in (t.prepared or ups) if u[2].startswith(ID_PREFIX)]:
            if is_zero(old) or is_zero(new):
                continue
            lease = leases.get(ref[len(ID_PREFIX) :])
            problems, rec = proper_renewal(lease, old, new, t)
            if ref not in landed:  # locked and compare-and-swap checked, then the server died: a fence all the same
                if not problems:
                    renewed.append(lease)
                continue
            for p in problems:
                bad(f"txn {t.seq}: renewal of {ref[len(ID_PREFIX) :]} to {new[:10]}: {p}")
            if lease is not None and rec is not None:
                lease.versions.append((new, rec))
                lease.paths = rec.paths  # an extend or a narrow moves what it covers (P5, P6)
                if not problems:
                    renewed.append(lease)
            rep.renewals += 1
        for old, new, ref in branches:  # P6
            rep.branch_updates += 1
            if is_zero(new):
                continue
            if not renewed:
                bad(
                    f"txn {t.seq}: {ref} updated without a proper renewal of a live lease in the same "
                    f"transaction (unfenced)"
                )
                continue
            covered = [p for lease in renewed for p in lease.paths]
            outside = [p for p in changed_paths(bare, old, new) if not scopes.covers(covered, p)]
            if outside:
                bad(
                    f"txn {t.seq}: {ref} changed {outside[:3]} outside the scope of "
                    f"{', '.join(lease.lease_id for lease in renewed)}"
                )
            else:
                rep.fenced_updates += 1
        for old, new, ref in ups:
            if is_zero(new):
                state.pop(ref, None)
            else:
                state[ref] = new
    leftover = sorted(
        r
        for r in (final_refs if final_refs is not None else state)
        if r.startswith("refs/leases/") and not r.startswith(AUDIT_PREFIXES)
    )
    if leftover:  # P7
        bad(f"{len(leftover)} lease refs left on the server at the end: {leftover[:3]}")
    if sigs is not None:
        rep.signatures = sigs.checked
        if ssh_keygen_sample:
            rep.ssh_keygen_verified, problems = sigs.ssh_keygen(ssh_keygen_sample, seed)
            rep.anomalies.extend(problems)
    return rep


def id_ref_of(lease_id: str) -> str:
    return ID_PREFIX + lease_id


def path_of(ref: str) -> str:
    suffix = ref[len(SCOPE_REF) + 1 :] if ref.startswith(SCOPE_REF + "/") else ""
    return refnames.from_ref_suffix(suffix) if suffix else "."  # the scope ref itself: the whole repository


def _scope_ref(path: str) -> str:
    suffix = refnames.to_ref_suffix(path)
    return f"{SCOPE_REF}/{suffix}" if suffix else SCOPE_REF


def read_intents(folder: Path) -> set[str]:
    out = set()
    for f in Path(folder).glob("*.events"):
        for line in f.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line cut by a SIGKILL
            if ev.get("event") == "release-intent":
                out.add(ev["lease"])
    return out
