"""Enforcement rules: which changed paths a worktree may commit or push, and the refusal message.

One rule for every place that checks (the pre-commit and pre-push hooks, ``git lease verify`` in CI, the
server's pre-receive hook): every changed path must lie inside a scope the writer holds (mode ``strict``),
and outside every lease somebody else holds (modes ``strict`` and ``others``).

Standard library only, and cheap to import (no ``typing``, ``dataclasses``, ``re`` or ``subprocess``): the
pre-commit hook imports it on every commit. Pure functions plus two small readers of local files (the
worktree's ``held.json`` and the service's refs cache), whose layouts this module mirrors from
``gitlease/core/state.py`` and ``gitlease/service/leases.py`` (tests check that they agree). Ref names and
their encoding come from ``gitlease/core/refnames.py``, which the store uses too.
"""

from __future__ import annotations

import os

from gitlease.core.errors import InvalidRecord
from gitlease.core.modes import MODES, effective_mode, parse_mode  # noqa: F401  (re-exported for the hooks)
from gitlease.core.refnames import ID_PREFIX, prefix_refs

ROOT = "."


# --------------------------------------------------------------------------------- paths


def contains(outer: str, inner: str) -> bool:
    """Segment-aware containment for normalised paths (the same rule as ``scope.contains``, without
    importing it: this module stays cheap)."""
    return outer == ROOT or inner == outer or inner.startswith(outer + "/")


def covering(scopes, path: str) -> str | None:
    """The scope (of ``scopes``) that contains ``path``, or None."""
    for s in scopes:
        if contains(s, path):
            return s
    return None


def suggest_scope(path: str) -> str:
    """The smallest scope worth asking for to cover ``path``: its folder (a file at the top: itself)."""
    head, sep, _ = path.rpartition("/")
    return head if sep else path


def show_path(path: str) -> str:
    """A path as one safe line: quoted with C-style escapes (like git's core.quotePath) when it holds a
    control character, a quote or a backslash; bytes that are not UTF-8 as \\xNN."""
    if not any(ord(c) < 0x20 or c in '"\\\x7f' or 0xDC80 <= ord(c) <= 0xDCFF for c in path):
        return path
    out = []
    for c in path:
        o = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        elif 0xDC80 <= o <= 0xDCFF:  # surrogateescape of an undecodable byte
            out.append(f"\\x{o - 0xDC00:02x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def zsplit(data: bytes) -> list[str]:
    """NUL-terminated git output -> paths (undecodable bytes kept as surrogate escapes)."""
    text = data.decode("utf-8", "surrogateescape")
    return [p for p in text.split("\0") if p]


# ---------------------------------------------------------------------------- lease facts


class Mine:
    """A lease the checker holds (from held.json, or named to ``verify``), as far as it is known."""

    __slots__ = ("lease_id", "paths", "expires_at", "grant", "problem", "ungranted", "current")

    def __init__(
        self,
        lease_id: str,
        paths,
        expires_at: str,
        grant: str | None = None,
        problem: str | None = None,
        ungranted=(),
    ) -> None:
        # expires_at: the moment its holder must have stopped writing (the record's stopBy, else its expiry)
        self.lease_id, self.paths, self.expires_at, self.grant = lease_id, tuple(paths), expires_at, grant
        self.problem = problem  # why it no longer counts (lost on the remote, ...), None if fine
        self.ungranted = tuple(ungranted)  # paths the local state lists that the store does not grant it
        self.current: tuple[str, ...] = ()  # held.json's current (and pending) version oids, when read from it

    def usable(self, now: float) -> bool:
        return self.problem is None and not expired(self.expires_at, now)


class Holder:
    """Another lease that blocks a path: who, on which scope, and how long it has left."""

    __slots__ = ("lease_id", "scope", "task", "agent", "seconds_left", "invalid")

    def __init__(
        self,
        lease_id: str,
        scope: str,
        task: str | None = None,
        agent: str | None = None,
        seconds_left: int | None = None,
        invalid: str | None = None,
    ) -> None:
        self.lease_id, self.scope, self.task, self.agent = lease_id, scope, task, agent
        self.seconds_left, self.invalid = seconds_left, invalid

    def describe(self) -> str:
        if self.invalid is not None:
            return f"held by {self.lease_id} (invalid: {self.invalid})"
        left = self.seconds_left
        when = (
            ""
            if left is None
            else (f", {left}s left" if left >= 0 else f", expired {-left}s ago, within the skew margin")
        )
        return f"held by {self.lease_id} (task={self.task} agent={self.agent}{when})"

    def to_json(self) -> dict:
        return {
            "leaseId": self.lease_id,
            "scope": self.scope,
            "taskId": self.task,
            "agentId": self.agent,
            "secondsLeft": self.seconds_left,
            "invalid": self.invalid,
        }


class Violation:
    """One changed path that may not be written, and why."""

    __slots__ = ("path", "scope", "reason", "holder", "code")

    def __init__(self, path: str, scope: str, reason: str, holder: Holder | None = None, code: int = 4) -> None:
        self.path, self.scope, self.reason, self.holder, self.code = path, scope, reason, holder, code

    def line(self) -> str:
        return f"  {show_path(self.path)}: scope {show_path(self.scope)}, {self.reason}"

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "scope": self.scope,
            "reason": self.reason,
            "holder": self.holder.to_json() if self.holder else None,
        }


