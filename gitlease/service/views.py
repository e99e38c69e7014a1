"""What a reader knows of the store: each lease as a view (its refs, its record, what is wrong with it), a
snapshot of all of them from one listing, and the history of one lease. Built from refs and objects only;
no git, no I/O: ``LeaseService.snapshot`` reads, this module groups and judges.

Anything that does not add up is an invalid view that still holds the paths its refs name: fail closed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gitlease.core import record as records
from gitlease.core import scope as scopes
from gitlease.core.bearing import proper_ancestor_in
from gitlease.core.errors import HeldError, InvalidRecord
from gitlease.core.pathindex import PathIndex
from gitlease.core.record import Record
from gitlease.core.refnames import (
    ID_PREFIX,
    OUTCOME_PREFIX,
    SCOPE_REF,
    TASK_PREFIX,
    VERDICT_PREFIX,
    decode_segment,
    id_ref,
    path_of_scope_ref,
)
from gitlease.core.store import Blob

if TYPE_CHECKING:
    from gitlease.identity.trust import ChainCheck

INVALID = "invalid"  # trust.INVALID
HALF_DELETED = "lease has no scope refs (partially deleted)"  # only its id ref left: sweep.judge reclaims it


@dataclass
class LeaseView:
    """What a reader knows of one lease (or of refs that look like one), from one listing."""

    lease_id: str
    paths: tuple[str, ...]
    record: Record | None = None  # the current version (the grant if the id ref is missing)
    current_oid: str | None = None  # the id ref's value
    grant_oid: str | None = None
    scope_refs: dict[str, str] = field(default_factory=dict)  # ref -> oid, as listed
    task_refs: dict[str, str] = field(default_factory=dict)  # the claim of the queued task it works on, if any
    problems: list[str] = field(default_factory=list)
    signed: bool = False
    verification: str = "unsigned"  # verified | unsigned | untrusted (no trust file) | invalid (trust.py)
    signer: str | None = None  # fingerprint of the key that signed version 1
    chain: ChainCheck | None = field(default=None, repr=False)

    @property
    def valid(self) -> bool:
        return not self.problems and self.record is not None

    def expires(self) -> float | None:
        return self.record.expires if self.record else None

    def version(self) -> int | None:
        return self.record.version if self.record else None

    def state(self, now: float, skew: int) -> str:
        """active | grace (expired, within the skew margin) | expired | invalid"""
        if not self.valid:
            return "invalid"
        exp = self.expires()
        assert exp is not None
        return _state_at(exp, now, skew)

    def granted(self) -> tuple[str, ...]:
        """What the store guarantees this lease holds: each path its current record names AND a scope ref of
        it holds (git's directory/file rule keeps those exclusive). A writer's own decisions (what it may push
        or land) take their paths from here, never from a local copy: a local file may only narrow this."""
        if self.record is None:
            return ()
        held = {path_of_scope_ref(r) for r in self.scope_refs}  # decodable: build_views put the others apart
        return tuple(p for p in self.record.paths if p in held)

    def refs(self) -> dict[str, str]:
        out = dict(self.scope_refs)
        out.update(self.task_refs)
        if self.current_oid:
            out[id_ref(self.lease_id)] = self.current_oid
        return out

    def to_json(self, now: float, skew: int) -> dict[str, object]:
        rec = self.record
        return {
            "leaseId": self.lease_id,
            "paths": list(self.paths),
            "state": self.state(now, skew),
            "valid": self.valid,
            "problems": list(self.problems),
            "signed": self.signed,
            "verification": self.verification if self.valid else INVALID,
            "signer": self.signer,
            "version": rec.version if rec else None,
            "owner": rec.owner.to_json() if rec else None,
            "workspaceId": rec.workspace_id if rec else None,
            "expiresAt": rec.expires_at if rec else None,
            "secondsLeft": int(rec.expires - now) if rec else None,
            "renewedAt": rec.renewed_at if rec else None,
            "stopBy": (rec.stop_by or rec.expires_at) if rec else None,  # the holder's stop deadline
            "progress": rec.progress.to_json() if rec and rec.progress else None,  # {note, counter, at}
            "refs": self.refs(),
        }


def _state_at(expires: float, now: float, skew: int) -> str:
    """A valid lease's state: active, grace (expired, within the skew margin) or expired."""
    if now < expires:
        return "active"
    return "grace" if now <= expires + skew else "expired"


# The keys of a lease's JSON (``to_json`` and ``heldHere``) that change while its refs stay as they are: the
# clock's and the reading worktree's. A template is the rest, written once (``json_template``).
JSON_SLOTS = ("heldHere", "secondsLeft", "state")
_SLOT_MARK = "\x00gitlease-slot\x00"


def json_template(view: LeaseView) -> tuple[str, ...] | None:
    """The JSON text of a valid view's ``to_json`` with ``heldHere``, cut where the JSON_SLOTS values go (keys
    sorted, as gitlease writes JSON: core/jsontext.py); None when it does not cut into one piece more than
    there are slots."""
    import json

    from gitlease.core import jsontext

    doc = view.to_json(0.0, 0)
    doc.update(dict.fromkeys(JSON_SLOTS, _SLOT_MARK))
    pieces = tuple(jsontext.dumps(doc).split(json.dumps(_SLOT_MARK)))
    return pieces if len(pieces) == len(JSON_SLOTS) + 1 else None


class KeptView(LeaseView):
    """A valid lease's view as an earlier read finished it, from the same refs under the same trust
    (service/viewcache.py). Built without the dataclass's ``__init__`` (``kept_view``); its record is decoded
    only when looked at, and its JSON is written from the kept template. A record that no longer decodes (a
    damaged cache file) makes the view invalid from then on: it still blocks its paths."""

    _names: str  # its refs' names, one a line
    _fields: bytes  # the record's ``record.to_fields``, marshalled
    _expires: float
    _version: int
    _template: tuple[str, ...] | None

    @functools.cached_property
    def record(self) -> Record | None:  # type: ignore[override]
        import marshal

        try:
            return records.from_fields(marshal.loads(self._fields))
        except (ValueError, TypeError, EOFError):
            self.problems.append("the kept view of this lease does not decode (a damaged cache): read it again")
            return None

    @functools.cached_property
    def scope_refs(self) -> dict[str, str]:  # type: ignore[override]
        return self._refs_at_grant()[0]

    @functools.cached_property
    def task_refs(self) -> dict[str, str]:  # type: ignore[override]
        return self._refs_at_grant()[1]

    def _refs_at_grant(self) -> tuple[dict[str, str], dict[str, str]]:
        scope: dict[str, str] = {}
        task: dict[str, str] = {}
        idref, grant = ID_PREFIX + self.lease_id, self.grant_oid
        for r in self._names.split("\n"):
            if r.startswith(TASK_PREFIX):
                task[r] = grant  # type: ignore[assignment]
            elif r != idref:
                scope[r] = grant  # type: ignore[assignment]
        return scope, task

    @property
    def valid(self) -> bool:
        return not self.problems

    def state(self, now: float, skew: int) -> str:
        return "invalid" if self.problems else _state_at(self._expires, now, skew)

    def expires(self) -> float | None:
        return self._expires

    def version(self) -> int | None:
        return self._version


def leases_json_text(views: Iterable[LeaseView], now: float, skew: int, held: set[str]) -> str:
    """The JSON array ``git lease status --json`` prints of ``views``: each lease's ``to_json`` with
    ``heldHere`` (in ``held``), as text, written from the template of a kept view (one format a lease: the
    common case at 10,000 leases) or else from ``to_json``."""
    from gitlease.core import jsontext

    parts = []
    for v in views:
        here = v.lease_id in held
        if type(v) is KeptView and (t := v._template) is not None and not v.problems:
            exp = v._expires
            parts.append(
                f'{t[0]}{"true" if here else "false"}{t[1]}{int(exp - now)}{t[2]}"{_state_at(exp, now, skew)}"{t[3]}'
            )
            continue
        doc = v.to_json(now, skew)
        doc["heldHere"] = here
        parts.append(jsontext.dumps(doc))
    return "[" + ", ".join(parts) + "]"


def kept_view(lease_id: str, kept: tuple[Any, ...]) -> KeptView:
    """The view of a valid lease as it was kept (service/viewcache.py, its shape checked there): (trust, head,
    grant, its ref names one a line (the id ref at head, the others at grant), paths, record fields, expires,
    version, signed, verification, signer, JSON template)."""
    _trust, head, grant, refs, paths, fields, expires, version, signed, verification, signer, template = kept
    view = KeptView.__new__(KeptView)
    view.__dict__ = {
        "lease_id": lease_id,
        "paths": paths,
        "current_oid": head,
        "grant_oid": grant,
        "problems": [],
        "signed": bool(signed),
        "verification": verification,
        "signer": signer,
        "chain": None,
        "_names": refs,
        "_fields": fields,
        "_expires": expires,
        "_version": version,
        "_template": template,
    }
    return view


@dataclass
class Snapshot:
    leases: list[LeaseView]
    fetched_at: float
    stale: bool = False  # answered from the last fetched state because the store could not be read
    error: str | None = None
    trust: str = "unsigned"  # Trust.describe(): signed (and from where) or unsigned (and why)
    signed_store: bool = False
    foreign: list[str] = field(default_factory=list)  # refs under refs/leases/ that are not gitlease's (faults)
    restricted_to: tuple[str, ...] | None = None  # only the leases bearing on these paths (snapshot(paths=...))
    # every ref the read listed under refs/leases/ (outcome refs too): more of the same listing, no second read
    listing: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    _index: tuple[int, int, PathIndex[int, None]] | None = field(default=None, init=False, repr=False, compare=False)

    def blocking(self, paths: Iterable[str], now: float, skew: int) -> list[LeaseView]:
        """Every lease whose scope overlaps ``paths`` and is not expired beyond the skew margin."""
        return [v for v in self.overlapping(paths) if v.state(now, skew) != "expired"]

    def overlapping(self, paths: Iterable[str]) -> list[LeaseView]:
        """Every lease whose scope overlaps ``paths``, in the snapshot's order: a walk of the leases' trie
        (core/pathindex.py), the depth of each path plus what it finds, not a loop over every lease."""
        leases = self.leases
        return [leases[k] for k in self.paths_index().overlapping(paths)]

    def paths_index(self) -> PathIndex[int, None]:
        """The leases' scopes in a trie, keyed by position in ``leases`` (built once; again if the list is
        replaced or grows)."""
        got = self._index
        if got is None or got[0] != id(self.leases) or got[1] != len(self.leases):
            index: PathIndex[int, None] = PathIndex()
            for k, v in enumerate(self.leases):
                index.add(k, v.paths)
            got = self._index = (id(self.leases), len(self.leases), index)
        return got[2]

    def overlaps(self, now: float, skew: int) -> list[tuple[LeaseView, LeaseView]]:
        """Pairs of valid leases, neither expired beyond the skew margin, whose scopes overlap: a store fault
        (git's directory/file rule makes a correct store refuse the second). Each pair (earlier, later) in the
        snapshot's order, by the earlier one, then the later one; found in a trie of the live leases, so a
        store without faults costs one lookup a lease."""
        live = [v for v in self.leases if v.valid and v.state(now, skew) != "expired"]
        if not _any_nested(p for v in live for p in v.paths):
            return []  # no scope contains another: no pair overlaps (the common case, checked by one sort)
        index: PathIndex[int, None] = PathIndex()
        for k, v in enumerate(live):
            index.add(k, v.paths)
        out: list[tuple[LeaseView, LeaseView]] = []
        for i, a in enumerate(live):
            out.extend((a, live[k]) for k in index.overlapping(a.paths) if k > i)
        return out

    def find(self, lease_id: str) -> LeaseView | None:
        return next((v for v in self.leases if v.lease_id == lease_id), None)


def _any_nested(paths: Iterable[str]) -> bool:
    """True when one of ``paths`` (repeats included) contains another: a repeat, the whole repository beside
    any other, or a path whose folder (at a segment boundary) is one of them. One set lookup a segment."""
    seen: set[str] = set()
    for p in paths:
        if p in seen:
            return True
        seen.add(p)
    if scopes.ROOT in seen:
        return len(seen) > 1
    return any(proper_ancestor_in(p, seen) for p in seen)


@dataclass(frozen=True)
class HistoryEntry:
    oid: str
    record: Record | None
    problem: str | None
    signed: bool
    verification: str = "unsigned"  # verified | unsigned | untrusted | invalid
    signer: str | None = None  # fingerprint of the key whose signature verifies
    principal: str | None = None  # the agent id the trust file vouches for


# ------------------------------------------------------------------------------- service


# ------------------------------------------------------------------------- view building


_UNREADABLE = Blob(None, None, "object not readable")


Parsed = tuple["Record | None", "str | None"]  # (record, None) or (None, why the object is not one)


def parse_blob(b: Blob) -> Parsed:
    if b.record is None:
        return None, b.problem or "missing record"
    try:
        return records.parse(b.record), None
    except InvalidRecord as exc:
        return None, str(exc)


def build_views(
    refs: dict[str, str], blobs: dict[str, Blob], parsed: dict[str, Parsed] | None = None
) -> list[LeaseView]:
    """Group listed refs into leases. Anything that does not add up is an invalid view that still holds
    the paths its refs name: fail closed. Each object is parsed once (a lease's id ref and its scope refs
    point at the same grant until it is renewed); ``parsed`` holds objects parsed already (and gains those
    parsed here)."""
    parsed = {} if parsed is None else parsed

    def parse_oid(oid: str) -> tuple[Record | None, str | None]:
        got = parsed.get(oid)
        if got is None:
            got = parsed[oid] = parse_blob(blobs.get(oid, _UNREADABLE))
        return got

    by_grant, id_refs, task_refs, bad = _sort_refs(refs)
    views = _id_views(id_refs, parse_oid, blobs)
    _attach_grants(by_grant, parse_oid, blobs, views, bad)
    _attach_task_refs(task_refs, parse_oid, views)
    for view in views.values():
        if view.grant_oid is None and view.record is not None and not view.problems:
            view.problems.append(HALF_DELETED)
    return sorted(views.values(), key=lambda v: v.lease_id) + bad


def _sort_refs(
    refs: dict[str, str],
) -> tuple[dict[str, dict[str, str]], list[tuple[str, str]], dict[str, str], list[LeaseView]]:
    """One pass over a listing: (grant oid -> {scope ref: path}, the id refs in the listing's order, the task
    refs, and an invalid view for each scope ref gitlease cannot have written). Foreign refs block nothing."""
    by_grant: dict[str, dict[str, str]] = {}
    id_refs: list[tuple[str, str]] = []
    task_refs: dict[str, str] = {}
    bad: list[LeaseView] = []
    scope_dir = SCOPE_REF + "/"
    for ref, oid in refs.items():
        if not ref.startswith(scope_dir):
            if ref.startswith(ID_PREFIX):
                id_refs.append((ref, oid))
            elif ref.startswith(TASK_PREFIX):
                task_refs[ref] = oid
            if ref != SCOPE_REF:
                continue  # foreign refs (foreign_refs) block nothing
        try:
            path = path_of_scope_ref(ref)
        except ValueError:
            bad.append(
                LeaseView(
                    lease_id=f"?{ref}",
                    paths=(_undecodable_path(ref),),
                    scope_refs={ref: oid},
                    problems=[f"ref {ref} is not a gitlease scope ref"],
                )
            )
            continue
        by_grant.setdefault(oid, {})[ref] = path
    return by_grant, id_refs, task_refs, bad


def _id_views(
    id_refs: list[tuple[str, str]], parse_oid: Callable[[str], Parsed], blobs: dict[str, Blob]
) -> dict[str, LeaseView]:
    """A view for each id ref, from the record it points at (its current version)."""
    views: dict[str, LeaseView] = {}
    skip = len(ID_PREFIX)
    for ref, oid in id_refs:
        lease_id = ref[skip:]
        rec, problem = parse_oid(oid)
        view = LeaseView(
            lease_id=lease_id,
            paths=rec.paths if rec else (),
            record=rec,
            current_oid=oid,
            signed=(b := blobs.get(oid)) is not None and b.signature is not None,
        )
        if problem:
            view.problems.append(problem)
        elif rec and rec.lease_id != lease_id:
            view.problems.append(f"record names lease {rec.lease_id}, not {lease_id}")
        views[lease_id] = view
    return views


def _attach_grants(
    by_grant: dict[str, dict[str, str]],
    parse_oid: Callable[[str], Parsed],
    blobs: dict[str, Blob],
    views: dict[str, LeaseView],
    bad: list[LeaseView],
) -> None:
    """Each grant's scope refs given to the lease its record names (a view of its own when that lease has no
    id ref: judged by the grant's own expiry); scope refs at an unreadable record: an invalid view."""
    for grant, refmap in by_grant.items():
        grec, problem = parse_oid(grant)
        paths = tuple(sorted(refmap.values()))
        if grec is None:
            bad.append(
                LeaseView(
                    lease_id=f"?{grant[:12]}",
                    paths=paths,
                    scope_refs={r: grant for r in refmap},
                    problems=[f"scope refs point at an invalid record: {problem}"],
                )
            )
            continue
        view = views.get(grec.lease_id)
        if view is None:  # scope refs without an id ref: judged by the grant's own expiry
            view = LeaseView(
                lease_id=grec.lease_id,
                paths=grec.paths,
                record=grec,
                signed=(b := blobs.get(grant)) is not None and b.signature is not None,
            )
            views[grec.lease_id] = view
        view.grant_oid = grant
        view.scope_refs.update({r: grant for r in refmap})
        if grec.version != 1:
            view.problems.append("scope refs do not point at version 1 of the lease")
        # Scope refs point at the grant, and the *current* version says what the lease holds: an extend or a
        # narrow changes the scope and the scope refs in one transaction (docs/protocol.md). A scope ref for a
        # path the current version does not hold (a torn read of such a transaction, or a forgery) makes the
        # lease invalid; its path stays blocked either way (``view.paths`` is the union).
        holds = view.record.paths if view.record is not None else grec.paths
        if not set(paths) <= set(holds):
            view.problems.append("a scope ref names a path the lease does not hold")
        view.paths = tuple(sorted(set(view.paths) | set(paths)))


def _attach_task_refs(refs: dict[str, str], parse_oid: Callable[[str], Parsed], views: dict[str, LeaseView]) -> None:
    """A task ref (the claim of a queued task) belongs to the lease whose grant it points at: it is deleted
    with that lease's refs. One left without its lease (a half-deleted lease) becomes a view of its own that
    holds no path and is reclaimed like a half-deleted lease once that grant has expired. One pointing at no
    lease record blocks nothing."""
    for ref, oid in refs.items():
        if not ref.startswith(TASK_PREFIX):
            continue
        rec, _problem = parse_oid(oid)
        if rec is None:
            continue
        view = views.get(rec.lease_id)
        if view is None:
            view = views[rec.lease_id] = LeaseView(lease_id=rec.lease_id, paths=(), record=rec, grant_oid=oid)
            view.problems.append(HALF_DELETED)
        view.task_refs[ref] = oid


def _undecodable_path(ref: str) -> str:
    """The path a foreign ref under refs/leases/scope/ blocks, as git's directory/file rule does: its
    components decoded up to the first one that is not a canonical encoding of a path segment, and that
    component as it is (a name no real path encodes to). ``refs/leases/scope/%zz/x`` blocks the whole
    repository (the ref ``refs/leases/scope`` cannot be created beside it) and nothing else;
    ``refs/leases/scope/a/%zz`` blocks ``.`` and ``a``. Never more: a stray ref must not block paths that
    ``acquire`` would be granted."""
    rest = ref[len(SCOPE_REF) + 1 :] if ref.startswith(SCOPE_REF + "/") else ""
    if not rest:
        return scopes.ROOT
    out: list[str] = []
    for comp in rest.split("/"):
        try:
            seg = decode_segment(comp)
            if scopes.normalize(seg) != seg or "/" in seg:
                raise ValueError(comp)
        except Exception:
            out.append(comp)
            break
        out.append(seg)
    return "/".join(out)


def foreign_refs(refs: Iterable[str]) -> list[str]:
    """Refs under refs/leases/ that are neither a lease's id or scope ref nor another ref gitlease writes
    there: store faults to report, which block nothing (git refuses no lease because of them)."""
    known = (ID_PREFIX, SCOPE_REF + "/", TASK_PREFIX, OUTCOME_PREFIX, VERDICT_PREFIX)  # and gitlease's other refs
    return sorted(r for r in refs if not (r.startswith(known) or r == SCOPE_REF))


def held_error(paths: Sequence[str], blockers: Sequence[LeaseView], now: float, skew: int) -> HeldError:
    desc = "; ".join(describe_blocker(b, now) for b in blockers)
    return HeldError(f"scope {' '.join(paths)} is held: {desc}", blockers=[b.to_json(now, skew) for b in blockers])


def describe_blocker(b: LeaseView, now: float) -> str:
    if not b.valid or b.record is None:
        return f"{b.lease_id} (invalid: {'; '.join(b.problems) or 'unreadable'}) on {' '.join(b.paths)}"
    r = b.record
    left = int(r.expires - now)
    when = f"{left}s left" if left >= 0 else f"expired {-left}s ago, within the skew margin"
    return f"{b.lease_id} on {' '.join(r.paths)} by task={r.owner.task_id} agent={r.owner.agent_id} ({when})"
