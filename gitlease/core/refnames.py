"""Every ref name gitlease writes or reads, and the encoding of paths into ref components: the one definition.

The store, the service, the audit log, the hooks and the server hook all import their ref names from here.
Standard library only, and imports nothing at module level: the pre-commit hook imports it on every commit.

Layout (docs/protocol.md):

* ``refs/leases/id/<leaseId>``: a lease's current version;
* ``refs/leases/scope/<encoded path>``: the grant (version 1) of the lease holding that path; the ref
  ``refs/leases/scope`` itself holds the whole repository (``.``);
* ``refs/leases/task/<encoded task id>``: the grant of the lease a queue runner took for that task (one ref
  component, ``encode_segment`` of the task id), created and deleted with the lease's other refs;
* ``refs/leases/outcome/<encoded task id>``: what became of a queued task (done, failed, retrying: a small
  JSON record, ``outcome.json``, in a commit; each new outcome a child of the one before), written by the
  queue runner (``git lease work``, docs/work.md); no lease reader counts it as a lease;
* ``refs/leases/doctor/<run>/...``: throw-away probes of ``git lease doctor`` (no lease reader lists them);
* ``refs/leases/verdict/<server>``: ``git lease doctor``'s verdict on the server reached at one URL
  (``<server>``: a hash of that URL; gitlease/service/verdict.py); not a lease;
* ``refs/leases-audit/<writer>``: the audit log of one writer (outside ``refs/leases/``, so no lease reader ever
  mistakes it for a lease);
* ``refs/leases-quarantine/<encoded task id>/<attempt>``: the work of a queued task's failed attempt, parked on
  the store by the queue runner so that any clone can fetch it (the server hook does not judge its paths:
  nothing lands by it; its commits are judged when they reach a branch).

A path segment becomes one ref component: bytes outside ``[A-Za-z0-9._-]`` are written ``+XX`` (upper-case
hex of the UTF-8 bytes), and so is a ``.`` that would start a component, follow another ``.`` or end it; a
component ending in ``.lock`` gets its dot escaped. Decoding refuses any component that is not in this canonical
form, so the encoding is injective (two overlapping scopes are exactly two refs of which one is a prefix of the
other: git's directory/file rule refuses them). Every name gitlease writes is within ``[A-Za-z0-9._+/-]``:
gitolite's default ref-name rule refuses ``%``, and Gerrit gives ``%`` a meaning of its own.

Earlier versions escaped with ``%XX`` where this one writes ``+XX`` (the same bytes escaped, the same hex). Those
*legacy* names are still read: ``decode_segment`` takes either form (never both in one component; neither can be
read as the other, since each form escapes the other's marker), and ``prefix_refs`` names both, so a lease
written by an earlier version still blocks, and is released and reclaimed by the names it has. A component that
needs no escape (letters, digits, ``-``, ``_``, inner dots) is the same in both forms.
"""

from __future__ import annotations

NAMESPACE = "refs/leases"
ID_PREFIX = NAMESPACE + "/id/"
SCOPE_REF = NAMESPACE + "/scope"  # the whole repository ('.'); paths live below it
TASK_PREFIX = NAMESPACE + "/task/"  # refs/leases/task/<encoded task id>: the grant of the lease working on it
OUTCOME_PREFIX = NAMESPACE + "/outcome/"  # refs/leases/outcome/<encoded task id>: a queued task's outcome
PROBE_PREFIX = NAMESPACE + "/doctor/"  # `git lease doctor`'s throw-away probes: not leases, never listed
VERDICT_PREFIX = NAMESPACE + "/verdict/"  # <server>: `git lease doctor`'s verdict on a server (service/verdict.py)
AUDIT_NAMESPACE = "refs/leases-audit"
AUDIT_PREFIX = AUDIT_NAMESPACE + "/"
QUARANTINE_PREFIX = "refs/leases-quarantine/"  # <encoded task id>/<attempt>: a failed attempt's work, parked

ROOT = "."  # the whole repository, as a scope (gitlease.core.scope.ROOT)

# Characters kept as they are inside a ref component; everything else is +XX-escaped (UTF-8 bytes).
SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
ESCAPE = "+"  # the escape of the names written now
LEGACY_ESCAPE = "%"  # the escape of the names written by earlier versions (read, never written)
_HEX = frozenset("0123456789ABCDEF")
_SAFE_NO_DOT = SAFE - {"."}


# ------------------------------------------------------------------------------ encoding


def encode_segment(segment: str) -> str:
    """One path segment as one valid ref component (injective; ``decode_segment`` inverts it). Undecodable
    bytes that git hands the hooks (surrogate escapes) are encoded as the bytes they stand for."""
    return _encode(segment, ESCAPE)


def legacy_segment(segment: str) -> str:
    """The component an earlier version wrote for ``segment`` (``%XX`` escapes): read, never written."""
    return _encode(segment, LEGACY_ESCAPE)


