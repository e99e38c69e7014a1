"""The lease record: an explicit, boring JSON document, serialized canonically.

The stored bytes are exactly ``canonical(record)``: keys sorted, no insignificant white space, UTF-8.
A reader refuses any other byte form, so what is signed is what is stored is what is parsed.
Pure: no git, no I/O.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from gitlease.core import scope as scopes
from gitlease.core.clock import iso, parse_iso
from gitlease.core.errors import InvalidRecord, UsageError

SCHEMA = "gitlease.lease/1"
MAX_RECORD_BYTES = 64 * 1024
MAX_PATHS = 1024
LEASE_ID = re.compile(r"^lease_[0-9a-z]{6,40}$")
_TEXT_LIMIT = 256
_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def check_lease_id(lease_id: object) -> str:
    """``lease_id`` if it is a well-formed lease id, else UsageError (exit 2): checked before a lease id is
    used in any ref name or file name."""
    if not isinstance(lease_id, str) or not LEASE_ID.fullmatch(lease_id):
        shown = lease_id[:60] if isinstance(lease_id, str) else type(lease_id).__name__
        raise UsageError(f"not a lease id: {shown!r} (lease ids look like lease_01m8vf6hkhda1tsp)")
    return lease_id


def new_lease_id(now: float) -> str:
    """``lease_`` + 10 characters of millisecond time (sortable, as in a ULID) + 6 random ones."""
    ms = int(now * 1000)
    head = "".join(_CROCKFORD[(ms >> (5 * i)) & 31] for i in reversed(range(10)))
    tail = "".join(_CROCKFORD[b & 31] for b in os.urandom(6))
    return f"lease_{head}{tail}"


def new_nonce() -> str:
    return os.urandom(16).hex()


@dataclass(frozen=True)
class Owner:
    task_id: str
    agent_id: str
    host: str
    pid: int
    pid_start: int | None = (
        None  # the holder process's start time (clock ticks since boot), so a reused pid is not mistaken for it
    )
    key: str | None = None  # the owner's public key ("ssh-ed25519 AAAA..."), None when unsigned

    def to_json(self) -> dict[str, Any]:
        return {
            "taskId": self.task_id,
            "agentId": self.agent_id,
            "host": self.host,
            "pid": self.pid,
            "pidStart": self.pid_start,
            "key": self.key,
        }


@dataclass(frozen=True)
class Progress:
    note: str
    counter: int
    at: str

    def to_json(self) -> dict[str, Any]:
        return {"note": self.note, "counter": self.counter, "at": self.at}


@dataclass(frozen=True)
class Record:
    lease_id: str
    repo: str
    paths: tuple[str, ...]
    workspace_id: str
    owner: Owner
    version: int
    acquired_at: str
    renewed_at: str
    expires_at: str
    ttl: int
    nonce: str
    status: str = "active"
    renew_every: int | None = None
    progress: Progress | None = None
    schema: str = field(default=SCHEMA)
    # The instant by which the holder will have stopped if it hears of no later renewal (its stop deadline):
    # every early reclaim rule waits for it plus lease.skew. None in records written before it existed: such a
    # record's stop deadline is its expiry (``stop_deadline``).
    stop_by: str | None = None

    # ------------------------------------------------------------------ derived
    # Timestamps read once a record (``validate`` fills these in as it checks them); a frozen record's fields
    # never change, and ``replace`` makes a new record with nothing cached.
    @cached_property
    def expires(self) -> float:
        return parse_iso(self.expires_at)

    @cached_property
    def renewed(self) -> float:
        return parse_iso(self.renewed_at)

    @cached_property
    def stop_deadline(self) -> float:
        """``stopBy``, or ``expiresAt`` for a record without one."""
        return parse_iso(self.stop_by) if self.stop_by is not None else self.expires

    @property
    def stop_after(self) -> int:
        """Seconds from a renewal to its stop deadline (what each renewal carries over)."""
        return int(self.stop_deadline - self.renewed)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "leaseId": self.lease_id,
            "repo": self.repo,
            "scope": {"kind": "path-set", "paths": list(self.paths)},
            "workspaceId": self.workspace_id,
            "owner": self.owner.to_json(),
            "status": self.status,
            "version": self.version,
            "acquiredAt": self.acquired_at,
            "renewedAt": self.renewed_at,
            "expiresAt": self.expires_at,
            "ttl": self.ttl,
            "renewEvery": self.renew_every,
            "nonce": self.nonce,
            "progress": self.progress.to_json() if self.progress else None,
            **({"stopBy": self.stop_by} if self.stop_by is not None else {}),
        }

    def canonical(self) -> bytes:
        return canonical(self.to_json())

    def next_version(
        self, now: float, ttl: int | None = None, progress: Progress | None = None, stop_after: int | None = None
    ) -> Record:
        """The record of a renewal: version + 1, a fresh nonce, expiry moved to now + ttl, and the stop deadline
        to now + ``stop_after`` (default: as far after the renewal as the previous version's; never past the
        expiry)."""
        ttl = self.ttl if ttl is None else ttl
        after = self.stop_after if stop_after is None else stop_after
        stamp = int(now)  # what iso() keeps: renewedAt, stopBy and expiresAt are whole seconds apart
        return replace(
            self,
            version=self.version + 1,
            renewed_at=iso(stamp),
            expires_at=iso(stamp + ttl),
            ttl=ttl,
            nonce=new_nonce(),
            progress=progress if progress is not None else self.progress,
            stop_by=iso(stamp + max(0, min(after, ttl))),
        )


def new_record(
    *,
    lease_id: str,
    repo: str,
    paths: tuple[str, ...],
    workspace_id: str,
    owner: Owner,
    now: float,
    ttl: int,
    renew_every: int | None = None,
    stop_after: int | None = None,
) -> Record:
    """Version 1. ``stop_after``: seconds after which its holder will have stopped unless it renews (the holder's
    stop deadline, ``stopBy``; default, and at most: the TTL)."""
    stamp = iso(now)
    after = ttl if stop_after is None else max(0, min(int(stop_after), ttl))
    rec = Record(
        lease_id=lease_id,
        repo=repo,
        paths=paths,
        workspace_id=workspace_id,
        owner=owner,
        version=1,
        acquired_at=stamp,
        renewed_at=stamp,
        expires_at=iso(now + ttl),
        ttl=ttl,
        nonce=new_nonce(),
        renew_every=renew_every,
        stop_by=iso(int(now) + after),
    )
    validate(rec)
    return rec


def largest_version(rec: Record) -> Record:
    """The largest record any later version of ``rec`` can be: renewals change only the version, the TTL, the
    timestamps (fixed width) and the progress note (at most MAX_NOTE printable characters, 4 bytes each in
    UTF-8 at most, a counter of at most 13 digits)."""
    from gitlease.core.progress import MAX_NOTE

    return replace(
        rec,
        version=10**12,
        ttl=366 * 86400,
        progress=Progress(note="\U0010ffff" * MAX_NOTE, counter=10**13, at=rec.renewed_at),
    )


def size_problem(rec: Record) -> str | None:
    """Why a lease with ``rec``'s scope could not be written and read back for its whole life, or None: the
    one limit writers and readers share (MAX_PATHS paths, MAX_RECORD_BYTES bytes for every version)."""
    if len(rec.paths) > MAX_PATHS:
        return f"{len(rec.paths)} paths, over the limit of {MAX_PATHS} paths per lease"
    size = len(largest_version(rec).canonical())
    if size > MAX_RECORD_BYTES:
        return (
            f"its record would be up to {size} bytes (renewals included), over the "
            f"{MAX_RECORD_BYTES}-byte limit every reader enforces"
        )
    return None


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


# ---------------------------------------------------------------------- parsing


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise InvalidRecord(f"duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise InvalidRecord(f"non-standard JSON constant {name}")


def parse(data: bytes) -> Record:
    """Bytes from a lease ref -> Record. Anything not exactly a canonical record raises InvalidRecord."""
    if len(data) > MAX_RECORD_BYTES:
        raise InvalidRecord(f"record is {len(data)} bytes, over the {MAX_RECORD_BYTES}-byte limit")
    # The common case first: plain json.loads, and bytes that are exactly the canonical form of what it read.
    # Canonical bytes hold no duplicate key (json keeps the last: its canonical form would be shorter) and no
    # NaN (canonical refuses it), so this answers as the checks below would; anything else takes them.
    try:
        obj = json.loads(data)
        plain = canonical(obj) == data
    except (ValueError, RecursionError, UnicodeError):
        plain = False
    if plain:
        return from_json(obj)
    try:
        text = data.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except InvalidRecord:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidRecord(f"record is not JSON: {type(exc).__name__}") from None
    rec = from_json(obj)
    try:
        same = canonical(obj) == data
    except UnicodeEncodeError:  # a lone surrogate escape ("\ud800") decodes, but is no text: found by fuzzing
        raise InvalidRecord("record holds a lone surrogate escape, not text") from None
    if not same:
        raise InvalidRecord("record bytes are not in canonical form")
    return rec


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    if key not in obj:
        if optional:
            return None
        raise InvalidRecord(f"missing field {key!r}")
    val = obj[key]
    if val is None and optional:
        return None
    if isinstance(val, bool) and kind is not bool or not isinstance(val, kind):
        raise InvalidRecord(f"field {key!r} has the wrong type")
    if isinstance(val, str) and (len(val) > _TEXT_LIMIT and key != "key" or len(val) > 4096):
        raise InvalidRecord(f"field {key!r} is too long")
    return val


def from_json(obj: Any) -> Record:
    if not isinstance(obj, dict):
        raise InvalidRecord("record is not a JSON object")
    known = {
        "schema",
        "leaseId",
        "repo",
        "scope",
        "workspaceId",
        "owner",
        "status",
        "version",
        "acquiredAt",
        "renewedAt",
        "expiresAt",
        "ttl",
        "renewEvery",
        "nonce",
        "progress",
        "stopBy",
    }
    extra = set(obj) - known
    if extra:
        raise InvalidRecord(f"unknown field {sorted(extra)[0]!r}")
    schema = _get(obj, "schema", str)
    if schema != SCHEMA:
        raise InvalidRecord(f"unsupported schema {schema[:40]!r} (this gitlease reads {SCHEMA})")
    sc = _get(obj, "scope", dict)
    if set(sc) != {"kind", "paths"} or sc.get("kind") != "path-set" or not isinstance(sc.get("paths"), list):
        raise InvalidRecord("scope must be {kind: path-set, paths: [...]}")
    raw_paths = sc["paths"]
    if not raw_paths or len(raw_paths) > MAX_PATHS or not all(isinstance(p, str) for p in raw_paths):
        raise InvalidRecord("scope paths must be 1 to 1024 strings")
    try:
        paths = tuple(raw_paths)
        if any(scopes.normalize(p) != p for p in paths) or scopes.minimize(paths) != paths:
            raise InvalidRecord("scope paths are not normalised, sorted and minimal")
    except InvalidRecord:
        raise
    except Exception:  # ScopeError: a path the CLI would refuse
        raise InvalidRecord("scope holds an invalid path") from None
    ow = _get(obj, "owner", dict)
    if set(ow) != {"taskId", "agentId", "host", "pid", "pidStart", "key"}:
        raise InvalidRecord("owner must have exactly taskId, agentId, host, pid, pidStart, key")
    owner = Owner(
        task_id=_get(ow, "taskId", str),
        agent_id=_get(ow, "agentId", str),
        host=_get(ow, "host", str),
        pid=_get(ow, "pid", int),
        pid_start=_get(ow, "pidStart", int, optional=True),
        key=_get(ow, "key", str, optional=True),
    )
    pr = _get(obj, "progress", dict, optional=True)
    progress = None
    if pr is not None:
        if set(pr) != {"note", "counter", "at"}:
            raise InvalidRecord("progress must have exactly note, counter, at")
        progress = Progress(note=_get(pr, "note", str), counter=_get(pr, "counter", int), at=_get(pr, "at", str))
    rec = Record(
        schema=schema,
        lease_id=_get(obj, "leaseId", str),
        repo=_get(obj, "repo", str),
        paths=paths,
        workspace_id=_get(obj, "workspaceId", str),
        owner=owner,
        status=_get(obj, "status", str),
        version=_get(obj, "version", int),
        acquired_at=_get(obj, "acquiredAt", str),
        renewed_at=_get(obj, "renewedAt", str),
        expires_at=_get(obj, "expiresAt", str),
        ttl=_get(obj, "ttl", int),
        renew_every=_get(obj, "renewEvery", int, optional=True),
        nonce=_get(obj, "nonce", str),
        progress=progress,
        stop_by=_get(obj, "stopBy", str) if "stopBy" in obj else None,
    )
    validate(rec)
    return rec


# ------------------------------------------------------------ a parsed record, kept


_new = object.__new__


def _all_str(items: tuple[Any, ...]) -> bool:
    return all(type(x) is str for x in items)


_OWNER_FIELDS = ("task_id", "agent_id", "host", "pid", "pid_start", "key")
_PROGRESS_FIELDS = ("note", "counter", "at")
# A kept record's values, in order: the Record's fields (owner and progress as tuples of theirs), then the
# timestamps parsed from them (``renewed``, ``expires``, ``stop_deadline``), kept so they are not parsed again.
_RECORD_FIELDS = (
    "lease_id",
    "repo",
    "paths",
    "workspace_id",
    "owner",
    "version",
    "acquired_at",
    "renewed_at",
    "expires_at",
    "ttl",
    "nonce",
    "status",
    "renew_every",
    "progress",
    "schema",
    "stop_by",
    "renewed",
    "expires",
    "stop_deadline",
)
_PATHS, _OWNER, _PROGRESS = (_RECORD_FIELDS.index(f) for f in ("paths", "owner", "progress"))
_PARSED = slice(_RECORD_FIELDS.index("renewed"), None)


def to_fields(rec: Record) -> tuple[Any, ...]:
    """A record as plain values (``marshal`` can write them): what ``from_fields`` rebuilds, its parsed
    timestamps included. For a cache of records already parsed and validated (service/recordcache.py)."""
    out = [getattr(rec, f) for f in _RECORD_FIELDS]
    out[_OWNER] = tuple(getattr(rec.owner, f) for f in _OWNER_FIELDS)
    p = rec.progress
    out[_PROGRESS] = tuple(getattr(p, f) for f in _PROGRESS_FIELDS) if p is not None else None
    return tuple(out)


def from_fields(t: tuple[Any, ...]) -> Record:
    """The record ``to_fields`` wrote, without checking it again (it was checked when parsed). Anything not of
    that shape raises ValueError, never builds a record."""
    if not isinstance(t, tuple) or len(t) != len(_RECORD_FIELDS):
        raise ValueError("not a kept record")
    ow, paths, pr = t[_OWNER], t[_PATHS], t[_PROGRESS]
    if not isinstance(ow, tuple) or len(ow) != len(_OWNER_FIELDS):
        raise ValueError("not a kept record")
    if type(paths) is not tuple or not paths or not (type(paths[0]) is str if len(paths) == 1 else _all_str(paths)):
        raise ValueError("not a kept record")
    if pr is not None and (not isinstance(pr, tuple) or len(pr) != len(_PROGRESS_FIELDS)):
        raise ValueError("not a kept record")
    if any(type(x) is not float for x in t[_PARSED]):
        raise ValueError("not a kept record")
    # Built as the dataclasses' own __init__ would (fields into __dict__, the cached timestamps beside them),
    # without a frozen __setattr__ call per field: this runs once per lease on every read.
    owner = _new(Owner)
    owner.__dict__.update(zip(_OWNER_FIELDS, ow))
    progress = None
    if pr is not None:
        progress = _new(Progress)
        progress.__dict__.update(zip(_PROGRESS_FIELDS, pr))
    rec = _new(Record)
    rec.__dict__.update(zip(_RECORD_FIELDS, t))
    rec.__dict__.update(owner=owner, progress=progress)
    return rec


def validate(rec: Record) -> None:
    if not 1 <= len(rec.paths) <= MAX_PATHS:
        raise InvalidRecord(f"scope paths must be 1 to {MAX_PATHS} paths")
    if not LEASE_ID.match(rec.lease_id):
        raise InvalidRecord(f"bad lease id {rec.lease_id[:60]!r}")
    if rec.status != "active":
        raise InvalidRecord(f"unknown status {rec.status[:40]!r}")
    if not 1 <= rec.version <= 10**12:
        raise InvalidRecord("version out of range")
    if not 1 <= rec.ttl <= 366 * 86400:
        raise InvalidRecord("ttl out of range")
    if rec.renew_every is not None and not 1 <= rec.renew_every <= rec.ttl:
        raise InvalidRecord("renewEvery out of range")
    if not 0 <= rec.owner.pid < 2**31:
        raise InvalidRecord("pid out of range")
    if not re.fullmatch(r"[0-9a-f]{32}", rec.nonce):
        raise InvalidRecord("bad nonce")
    try:
        acquired, renewed, expires = (parse_iso(rec.acquired_at), parse_iso(rec.renewed_at), parse_iso(rec.expires_at))
        if rec.progress is not None:
            parse_iso(rec.progress.at)
        stop = parse_iso(rec.stop_by) if rec.stop_by is not None else expires
    except ValueError:
        raise InvalidRecord("bad timestamp") from None
    if not acquired <= renewed < expires or expires - renewed != rec.ttl:
        raise InvalidRecord("timestamps are inconsistent (acquired <= renewed, expires = renewed + ttl)")
    if not renewed <= stop <= expires:
        raise InvalidRecord("timestamps are inconsistent (renewed <= stopBy <= expires)")
    cache = rec.__dict__  # what the cached properties would compute: read once, here
    cache["renewed"], cache["expires"], cache["stop_deadline"] = renewed, expires, stop
    for text in (rec.repo, rec.workspace_id, rec.owner.task_id, rec.owner.agent_id, rec.owner.host):
        if not text.isprintable() and any(ord(c) < 0x20 for c in text):
            raise InvalidRecord("control character in a text field")
