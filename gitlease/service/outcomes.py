"""What became of each queued task, on the lease store next to the leases (docs/work.md, "Outcomes").

``refs/leases/outcome/<encoded task id>`` points at a commit holding ``outcome.json`` (and, on a store with
keys, ``outcome.sig``: its SSHSIG by the writer's key): a canonical JSON record ``{"schema", "task", "state",
"attempts", "reason", "quarantine", "ready", "landed", "branch", "digest", "rerun", "at", "by", "host", "key",
"notBefore", "nonce"}``. ``state``:

* ``running``: an attempt is under way (written in the same atomic push as the task's claim): ``attempts``
  counts it, so an attempt whose runner died is counted too;
* ``retrying``: an attempt failed; the task may run again from ``notBefore`` on. With ``ready``, its work was
  verified and only its landing failed (a lost lease, the server away): ``ready`` names the ref that parks the
  verified commit, and the next attempt lands it without running the agent again;
* ``done`` (landed; ``landed`` names the commit, on ``branch``) and ``failed`` (given up: ``reason``,
  ``quarantine`` names the ref holding the work kept) are final.

Each new outcome is a child of the one it replaces, written with compare-and-swap (pinned to the outcome read),
or, for ``done``, as a fast-forward in the same atomic push that lands the task's commits
(gitlease.enforce.push.fenced_push ``also``): a task lands exactly once. Outcomes only move forward: a final one
is reopened only by a child marked ``rerun`` (``git lease work --rerun ID``), and one is deleted only by a prune
recorded in the audit log (``git lease work --prune AGE``). ``digest`` is the task's content hash: a queue
line whose id was done with other content is refused, not skipped.

The server hook (gitlease.enforce.server) accepts exactly this shape (``check_record``) and enforces the moves;
a runner ignores, and reports, an outcome whose signature does not verify on a signed store. No git here but
through the store and the object writer.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gitlease.core import gitq
from gitlease.core.clock import iso
from gitlease.core.errors import RemoteUnavailable
from gitlease.core.objects import ident_for
from gitlease.core.refnames import OUTCOME_PREFIX, decode_segment, outcome_ref
from gitlease.core.store import RefUpdate

SCHEMA = "gitlease-outcome/2"
SCHEMAS = ("gitlease-outcome/1", SCHEMA)  # /1: written before outcomes were signed; still read
FILE = "outcome.json"
SIG_FILE = "outcome.sig"
STATES = ("running", "retrying", "done", "failed")
FINAL = ("done", "failed")
MAX_BYTES = 16 * 1024
FIELDS = (
    "schema",
    "task",
    "state",
    "attempts",
    "reason",
    "quarantine",
    "ready",
    "landed",
    "branch",
    "digest",
    "rerun",
    "at",
    "by",
    "host",
    "key",
    "notBefore",
)


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def digest(task_doc: dict[str, Any]) -> str:
    """A task's content hash: its queue line as JSON, canonical (what the queue says, not where it came from)."""
    return "sha256:" + hashlib.sha256(canonical(task_doc)).hexdigest()


