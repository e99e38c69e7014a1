"""The independent checker: replays the server's transaction log (serverlog.py) and the lease objects in the
server's repository, and reports every anomaly. It trusts nothing the workers say, with one exception that can
only excuse, never accuse: a worker's "release-intent" line explains why an unexpired lease was deleted.

Properties checked (docs/reliability.md):
  P1  a scope ref is created or deleted, never moved from one lease to another (a `+` push would);
  P2  a lease's refs appear together in one transaction (id ref and every scope ref at version 1) and
      disappear together in one transaction;
  P3  every id-ref update is a proper successor: parent = previous version, version + 1, same lease, scope,
      owner and key, made no later than the previous version's expiry (plus tolerance);
  P4  no two overlapping leases exist at once (read from the server's refs, not from git's refusal);
  P5  never two overlapping *active* leases: a lease is active from its grant until its last expiry unless its
      holder released it (or died: an audited ``dead-holder`` reclaim); every deletion other than a release is
      an audited reclaim (else an anomaly), and an audited reclaim before expiry for another reason is one;
  P6  fencing: every branch update lands in the same transaction as a proper renewal (P3 and P8 clean: CAS
      successor, made before the previous version's expiry by the server's clock + tolerance) of a lease that
      is live then (its refs exist, so it was not taken over), whose scope covers every path the update changes
      (``git diff`` of the old branch tip against the new one, in the server's repository);
  P7  the run ends with no lease left on the server;
  P8  signed runs (``signed=True``): every lease version carries ``lease.sig``, an SSHSIG (namespace gitlease)
      over its exact ``lease.json`` bytes by the key its record names as the owner's, and the trust file on the
      server's default branch (``.gitlease/allowed_signers``, parsed here, not by gitlease) lists that key for
      the owner's agent id with namespace gitlease; every audit entry is signed by a key the trust file lists.
      Signatures are checked in-process with ``gitlease.sshsig.verify``; a random sample of lease versions is
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

from gitlease import record as records  # noqa: E402
from gitlease import scope as scopes  # noqa: E402
from gitlease import sshsig  # noqa: E402
from gitlease.errors import InvalidRecord  # noqa: E402
from gitlease.store import ID_PREFIX, SCOPE_REF  # noqa: E402

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
    deleted: float | None = None
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
        out = subprocess.run(["git", "cat-file", "--batch"], cwd=self.bare, input=lines, capture_output=True,
                             check=True).stdout
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
        body = out[end + 1:end + 1 + size]
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
        namespaces = set(words[1][len('namespaces="'):].rstrip('"').split(","))
        for principal in words[0].split(","):
            trust[principal] = (namespaces, f"{words[2]} {words[3]}")
    return trust


class Signatures:
    """P8: signature checks against the server's trust file, and the sample for ``ssh-keygen -Y verify``."""

    def __init__(self, bare: Path, objs: Objects, trust: dict[str, tuple[set[str], str]] | None) -> None:
        self.bare, self.objs, self.trust = bare, objs, trust
        self.checked = 0
        self.verified: list[tuple[str, str]] = []  # (oid, principal) of lease versions that verified

    def lease_version(self, oid: str, rec: records.Record) -> str | None:
        """A problem with the signature of lease version ``oid`` (None: signed by its owner)."""
        if self.trust is None:
            return f"no trust file {TRUST_FILE} on the server's default branch"
        sig, data = self.objs.signature(oid), self.objs.data(oid)
        if sig is None or data is None:
            return "unsigned (no lease.sig)"
        try:
            key = sshsig.verify(sig.decode("ascii", "replace"), data, "gitlease")
        except InvalidRecord as exc:
            return f"signature: {exc}"
        self.checked += 1
        owner_key = " ".join((rec.owner.key or "").split()[:2])
        if key != owner_key:
            return f"signed by {sshsig.fingerprint_of(key)}, not by the owner key its record names"
        namespaces, trusted = self.trust.get(rec.owner.agent_id, (set(), ""))
        if trusted != key or "gitlease" not in namespaces:
            return f"key {sshsig.fingerprint_of(key)} is not the trust file's key for {rec.owner.agent_id!r}"
        self.verified.append((oid, rec.owner.agent_id))
        return None

    def audit_entry(self, oid: str) -> str | None:
        if self.trust is None:
            return f"no trust file {TRUST_FILE} on the server's default branch"
        sig, data = self.objs.signature(oid), self.objs.data(oid)
        if sig is None or data is None:
            return "audit entry unsigned (no entry.sig)"
        try:
            key = sshsig.verify(sig.decode("ascii", "replace"), data, "gitlease")
        except InvalidRecord as exc:
            return f"audit entry signature: {exc}"
        self.checked += 1
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
            allowed.write_bytes(subprocess.run(["git", "show", f"HEAD:{TRUST_FILE}"], cwd=self.bare,
                                               capture_output=True, check=True).stdout)
            sigfile = Path(tmp) / "lease.sig"
            for oid, principal in picks:
                sigfile.write_bytes(self.objs.signature(oid) or b"")
                res = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", principal,
                                      "-n", "gitlease", "-s", str(sigfile)], input=self.objs.data(oid),
                                     capture_output=True)
                if res.returncode != 0:
                    problems.append(f"ssh-keygen -Y verify refuses version {oid[:10]} of {principal}: "
                                    f"{res.stderr.decode(errors='replace').strip()[:120]}")
        return len(picks) - len(problems), problems


