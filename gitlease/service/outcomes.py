"""What became of each queued task, on the lease store next to the leases (docs/work.md, "Outcomes").

``refs/leases/outcome/<encoded task id>`` points at a commit holding one file, ``outcome.json``: a canonical
JSON record ``{"schema", "task", "state", "attempts", "reason", "quarantine", "landed", "at", "by", "host",
"notBefore", "nonce"}``. ``state`` is ``done`` (landed; ``landed`` names the commit), ``failed`` (given up:
``reason``, ``quarantine`` names the ref holding the work that was kept) or ``retrying`` (an attempt failed;
the task may run again from ``notBefore`` on). Each new outcome is a child of the one it replaces, written
with compare-and-swap (pinned to the outcome read), or, for ``done``, as a fast-forward in the same atomic push
that lands the task's commits (gitlease.enforce.push.fenced_push ``also``): a task lands exactly once.

The server hook (gitlease.enforce.server) accepts exactly this shape (``check_record``). No git here but
through the store and the object writer.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gitlease.core.clock import iso
from gitlease.core.objects import ident_for
from gitlease.core.refnames import OUTCOME_PREFIX, decode_segment, outcome_ref
from gitlease.core.store import RefUpdate

SCHEMA = "gitlease-outcome/1"
FILE = "outcome.json"
STATES = ("done", "failed", "retrying")
MAX_BYTES = 16 * 1024
FIELDS = ("schema", "task", "state", "attempts", "reason", "quarantine", "landed", "at", "by", "host", "notBefore")


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def check_record(data: bytes, task: str) -> str | None:
    """Why ``data`` is not a canonical outcome record of ``task``, or None."""
    if len(data) > MAX_BYTES:
        return f"{FILE} is over {MAX_BYTES} bytes"
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return f"{FILE} is not JSON"
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or canonical(doc) != data:
        return f"{FILE} is not a canonical {SCHEMA} record"
    if doc.get("task") != task:
        return f"it names task {doc.get('task')!r}"
    if doc.get("state") not in STATES:
        return f"unknown state {doc.get('state')!r}"
    attempts = doc.get("attempts")
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
        return "attempts must be a count"
    return None


@dataclass(frozen=True)
class Outcome:
    task: str
    state: str  # done | failed | retrying
    attempts: int  # attempts finished (failed ones, and the one that landed)
    reason: str = ""
    quarantine: str | None = None  # the ref holding the work kept from the last failed attempt
    landed: str | None = None  # the commit that landed (done)
    at: str = ""
    by: str = ""
    host: str = ""
    not_before: float = 0.0  # retrying: not again before this (wall clock)
    oid: str | None = None  # the outcome commit (None: not written yet)

    @property
    def final(self) -> bool:
        return self.state in ("done", "failed")

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
    """Reading and writing outcomes on a lease store (``svc``: a LeaseService, for its store, objects, clock
    and identity). Records already read are remembered by commit."""

    def __init__(self, svc) -> None:
        self.svc = svc
        self._seen: dict[str, Outcome | None] = {}
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
        new = sorted({oid for oid in found.values() if oid not in self._seen})
        if new:
            self.svc.store.ensure_objects(new)
            for oid in new:
                data = self.svc.store.file_at(oid, FILE, limit=MAX_BYTES)
                doc = None
                if data is not None:
                    try:
                        doc = json.loads(data.decode("utf-8"))
                    except (ValueError, UnicodeDecodeError):
                        doc = None
                self._seen[oid] = Outcome.from_doc(doc, oid) if isinstance(doc, dict) else None
        out = {}
        for task, oid in found.items():
            got = self._seen.get(oid)
            if got is not None and got.task == task:
                out[task] = got
        return out

    def make(self, task: str, state: str, attempts: int, *, parent: str | None, **fields: Any) -> tuple[str, Outcome]:
        """Write (objects only) the outcome commit; returns (oid, Outcome). Push it with ``update`` or as a
        fast-forward refspec."""
        svc = self.svc
        now = svc.clock.now()
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "task": task,
            "state": state,
            "attempts": attempts,
            "reason": str(fields.get("reason") or "")[:2000],
            "quarantine": fields.get("quarantine"),
            "landed": fields.get("landed"),
            "at": iso(now),
            "by": svc.settings.agent,
            "host": os.uname().nodename,
            "notBefore": math.ceil(fields["not_before"]) if fields.get("not_before") else None,  # never early
            "nonce": os.urandom(8).hex(),
        }
        data = canonical(doc)
        tree = svc.objects.tree({FILE: svc.objects.blob(data)})
        ident = ident_for(svc.settings.agent, os.uname().nodename)
        oid = svc.objects.commit(tree, (parent,) if parent else (), ident, int(now), f"outcome {task}: {state}")
        return oid, Outcome.from_doc(doc, oid)

    def write(self, task: str, state: str, attempts: int, *, parent: str | None, **fields: Any) -> Outcome | None:
        """CAS-write an outcome, pinned to ``parent`` (the outcome read; None: there was none). None when the
        outcome changed meanwhile (another runner wrote it): nothing written."""
        oid, got = self.make(task, state, attempts, parent=parent, **fields)
        ref = self._ref(task, parent)
        out = self.svc.store.apply([RefUpdate(ref, oid, parent)])
        if out.ambiguous:
            refs = self.svc.store.list_refs()
            return got if refs.get(ref) == oid else None
        return got if out.ok else None

    def _ref(self, task: str, parent: str | None) -> str:
        """The ref to update from ``parent``: the one it was read from (an earlier version named outcome refs
        with ``%XX`` escapes, docs/protocol.md), else the name written now."""
        return self._refs.get(task, outcome_ref(task)) if parent else outcome_ref(task)

    def clear(self, outcomes: Iterable[Outcome]) -> int:
        """Delete outcome refs (``git lease work --reset``), each pinned to the outcome read."""
        updates = [RefUpdate(self._ref(o.task, o.oid), None, o.oid) for o in outcomes if o.oid]
        if not updates:
            return 0
        out = self.svc.store.apply(updates)
        return len(updates) if out.ok else 0


__all__ = ["Outcome", "Outcomes", "SCHEMA", "FILE", "STATES", "check_record", "canonical", "task_of"]
