"""Scope algebra: repository-relative POSIX path prefixes, segment-aware.

A scope is a normalised path such as ``services/billing`` (covering everything at or below it) or ``.``
(the whole repository). Pure functions only; no git, no I/O.

The ref encoding of a scope (one path segment to one ref component) is gitlease.core.refnames.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gitlease.core.errors import ScopeError

ROOT = "."
MAX_PATH_BYTES = 4096
# A scope is stored as a ref (one path segment, encoded, per ref component: gitlease.core.refnames). git's files
# ref backend keeps each ref in a file and locks it with "<name>.lock": a component over 250 bytes cannot be
# locked on common file systems (255-byte file names), and the whole ref must stay well below PATH_MAX once
# the server's own path to the repository is in front of it.
MAX_COMPONENT_BYTES = 250
MAX_REF_BYTES = 2048


# A path no longer than this (ASCII) whose segments are at most _PLAIN_SEGMENT long is storable whatever its
# characters: a byte encodes to at most 3 ref characters ("%XX"), so 3 * len stays within the limits above.
_PLAIN_SEGMENT = MAX_COMPONENT_BYTES // 3
_PLAIN_PATH = (MAX_REF_BYTES - len("refs/leases/scope/")) // 3
# A path of letters, digits, '-' and '_' segments within those limits: canonical as it is (``normalize``
# returns it unchanged) and its own scope-ref suffix (gitlease.core.refnames encodes none of these characters).
# Matched in one C call where every lease ref of a large store is looked at (bearing.restrict_refs).
_SEG = rf"[A-Za-z0-9_-]{{1,{_PLAIN_SEGMENT}}}"
PLAIN_NAME = re.compile(rf"(?=.{{1,{_PLAIN_PATH}}}\Z){_SEG}(?:/{_SEG})*")


def normalize(raw: str) -> str:
    """Return the canonical form of a scope argument, or raise ScopeError saying why it is refused."""
    if isinstance(raw, str) and _is_plain(raw):
        return raw  # already canonical (the common case: every path of every record read)
    return _normalize(raw)


def _is_plain(raw: str) -> bool:
    """True only for a path ``_normalize`` returns unchanged, decided without encoding it: printable ASCII, no
    backslash, no empty, ``.``, ``..`` or ``.git`` segment, short enough to be storable for certain. Anything
    else (``False``) takes the full check, which says why or normalises."""
    if len(raw) > _PLAIN_PATH or not raw.isascii() or not raw.isprintable() or "\\" in raw:
        return False
    for part in raw.split("/"):
        n = len(part)
        if not n or n > _PLAIN_SEGMENT or part == "." or part == ".." or n == 4 and part.lower() == ".git":
            return False
    return True


def _normalize(raw: str) -> str:
    """``normalize`` in full: every check, and the canonical form of anything it accepts."""
    if not isinstance(raw, str):
        raise ScopeError(f"scope must be a string, not {type(raw).__name__}")
    shown = _show(raw)
    if raw == "":
        raise ScopeError("empty scope (use '.' for the whole repository)")
    if "\x00" in raw:
        raise ScopeError(f"scope {shown} contains a NUL character")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise ScopeError(f"scope {shown} contains a control character")
    if "\\" in raw:
        raise ScopeError(f"scope {shown} contains a backslash (use '/' between path segments)")
    if raw.startswith("/"):
        raise ScopeError(f"scope {shown} is an absolute path (give a path relative to the repository root)")
    try:
        encoded_len = len(raw.encode("utf-8"))
    except UnicodeEncodeError:
        raise ScopeError(f"scope {shown} is not valid unicode") from None
    if encoded_len > MAX_PATH_BYTES:
        raise ScopeError(f"scope is longer than {MAX_PATH_BYTES} bytes")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ScopeError(f"scope {shown} contains '..' (scopes stay inside the repository)")
    if any(p.lower() == ".git" for p in parts):
        raise ScopeError(f"scope {shown} names a .git directory, which is never part of the repository's tree")
    if not parts:
        return ROOT
    _check_storable(parts, shown)
    return "/".join(parts)


def _check_storable(parts: list[str], shown: str) -> None:
    """Refuse a path whose scope ref git could not store (see MAX_COMPONENT_BYTES)."""
    from gitlease.core.refnames import SCOPE_REF, encode_segment

    total = len(SCOPE_REF)
    for p in parts:
        n = len(encode_segment(p))
        total += n + 1
        if n > MAX_COMPONENT_BYTES:
            raise ScopeError(
                f"scope {shown}: the segment {_show(p[:40])}{'...' if len(p) > 40 else ''} is {n} bytes once "
                f"encoded as a ref name component, over git's limit of {MAX_COMPONENT_BYTES}: no lease can be "
                "stored for it (lease its folder instead)"
            )
    if total > MAX_REF_BYTES:
        raise ScopeError(
            f"scope {shown} is {total} bytes once encoded as a ref name, over the limit of {MAX_REF_BYTES}: "
            "no lease can be stored for it (lease a folder above it instead)"
        )


def normalize_all(raws: Iterable[str] | str) -> tuple[str, ...]:
    """Normalise several scopes and drop those covered by another, sorted: the canonical path set. One scope
    may be given as a plain string ("services/tax"), not only as a list of them."""
    if isinstance(raws, str):
        raws = [raws]
    paths = sorted({normalize(r) for r in raws})
    if not paths:
        raise ScopeError("no scope given (use --scope PATH, or '.' for the whole repository)")
    return minimize(paths)


def minimize(paths: Iterable[str]) -> tuple[str, ...]:
    """Drop every path that another path of the set contains, sorted. Input must be normalised.

    One sort by segment tuples, then one pass: in that order every path a scope contains follows it directly
    (``a``, ``a/b``, ``a/b/c``, then ``a-x``; ``a/bc`` is not under ``a/b``), so a path is covered exactly when
    the last path kept contains it. O(n log n) for the sort, linear after it."""
    ordered = sorted((_segments(p), p) for p in set(paths))
    kept: list[str] = []
    last: tuple[str, ...] | None = None
    for segs, p in ordered:
        if last is not None and segs[: len(last)] == last:
            continue
        kept.append(p)
        last = segs
    kept.sort()
    return tuple(kept)


def minimize_quadratic(paths: Iterable[str]) -> tuple[str, ...]:
    """The pairwise definition ``minimize`` replaces (every path against every kept one): the reference its
    tests compare against."""
    ordered = sorted(set(paths), key=lambda p: (_segments(p), p))
    kept: list[str] = []
    for p in ordered:
        if not any(contains(k, p) for k in kept):
            kept.append(p)
    return tuple(sorted(kept))


def _segments(path: str) -> tuple[str, ...]:
    return () if path == ROOT else tuple(path.split("/"))


def contains(outer: str, inner: str) -> bool:
    """True when every path under ``inner`` is also under ``outer`` (both normalised)."""
    o, i = _segments(outer), _segments(inner)
    return i[: len(o)] == o


def overlaps(a: str, b: str) -> bool:
    """True when some path lies under both scopes: one contains the other."""
    return contains(a, b) or contains(b, a)


def covers(scopes: Iterable[str], path: str) -> bool:
    """True when a repository path lies inside one of the scopes."""
    return any(contains(s, path) for s in scopes)


def sets_overlap(a: Iterable[str], b: Iterable[str]) -> bool:
    """True when some scope of ``a`` overlaps some scope of ``b``. Small sets pair by pair; larger ones by
    looking up each scope's ancestors (itself included) in the other set: linear in the paths times their depth."""
    al, bl = list(a), list(b)
    if len(al) * len(bl) <= 64:
        return any(overlaps(x, y) for x in al for y in bl)
    return _any_ancestor_in(al, set(bl)) or _any_ancestor_in(bl, set(al))


def _any_ancestor_in(paths: list[str], others: set[str]) -> bool:
    """True when one of ``others`` contains one of ``paths``."""
    if ROOT in others:
        return bool(paths)
    for p in paths:
        if p == ROOT:
            continue
        i = p.find("/")
        while i >= 0:
            if p[:i] in others:
                return True
            i = p.find("/", i + 1)
        if p in others:
            return True
    return False


def _show(raw: str) -> str:
    text = repr(raw)
    return text if len(text) <= 80 else text[:77] + "..."