def changed_paths(bare: Path, old: str, new: str) -> list[str]:
    argv = ["git", "diff", "--name-only", "--no-renames", "-z", old, new] if not is_zero(old) else \
        ["git", "ls-tree", "-r", "--name-only", "-z", new]
    out = subprocess.run(argv, cwd=bare, capture_output=True, check=True).stdout.decode("utf-8", "replace")
    return [p for p in out.split("\0") if p]


def check(bare: Path, txns: list[Txn], *, tolerance: float, release_intents: set[str] = frozenset(),
          final_refs: dict[str, str] | None = None, signed: bool = False, ssh_keygen_sample: int = 0,
          seed: int | None = None) -> Report:
    """Replay ``txns`` (the server's committed transactions, in order) and report anomalies.

    ``tolerance``: seconds of disagreement allowed between the server's clock and the times in the records
    (workers' clock offsets, the records' one-second resolution, scheduling)."""
    rep = Report(transactions=len(txns))
    bad = rep.anomalies.append
    objs = Objects(bare)
    objs.load({new for t in txns for _, new, ref in t.updates if not is_zero(new) and ref.startswith("refs/leases/")
               and not ref.startswith(AUDIT_PREFIXES)})
    objs.load({new for t in txns for _, new, ref in t.updates if not is_zero(new) and ref.startswith(AUDIT_PREFIXES)},
              blob="entry.json", sig="entry.sig")
    sigs = Signatures(bare, objs, read_trust(bare)) if signed else None
    state: dict[str, str] = {}
    live: dict[str, Lease] = {}  # lease id -> lease whose refs exist
    gone: list[Lease] = []
    for t in txns:
        ups = t.updates
        for old, new, ref in ups:
            seen = state.get(ref, "0" * 40)
            if not (is_zero(old) and is_zero(seen)) and old != seen:
                bad(f"txn {t.seq}: {ref} changed from {old[:10]} but the server log had it at {seen[:10]}")
        if t.partial:
            bad(f"txn {t.seq}: only part of a transaction landed (its server process died mid-commit): "
                f"{[r for _, _, r in ups]}")
        entries = [objs.entry(n) for _, n, ref in ups if ref.startswith(AUDIT_PREFIXES) and not is_zero(n)]
        if sigs is not None:  # P8, audit entries
            for _, n, ref in ups:
                if ref.startswith(AUDIT_PREFIXES) and not is_zero(n):
                    problem = sigs.audit_entry(n)
                    if problem:
                        bad(f"txn {t.seq}: {ref} at {n[:10]}: {problem}")
        audited = bool(entries)
        early_ok = {e.get("leaseId") for e in entries if e.get("rule") in EARLY_RULES}
        ids = [(o, n, r) for o, n, r in ups if r.startswith(ID_PREFIX)]
        scope_ups = [(o, n, r) for o, n, r in ups if r == SCOPE_REF or r.startswith(SCOPE_REF + "/")]
        branches = [(o, n, r) for o, n, r in ups if r.startswith("refs/heads/")]
        for old, new, ref in scope_ups:  # P1
            if not is_zero(old) and not is_zero(new):
                bad(f"txn {t.seq}: scope ref {ref} moved from {old[:10]} to {new[:10]} (a lease overwritten)")
        renewed: list[Lease] = []  # leases properly renewed in this transaction: what fences a branch update
        for old, new, ref in ids:
            lid = ref[len(ID_PREFIX):]
            if is_zero(old):  # a grant
                rec = objs.record(new)
                if rec is None or rec.version != 1 or rec.lease_id != lid:
                    bad(f"txn {t.seq}: {ref} created at {new[:10]}, which is not version 1 of {lid}")
                    continue
                problem = sigs.lease_version(new, rec) if sigs is not None else None
                if problem:  # P8
                    bad(f"txn {t.seq}: grant of {lid}: {problem}")
                mine = sorted(r for o, n, r in scope_ups if is_zero(o) and n == new)
                want = sorted(_scope_ref(p) for p in rec.paths)
                if mine != want:  # P2
                    bad(f"txn {t.seq}: {lid} granted with scope refs {mine}, its record says {want}")
                for other in live.values():  # P4
                    if scopes.sets_overlap(other.paths, rec.paths):
                        bad(f"txn {t.seq}: {lid} ({' '.join(rec.paths)}) granted while {other.lease_id} "
                            f"({' '.join(other.paths)}) still holds refs")
                for prev in gone:  # P5
                    if scopes.sets_overlap(prev.paths, rec.paths) and prev.how != "released" \
                            and prev.expires > t.time + tolerance:
                        bad(f"txn {t.seq}: {lid} granted {prev.expires - t.time:.1f}s before the expiry of "
                            f"{prev.lease_id}, which was {prev.how or 'removed'} (not released by its holder)")
                lease = Lease(lid, new, rec.paths, rec.owner.key, t.time, [(new, rec)])
                live[lid] = lease
                rep.leases += 1
            elif is_zero(new):  # a release or a reclaim
                lease = live.pop(lid, None)
                if lease is None:
                    bad(f"txn {t.seq}: {ref} deleted but no live lease {lid} was known")
                    continue
                lease.deleted = t.time
                gone_refs = sorted(r for o, n, r in scope_ups if is_zero(n) and o == lease.grant)
                if gone_refs != sorted(_scope_ref(p) for p in lease.paths):  # P2
                    bad(f"txn {t.seq}: {lid} deleted without all of its scope refs ({gone_refs})")
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
                else:
                    lease.how = "unexplained"
                    bad(f"txn {t.seq}: {lid} deleted ({lease.expires - t.time:.1f}s before its expiry) with neither "
                        f"a release by its holder nor an audit entry: an unaudited reclaim")
                gone.append(lease)
            else:  # a renewal (P3)
                lease = live.get(lid)
                rec = objs.record(new)
                if lease is None or rec is None:
                    bad(f"txn {t.seq}: {ref} moved to {new[:10]} with no live lease or no readable record")
                    continue
                prev_oid, prev = lease.versions[-1]
                problems = []
                if old != prev_oid:
                    problems.append("old value is not the current version")
                if objs.parents(new) != (prev_oid,):
                    problems.append("parent is not the previous version")
                if rec.version != prev.version + 1:
                    problems.append(f"version {rec.version} after {prev.version}")
                if (rec.lease_id, rec.paths, rec.acquired_at, rec.owner.key, rec.owner.agent_id) != \
                        (prev.lease_id, prev.paths, prev.acquired_at, prev.owner.key, prev.owner.agent_id):
                    problems.append("lease, scope, acquiredAt or owner changed")
                if t.time > prev.expires + tolerance:
                    problems.append(f"renewed {t.time - prev.expires:.1f}s after expiry")
                if sigs is not None:  # P8
                    problem = sigs.lease_version(new, rec)
                    if problem:
                        problems.append(problem)
                for p in problems:
                    bad(f"txn {t.seq}: renewal of {lid} to v{rec.version}: {p}")
                lease.versions.append((new, rec))
                if not problems:
                    renewed.append(lease)
                rep.renewals += 1
        for old, new, ref in branches:  # P6
            rep.branch_updates += 1
            if is_zero(new):
                continue
            if not renewed:
                bad(f"txn {t.seq}: {ref} updated without a proper renewal of a live lease in the same "
                    f"transaction (unfenced)")
                continue
            covered = [p for lease in renewed for p in lease.paths]
            outside = [p for p in changed_paths(bare, old, new) if not scopes.covers(covered, p)]
            if outside:
                bad(f"txn {t.seq}: {ref} changed {outside[:3]} outside the scope of "
                    f"{', '.join(lease.lease_id for lease in renewed)}")
            else:
                rep.fenced_updates += 1
        for old, new, ref in ups:
            if is_zero(new):
                state.pop(ref, None)
            else:
                state[ref] = new
    leftover = sorted(r for r in (final_refs if final_refs is not None else state)
                      if r.startswith("refs/leases/") and not r.startswith(AUDIT_PREFIXES))
    if leftover:  # P7
        bad(f"{len(leftover)} lease refs left on the server at the end: {leftover[:3]}")
    if sigs is not None:
        rep.signatures = sigs.checked
        if ssh_keygen_sample:
            rep.ssh_keygen_verified, problems = sigs.ssh_keygen(ssh_keygen_sample, seed)
            rep.anomalies.extend(problems)
    return rep


def _scope_ref(path: str) -> str:
    suffix = scopes.to_ref_suffix(path)
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