def parse_record(data: bytes, task: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the record, None) when ``data`` is a canonical outcome record of ``task``, else (None, why)."""
    if len(data) > MAX_BYTES:
        return None, f"{FILE} is over {MAX_BYTES} bytes"
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, f"{FILE} is not JSON"
    if not isinstance(doc, dict) or doc.get("schema") not in SCHEMAS or canonical(doc) != data:
        return None, f"{FILE} is not a canonical {SCHEMA} record"
    if doc.get("task") != task:
        return None, f"it names task {doc.get('task')!r}"
    if doc.get("state") not in STATES:
        return None, f"unknown state {doc.get('state')!r}"
    attempts = doc.get("attempts")
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
        return None, "attempts must be a count"
    for name in ("landed", "branch", "digest", "key", "quarantine", "ready"):
        if doc.get(name) is not None and not isinstance(doc.get(name), str):
            return None, f"{name} must be a string or null"
    if not isinstance(doc.get("rerun", False), bool):
        return None, "rerun must be true or false"
    return doc, None


def check_record(data: bytes, task: str) -> str | None:
    """Why ``data`` is not a canonical outcome record of ``task``, or None."""
    return parse_record(data, task)[1]


def move_problem(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """Why ``new`` may not replace ``old`` (None: it may): outcomes only move forward. A final outcome (done,
    failed) is replaced only by a ``rerun`` (``git lease work --rerun ID``), and attempts never go back (but for
    a running attempt given back uncounted)."""
    if old is None:
        return None
    if old.get("state") in FINAL and not new.get("rerun"):
        return f"task {new.get('task')!r} is {old.get('state')} (final); only git lease work --rerun ID reopens it"
    before, after = old.get("attempts"), new.get("attempts")
    if isinstance(before, int) and isinstance(after, int) and after < before and not new.get("rerun"):
        # the running attempt given back uncounted (interrupted, or the store went away): one step back
        if not (old.get("state") == "running" and after == before - 1 and new.get("state") == "retrying"):
            return f"attempts go back from {before} to {after}"
    return None


@dataclass(frozen=True)
class Outcome:
    task: str
    state: str  # running | retrying | done | failed
    attempts: int  # attempts made: failed ones, the one that landed, the one running
    reason: str = ""
    quarantine: str | None = None  # the ref holding the work kept from the last failed attempt
    landed: str | None = None  # the commit that landed (done)
    at: str = ""
    by: str = ""
    host: str = ""
    not_before: float = 0.0  # retrying: not again before this (wall clock)
    oid: str | None = None  # the outcome commit (None: not written yet)
    branch: str | None = None  # done: the branch it landed on
    digest: str | None = None  # the task's content hash when the outcome was written (None: before digests)
    rerun: bool = False  # a final outcome reopened by git lease work --rerun
    ready: str | None = None  # retrying: the ref parking its verified commit (only its landing is left)

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "state": self.state,
            "attempts": self.attempts,
            "reason": self.reason,
            "quarantine": self.quarantine,
            "landed": self.landed,
            "at": self.at,
            "by": self.by,
            "host": self.host,
            "notBefore": iso(self.not_before) if self.not_before else None,
            "oid": self.oid,
            "branch": self.branch,
            "digest": self.digest,
            "rerun": self.rerun,
            "ready": self.ready,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any], oid: str | None) -> Outcome:
        nb = doc.get("notBefore")
        return cls(
            task=str(doc.get("task")),
            state=str(doc.get("state")),
            attempts=int(doc.get("attempts") or 0),
            reason=str(doc.get("reason") or ""),
            quarantine=doc.get("quarantine") if isinstance(doc.get("quarantine"), str) else None,
            landed=doc.get("landed") if isinstance(doc.get("landed"), str) else None,
            at=str(doc.get("at") or ""),
            by=str(doc.get("by") or ""),
            host=str(doc.get("host") or ""),
            not_before=float(nb) if isinstance(nb, (int, float)) and not isinstance(nb, bool) else 0.0,
            oid=oid,
            branch=doc.get("branch") if isinstance(doc.get("branch"), str) else None,
            digest=doc.get("digest") if isinstance(doc.get("digest"), str) else None,
            rerun=doc.get("rerun") is True,
            ready=doc.get("ready") if isinstance(doc.get("ready"), str) else None,
        )


def task_of(ref: str) -> str | None:
    """The task id of an outcome ref, or None for any other ref."""
    if not ref.startswith(OUTCOME_PREFIX):
        return None
    try:
        return decode_segment(ref[len(OUTCOME_PREFIX) :])
    except ValueError:
        return None


class Outcomes:
    """Reading and writing outcomes on a lease store (``svc``: a LeaseService, for its store, objects, clock,
    identity, signer and trust). Records already read are remembered by commit; on a signed store an outcome
    whose signature does not verify is left out, and ``ignored`` says why (task -> reason)."""

    def __init__(self, svc) -> None:
        self.svc = svc
        self._seen: dict[str, Outcome | None] = {}
        self._why: dict[str, str] = {}  # oid -> why it was left out
        self.ignored: dict[str, str] = {}
        self.listed: dict[str, str] = {}  # task -> the outcome ref's value as last read (ignored ones too)
        self._refs: dict[str, str] = {}  # task -> the ref its outcome was read from (an earlier version's name?)

    def read(self, refs: dict[str, str]) -> dict[str, Outcome]:
        """{task: Outcome} of the outcome refs among ``refs`` (a listing of the store)."""
        found: dict[str, str] = {}
        for ref, oid in refs.items():
            task = task_of(ref)
            # a task's ref as named now wins over the one an earlier version named (docs/protocol.md)
            if task is not None and (task not in found or ref == outcome_ref(task)):
                found[task] = oid
                self._refs[task] = ref
        self.listed = found
        new = sorted({oid for oid in found.values() if oid not in self._seen})
        if new:
            self._load(new, {oid: t for t, oid in found.items()})
        out, ignored = {}, {}
        for task, oid in found.items():
            got = self._seen.get(oid)
            if got is not None and got.task == task:
                out[task] = got
            elif oid in self._why:
                ignored[task] = self._why[oid]
        self.ignored = ignored
        return out

    def _load(self, oids: list[str], task_at: dict[str, str]) -> None:
        store = self.svc.store
        store.ensure_objects(oids)
        trust = None
        for oid in oids:
            data = store.file_at(oid, FILE, limit=MAX_BYTES)
            if data is None and not gitq.is_commit(store.repo_dir, oid):
                # not fetched (the store went away meanwhile): unknown, never remembered as unreadable. Taken
                # for "no outcome", the task looked unstarted, and every claim of it failed, forever
                raise RemoteUnavailable(
                    f"the outcome of task {task_at.get(oid, '?')} ({oid[:12]}) could not be fetched from the store"
                )
            doc, why = parse_record(data, task_at.get(oid, "")) if data is not None else (None, "no outcome.json")
            if doc is not None:
                if trust is None:
                    trust = self.svc.trust()
                why = self._signature_problem(trust, doc, data, store.file_at(oid, SIG_FILE, limit=MAX_BYTES))
            if doc is None or why is not None:
                self._seen[oid] = None
                self._why[oid] = why or "unreadable"
                continue
            self._seen[oid] = Outcome.from_doc(doc, oid)

    @staticmethod
    def _signature_problem(trust, doc: dict[str, Any], data: bytes | None, sig: bytes | None) -> str | None:
        if not trust.signed and sig is None:
            return None
        from gitlease.identity.trust import check_outcome

        return check_outcome(trust, doc, data or b"", sig)

    def make(self, task: str, state: str, attempts: int, *, parent: str | None, **fields: Any) -> tuple[str, Outcome]:
        """Write (objects only) the outcome commit, signed by the writer's key when it has one; returns (oid,
        Outcome). Push it with ``update`` or as a fast-forward refspec. ``fields``: reason, quarantine, landed,
        branch, digest, rerun, not_before."""
        svc = self.svc
        now = svc.clock.now()
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "task": task,
            "state": state,
            "attempts": attempts,
            "reason": str(fields.get("reason") or "")[:2000],
            "quarantine": fields.get("quarantine"),
            "ready": fields.get("ready"),
            "landed": fields.get("landed"),
            "branch": fields.get("branch"),
            "digest": fields.get("digest"),
            "rerun": bool(fields.get("rerun")),
            "at": iso(now),
            "by": svc.settings.agent,
            "host": os.uname().nodename,
            "key": svc.signer.public_key,
            "notBefore": math.ceil(fields["not_before"]) if fields.get("not_before") else None,  # never early
            "nonce": os.urandom(8).hex(),
        }
        data = canonical(doc)
        ident = ident_for(svc.settings.agent, os.uname().nodename)
        oid = svc.objects.signed_commit(
            FILE, data, SIG_FILE, svc.signer.sign(data), (parent,) if parent else (), ident, int(now),
            f"outcome {task}: {state}",
        )  # fmt: skip
        return oid, Outcome.from_doc(doc, oid)

    def update(self, task: str, oid: str, parent: str | None) -> RefUpdate:
        """The ref update that puts the outcome commit ``oid`` in place of ``parent`` (CAS), on the ref
        ``parent`` was read from."""
        return RefUpdate(self._ref(task, parent), oid, parent)

    def write(self, task: str, state: str, attempts: int, *, parent: str | None, **fields: Any) -> Outcome | None:
        """CAS-write an outcome, pinned to ``parent`` (the outcome read; None: there was none). None when the
        outcome changed meanwhile (another runner wrote it): nothing written."""
        oid, got = self.make(task, state, attempts, parent=parent, **fields)
        out = self.svc.store.apply([self.update(task, oid, parent)])
        ref = self._ref(task, parent)
        if out.ambiguous:
            refs = self.svc.store.list_refs()
            return got if refs.get(ref) == oid else None
        return got if out.ok else None

    def _ref(self, task: str, parent: str | None) -> str:
        """The ref to update from ``parent``: the one it was read from (an earlier version named outcome refs
        with ``%XX`` escapes, docs/protocol.md), else the name written now."""
        return self._refs.get(task, outcome_ref(task)) if parent else outcome_ref(task)

    def prune(self, outcomes: Iterable[Outcome], quarantines: dict[str, str], *, why: str):
        """Delete outcome refs (each pinned to the outcome read) and the quarantine refs given ({ref: oid}), with
        one audit entry recording them, in one atomic push: outcomes are deleted only so (the server hook
        refuses any other delete). Returns the audit log's answer (``.ok``)."""
        updates = [RefUpdate(self._ref(o.task, o.oid), None, o.oid) for o in outcomes if o.oid]
        updates += [RefUpdate(ref, None, oid) for ref, oid in sorted(quarantines.items())]
        fields = {
            "action": "prune",
            "rule": None,
            "reason": why,
            "by": self.svc.settings.agent,
            "leaseId": None,
            "refs": {u.ref: u.old for u in updates},
            "valid": True,
        }
        return self.svc.audit.append_with(updates, fields)


