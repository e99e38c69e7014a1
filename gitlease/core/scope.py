"""Scope algebra: repository-relative POSIX path prefixes, segment-aware.

A scope is a normalised path such as ``services/billing`` (covering everything at or below it) or ``.``
(the whole repository). Pure functions only; no git, no I/O.

The ref encoding of a scope (one path segment to one ref component) is gitlease.core.refnames.
"""

from __future__ import annotations

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


def normalize(raw: str) -> str:
    """Return the canonical form of a scope argument, or raise ScopeError saying why it is refused."""
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
    """Drop every path that another path of the set contains. Input must be normalised."""
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
    bl = list(b)
    return any(overlaps(x, y) for x in a for y in bl)


def _show(raw: str) -> str:
    text = repr(raw)
    return text if len(text) <= 80 else text[:77] + "..."