def _encode(segment: str, esc: str) -> str:
    raw = segment.encode("utf-8", "surrogateescape")
    n = len(raw)
    out = []
    for idx, byte in enumerate(raw):
        ch = chr(byte)
        escape = ch not in SAFE or ch == "." and (idx == 0 or idx == n - 1 or raw[idx - 1 : idx] == b".")
        out.append(f"{esc}{byte:02X}" if escape else ch)
    enc = "".join(out)
    if enc.endswith(".lock"):
        enc = enc[: -len(".lock")] + esc + "2Elock"
    return enc


def decode_segment(component: str) -> str:
    """Inverse of encode_segment, and of legacy_segment (a component with ``%XX`` escapes, from an earlier
    version); ValueError on a component neither can produce."""
    if "." not in component and component and _SAFE_NO_DOT.issuperset(component):
        return component  # letters, digits, '-' and '_' only: encode_segment writes them as they are
    esc = LEGACY_ESCAPE if LEGACY_ESCAPE in component else ESCAPE
    buf = bytearray()
    i = 0
    while i < len(component):
        ch = component[i]
        if ch == esc:
            hx = component[i + 1 : i + 3]
            if len(hx) != 2 or any(c not in _HEX for c in hx):
                raise ValueError(f"bad escape in ref component {component!r}")
            buf.append(int(hx, 16))
            i += 3
        else:
            if ch not in SAFE:
                raise ValueError(f"unexpected character in ref component {component!r}")
            buf.append(ord(ch))
            i += 1
    segment = buf.decode("utf-8")
    if _encode(segment, esc) != component:
        raise ValueError(f"ref component {component!r} is not in canonical encoding")
    return segment


def to_ref_suffix(path: str) -> str:
    """``services/billing`` -> ``services/billing``; ``.`` -> ``""`` (the namespace ref itself). ``path`` is
    normalised (gitlease.core.scope.normalize)."""
    if path == ROOT:
        return ""
    return "/".join(encode_segment(s) for s in path.split("/"))


def from_ref_suffix(suffix: str) -> str:
    if suffix == "":
        return ROOT
    return "/".join(decode_segment(c) for c in suffix.split("/"))


# ----------------------------------------------------------------------------- lease refs


def id_ref(lease_id: str) -> str:
    return ID_PREFIX + lease_id


def task_ref(task_id: str) -> str:
    """The claim of a queued task: created with the lease working on it (one ref component)."""
    return TASK_PREFIX + encode_segment(task_id)


def quarantine_ref(task_id: str, attempt: int) -> str:
    """Where the queue runner parks a failed attempt's work on the store (docs/work.md)."""
    return f"{QUARANTINE_PREFIX}{encode_segment(task_id)}/{int(attempt)}"


def outcome_ref(task_id: str) -> str:
    """Where a queued task's outcome is recorded (docs/work.md)."""
    return OUTCOME_PREFIX + encode_segment(task_id)


def scope_ref(path: str) -> str:
    """The scope ref of a normalised path."""
    suffix = to_ref_suffix(path)
    return f"{SCOPE_REF}/{suffix}" if suffix else SCOPE_REF


def is_scope_ref(ref: str) -> bool:
    return ref == SCOPE_REF or ref.startswith(SCOPE_REF + "/")


def path_of_scope_ref(ref: str) -> str:
    """Inverse of scope_ref; ValueError for a ref gitlease cannot have written."""
    if ref == SCOPE_REF:
        return ROOT
    if not ref.startswith(SCOPE_REF + "/"):
        raise ValueError(ref)
    suffix = ref[len(SCOPE_REF) + 1 :]
    from gitlease.core.scope import PLAIN_NAME, normalize

    if PLAIN_NAME.fullmatch(suffix):  # the common case: each component decodes to itself, and is canonical
        return suffix
    path = from_ref_suffix(suffix)
    try:
        ok = normalize(path) == path
    except Exception:  # ScopeError: a decoded path no scope can be ("..", ".git", too long)
        ok = False
    if not ok:
        raise ValueError(ref)
    return path


def legacy_scope_ref(path: str) -> str:
    """The scope ref an earlier version wrote for a normalised path (``%XX`` escapes); the same as
    ``scope_ref`` when no segment needs an escape."""
    if path == ROOT:
        return SCOPE_REF
    return SCOPE_REF + "/" + "/".join(legacy_segment(s) for s in path.split("/"))


def prefix_refs(path: str) -> list[tuple[str, str]]:
    """(scope ref, scope) of every scope that contains the normalised ``path``: the whole repository, then
    each folder, then the path itself. A lease overlapping a file path must hold one of these. A scope whose
    name needs an escape comes twice: its ref as written now, then as an earlier version wrote it."""
    out = [(SCOPE_REF, ROOT)]
    if path == ROOT:
        return out
    segs = path.split("/")
    ref = legacy = SCOPE_REF
    for i, s in enumerate(segs):
        enc = encode_segment(s)
        ref = ref + "/" + enc
        legacy = legacy + "/" + (enc if ESCAPE not in enc else legacy_segment(s))
        scope = "/".join(segs[: i + 1])
        out.append((ref, scope))
        if legacy != ref:
            out.append((legacy, scope))
    return out