@dataclass(frozen=True)
class Pruned:
    tasks: list[str]  # whose outcomes were deleted
    refs: int  # refs deleted (outcomes and parked work)
    audit: str | None  # the audit entry that records it


def prune(svc, older_than: float, *, now: float) -> Pruned:
    """``git lease work --prune AGE``: the final outcomes (done, failed) written more than ``older_than``
    seconds before ``now``, and the work parked for those tasks, deleted in one atomic push with one audit
    entry recording them. A task pruned and queued again runs again."""
    from gitlease.core.clock import parse_iso
    from gitlease.core.errors import GitLeaseError
    from gitlease.core.refnames import QUARANTINE_PREFIX, encode_segment

    book = Outcomes(svc)
    old = []
    for o in book.read(svc.store.list_refs()).values():
        try:
            at = parse_iso(o.at)
        except ValueError:
            continue
        if o.final and now - at > older_than:
            old.append(o)
    if not old:
        return Pruned([], 0, None)
    parked = svc.store.list_namespace(QUARANTINE_PREFIX)
    prefixes = tuple(f"{QUARANTINE_PREFIX}{encode_segment(o.task)}/" for o in old)
    mine = {ref: oid for ref, oid in parked.items() if ref.startswith(prefixes)}
    got = book.prune(old, mine, why=f"outcomes older than {int(older_than)}s pruned")
    if not got.ok:
        raise GitLeaseError(f"prune refused by the store: {got.message}")
    return Pruned(sorted(o.task for o in old), len(old) + len(mine), got.oid)


__all__ = [
    "prune",
    "Pruned",
    "Outcome",
    "Outcomes",
    "SCHEMA",
    "FILE",
    "SIG_FILE",
    "STATES",
    "FINAL",
    "check_record",
    "parse_record",
    "move_problem",
    "canonical",
    "digest",
    "task_of",
]
