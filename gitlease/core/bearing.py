"""Which leases of a listing bear on some paths, told from ref names and a per-commit index, before any record
is read: what lets a hook or ``can-start`` read a few leases of a store of thousands and answer as a full read
would (``restrict_refs``). Pure: ref names, scope paths and the index in, refs out; standard library and
``core.refnames`` at import (``core.scope``, and with it ``re``, only when ``restrict_refs`` runs), so the lean
pre-push path (enforce/quickpush.py) shares ``containing``."""

from __future__ import annotations

from gitlease.core.refnames import ID_PREFIX, ROOT, SCOPE_REF, TASK_PREFIX, path_of_scope_ref

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy reads it alike
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

Index = dict[str, "tuple[str, str] | None"]  # oid -> (lease id, its paths joined by "\n") of its record, None: none


def restrict_refs(
    refs: dict[str, str], index: Index, paths: Iterable[str], keep: Iterable[str] = ()
) -> tuple[dict[str, str], set[str]]:
    """The listed refs ``build_views`` needs to answer for ``paths`` as it would from all of them: every ref of
    each lease that holds, or whose refs or records name, a path overlapping ``paths``, and of the leases in
    ``keep``; every scope ref gitlease cannot have written (they block what they name); the scope refs of a
    commit that holds no record, when one of them overlaps. ``index`` gives each listed commit's lease and
    paths (service/recordcache.py) without building its record. Also returns every lease id the listing holds
    (the replay memory's "present"). A view built from the result is the full read's view of that lease, so
    ``blocking`` and ``overlapping`` on ``paths`` answer alike."""
    hits = _overlap_test(set(paths))
    chosen = set(keep)
    groups: set[str] = set()  # commits holding no record whose scope refs overlap: kept whole
    odd: set[str] = set()  # scope refs gitlease cannot have written
    present = set()  # every lease id the listing holds (its id refs', and its grants')
    judged: dict[str, bool] = {}  # oid -> whether its record names an overlapping path
    scope_dir = SCOPE_REF + "/"
    cut, id_cut = len(scope_dir), len(ID_PREFIX)
    from gitlease.core.scope import PLAIN_NAME  # here, not above: the lean pre-push path imports this module

    plain = PLAIN_NAME.fullmatch  # a scope ref's path without decoding it (path_of_scope_ref agrees)
    for ref, oid in refs.items():
        if ref.startswith(ID_PREFIX):
            present.add(ref[id_cut:])
        elif ref.startswith(scope_dir) or ref == SCOPE_REF:
            q = ref[cut:]
            if not plain(q):
                try:
                    q = path_of_scope_ref(ref)
                except ValueError:
                    odd.add(ref)
                    continue
            if hits(q):
                ent = index.get(oid)
                if ent is None:
                    groups.add(oid)
                else:
                    chosen.add(ent[0])
        elif not ref.startswith(TASK_PREFIX):
            continue
        got = judged.get(oid)
        if got is None:
            ent = index.get(oid)
            got = False
            if ent is not None:
                for q in ent[1].split("\n"):
                    if hits(q):
                        got = True
                        chosen.add(ent[0])
                        break
                if not ref.startswith(ID_PREFIX):
                    present.add(ent[0])
            judged[oid] = got
        elif not ref.startswith(ID_PREFIX) and (ent := index.get(oid)) is not None:
            present.add(ent[0])
    return _refs_of(refs, index, chosen, groups, odd), present


def _overlap_test(query: set[str]) -> Callable[[str], bool]:
    """Whether a normalised path overlaps one of ``query``: an ancestor of one (or one itself), or below one."""
    everything = ROOT in query
    near = containing(query)
    tops = {p.partition("/")[0] for p in query}  # a path below a queried one starts with one of these

    def hits(q: str) -> bool:
        return everything or q in near or (q.partition("/")[0] in tops and _any_ancestor_in_set(q, query))

    return hits


def containing(paths: Iterable[str]) -> set[str]:
    """Every scope that contains one of ``paths``: the whole repository, each folder above one, and each one."""
    paths = list(paths)
    near = folders_above(paths)
    near.add(ROOT)
    near.update(paths)
    return near


def folders_above(paths: Iterable[str]) -> set[str]:
    """Every folder above one of ``paths`` (the whole repository apart)."""
    out = set()
    for p in paths:
        i = p.find("/")
        while i >= 0:
            out.add(p[:i])
            i = p.find("/", i + 1)
    return out


def _refs_of(refs: dict[str, str], index: Index, chosen: set[str], groups: set[str], odd: set[str]) -> dict[str, str]:
    """Every ref of a chosen lease: its id ref (by name, or pointing at one of its commits), the scope and task
    refs on its commits; the scope refs of an overlapping record-less commit (``groups``); every odd scope ref."""
    scope_dir = SCOPE_REF + "/"
    theirs = {oid for oid, ent in index.items() if ent is not None and ent[0] in chosen}
    out: dict[str, str] = {ref: refs[ref] for ref in odd}
    for lease_id in chosen:
        ref = ID_PREFIX + lease_id
        if ref in refs:
            out[ref] = refs[ref]
    for ref, oid in refs.items():
        if oid in theirs:
            if ref.startswith((ID_PREFIX, scope_dir, TASK_PREFIX)) or ref == SCOPE_REF:
                out[ref] = oid
        elif oid in groups and (ref.startswith(scope_dir) or ref == SCOPE_REF):
            out[ref] = oid
    return out


def _any_ancestor_in_set(path: str, others: set[str]) -> bool:
    """True when one of ``others`` contains ``path`` (``path`` itself included)."""
    return path in others or proper_ancestor_in(path, others)


def proper_ancestor_in(path: str, others: set[str]) -> bool:
    """True when one of ``others`` is a folder above ``path``."""
    i = path.find("/")
    while i >= 0:
        if path[:i] in others:
            return True
        i = path.find("/", i + 1)
    return False