def iso_now(now: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(now)))


def expired(expires_at: str, now: float) -> bool:
    """By the local clock. ``expiresAt`` is fixed-width RFC 3339 UTC, so text order is time order; anything
    else counts as expired (fail closed)."""
    if not isinstance(expires_at, str) or len(expires_at) != 20 or not expires_at.endswith("Z"):
        return True
    return iso_now(now) >= expires_at


# ----------------------------------------------------------------------------------- check


def check(paths, mine, mode: str, now: float, others, who: str = "this worktree") -> list[Violation]:
    """The violations among ``paths``. ``mine``: the checker's leases (Mine); ``others(paths)`` returns
    {path: Holder} for the paths some other, not yet expired (or invalid) lease covers; it is called once,
    only with the paths that need it. ``mode``: strict | others (warn and off decide about the result, not
    the check: pass ``strict`` or ``others`` for them). ``who`` names the writer in the reasons."""
    if mode == "off":
        return []
    usable = [m for m in mine if m.usable(now)]
    out: list[Violation] = []
    ask: list[str] = []
    for p in paths:
        if mode == "strict" and covering_mine(usable, p) is None:
            ask.append(p)
        elif mode == "others":
            ask.append(p)
    if mode == "strict":
        # A path inside a usable lease of ours cannot be in another active lease (leases never overlap);
        # only the refused ones are looked up, to say who holds them.
        held = others(ask) if ask else {}
        for p in ask:
            h = held.get(p)
            if h is not None:
                out.append(Violation(p, h.scope, h.describe(), h))
                continue
            forged = next((m for m in mine if covering(m.ungranted, p) is not None), None)
            if forged is not None:
                out.append(
                    Violation(
                        p,
                        covering(forged.ungranted, p) or p,
                        f"{who}'s lease {forged.lease_id} does not hold it on the lease store (only the "
                        "local held.json lists it: changed outside gitlease?)",
                    )
                )
                continue
            stale = next((m for m in mine if covering(m.paths, p) is not None), None)
            if stale is not None:
                s = covering(stale.paths, p) or p
                if stale.problem:
                    out.append(Violation(p, s, f"{who}'s lease {stale.lease_id} {stale.problem}", code=6))
                else:
                    out.append(
                        Violation(
                            p,
                            s,
                            f"{who}'s lease {stale.lease_id} passed its stop deadline {stale.expires_at} (local clock)",
                        )
                    )
                continue
            out.append(Violation(p, suggest_scope(p), f"not leased by {who}"))
        return out
    held = others(ask) if ask else {}
    for p in ask:
        h = held.get(p)
        if h is not None and covering_mine(usable, p) is None:
            out.append(Violation(p, h.scope, h.describe(), h))
    return out


def covering_mine(mine, path: str) -> Mine | None:
    for m in mine:
        if covering(m.paths, path) is not None:
            return m
    return None


def exit_code(violations) -> int:
    """4 (scope violation); 6 (lease lost) only when every refusal is a lost lease of ours."""
    if violations and all(v.code == 6 for v in violations):
        return 6
    return 4


def refusal(
    action: str,
    mode: str,
    violations,
    *,
    warn: bool = False,
    why: str | None = None,
    mine: str = "the leases held here",
    limit: int = 50,
) -> list[str]:
    """The lines printed on a refusal (or, in warn mode, a warning). ``action``: commit, push, verify."""
    n = len(violations)
    plural = "s" if n != 1 else ""
    what = f"{n} path{plural} outside {mine}" if mode == "strict" else f"{n} path{plural} inside leases held by others"
    label = why or f"lease.enforce={mode}"
    head = (
        f"gitlease: warning (lease.enforce=warn): {action} has {what}"
        if warn
        else f"gitlease: {action} refused ({label}): {what}"
    )
    lines = [head] + [v.line() for v in violations[:limit]]
    if n > limit:
        lines.append(f"  ... and {n - limit} more")
    if not warn:
        lines.append("gitlease: acquire the scope first (git lease acquire --scope SCOPE), or see git lease status")
    return lines


# ---------------------------------------------------------------------------- local state


class _Strict:
    """The settings ``_json.make_scanner`` reads (those of ``json.loads`` with no options)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"non-standard JSON constant {name}")


def loads(text: str):
    """``json.loads`` without importing ``json``: its module compiles regular expressions at import (``re``,
    ``enum``, ...: 5 to 30 ms here, more than the rest of the hook). Uses the C scanner ``json`` itself uses;
    ValueError on anything that is not one JSON document."""
    try:
        from _json import make_scanner
    except ImportError:  # an interpreter without the C accelerator
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(" \t\n\r"))
    try:
        # typeshed wants a make_scanner as the context; it reads the settings' attributes (duck typing)
        obj, end = make_scanner(_Strict())(text, start)  # type: ignore[arg-type]
    except Exception:  # not JSON (the scanner's own errors are odd outside json): let json say why
        import json

        return json.loads(text)
    if text[end:].strip(" \t\n\r"):
        raise ValueError("extra data after the JSON document")
    return obj


def load_held(path: str) -> list[Mine]:
    """The leases in a worktree's ``held.json`` (layout of gitlease/core/state.py, version 1). Missing: none.
    Unreadable or corrupt: InvalidRecord (the caller refuses: fail closed)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InvalidRecord(f"cannot read local lease state {path}: {exc.strerror}") from None
    try:
        doc = loads(raw.decode("utf-8"))
        if doc.get("version") != 1 or not isinstance(doc.get("leases"), dict):
            raise ValueError("layout")
        out = []
        for h in doc["leases"].values():
            paths = h["paths"]
            if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
                raise ValueError("paths")
            m = Mine(str(h["lease_id"]), paths, _stop_by(h), str(h["grant"]))
            m.current = tuple(str(o) for o in (h.get("current"), h.get("pending")) if o)
            out.append(m)
        return out
    except (ValueError, TypeError, AttributeError, KeyError, UnicodeDecodeError):
        raise InvalidRecord(
            f"local lease state {path} is corrupt (move it aside; the leases on the remote "
            "are unaffected and expire on their own)"
        ) from None


def _stop_by(h) -> str:
    """The moment a held lease's writer must stop: the stop deadline its current record carries (``stopBy``,
    earlier than the expiry when its holder promised to stop sooner, so that sweepers may reclaim it then),
    else its expiry. Held state without a readable record counts as expired (fail closed)."""
    try:
        rec = loads(h["record"])
        stop = rec.get("stopBy") or rec["expiresAt"]
    except (ValueError, TypeError, KeyError, AttributeError):
        return ""
    if not isinstance(stop, str):
        return ""
    return min(stop, str(h["expires_at"]))


def common_dir(git_dir: str) -> str:
    """A worktree's common git dir (gitrepository-layout: a linked worktree's ``commondir`` file)."""
    try:
        with open(os.path.join(git_dir, "commondir"), encoding="utf-8") as fh:
            rel = fh.read().strip()
    except OSError:
        return git_dir
    return os.path.normpath(os.path.join(git_dir, rel))


def refs_cache_path(common: str, store_name: str) -> str:
    """Where the service keeps the last listing of a store (service._RefsCache; tests check they agree)."""
    from gitlease.core import listingfile

    return listingfile.path_in(os.path.join(common, "gitlease"), store_name)


def load_refs_cache(common: str, store_name: str) -> tuple[dict, float] | None:
    from gitlease.core import listingfile

    return listingfile.read(refs_cache_path(common, store_name))


# ------------------------------------------------------------------ others' leases from refs


def holders_from_refs(paths, refs, mine_grants, records, now: float, skew: int) -> dict:
    """{path: Holder} for the paths some lease in ``refs`` covers, other than ours (``mine_grants``: grant oids
    of our leases) and not expired beyond ``skew``. ``refs``: a listing of refs/leases/* (a dict), or anything
    with the dict's ``get`` (the hooks read only the refs asked for: entry.RefView). ``records(oids)`` returns
    {oid: record dict or None (unreadable)}; called once, only when some path is covered."""
    hits: dict[str, tuple[str, str]] = {}  # path -> (scope, grant oid)
    for p in paths:
        for ref, scope in prefix_refs(p):
            oid = refs.get(ref)
            if oid is not None and oid not in mine_grants:
                hits[p] = (scope, oid)
                break
    if not hits:
        return {}
    grants = {oid for _, oid in hits.values()}
    recs = records(grants)
    current: dict[str, str] = {}  # grant oid -> id ref oid
    for g in grants:
        rec = recs.get(g)
        lid = rec.get("leaseId") if isinstance(rec, dict) else None
        cur = refs.get(ID_PREFIX + lid) if isinstance(lid, str) else None
        if cur:
            current[g] = cur
    recs.update(records(set(current.values()) - set(recs)))
    out: dict[str, Holder] = {}
    for p, (scope, g) in hits.items():
        rec = recs.get(current.get(g, g)) or recs.get(g)
        h = holder_from_record(rec, scope, g, now)
        if h.invalid is None and h.seconds_left is not None and h.seconds_left < -skew:
            continue  # expired beyond the margin: it blocks nobody (it may be cleared)
        out[p] = h
    return out


_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def epoch(stamp) -> int:
    """``YYYY-MM-DDTHH:MM:SSZ`` (what records hold) -> seconds since the epoch, without ``time.strptime`` (which
    imports ``re``, ``locale`` and ``calendar``: more than the rest of a hook). ValueError on anything else,
    as strptime would (fail closed: an unreadable expiry makes the holder invalid, so it keeps blocking)."""
    if not isinstance(stamp, str) or len(stamp) != 20 or stamp[19] != "Z":
        raise ValueError(stamp)
    if stamp[4] != "-" or stamp[7] != "-" or stamp[10] != "T" or stamp[13] != ":" or stamp[16] != ":":
        raise ValueError(stamp)
    fields = (stamp[0:4], stamp[5:7], stamp[8:10], stamp[11:13], stamp[14:16], stamp[17:19])
    if not all(f.isascii() and f.isdigit() for f in fields):
        raise ValueError(stamp)
    y, m, d, hh, mi, ss = (int(f) for f in fields)
    if y < 1:
        raise ValueError(stamp)
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    if not 1 <= m <= 12 or not 1 <= d <= _DAYS[m - 1] + (1 if m == 2 and leap else 0):
        raise ValueError(stamp)
    if hh > 23 or mi > 59 or ss > 61:
        raise ValueError(stamp)
    y -= m <= 2  # days from the civil date (H. Hinnant's algorithm)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return (era * 146097 + doe - 719468) * 86400 + hh * 3600 + mi * 60 + ss


def holder_from_record(rec, scope: str, oid: str, now: float) -> Holder:
    try:
        owner = rec["owner"]
        exp = rec["expiresAt"]
        left = int(epoch(exp) - now)
        return Holder(str(rec["leaseId"]), scope, str(owner["taskId"]), str(owner["agentId"]), left)
    except (TypeError, KeyError, ValueError):
        return Holder(f"?{oid[:12]}", scope, invalid="unreadable lease record; see git lease status")
