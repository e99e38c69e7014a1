"""An index of scopes by path segment (a trie), for "which entries overlap this scope?" without a double loop.

Each entry is a key (a lease id, a task id) with one or more normalised scopes and a payload. Two scopes
overlap when one contains the other (``gitlease.core.scope.overlaps``), so the entries overlapping a scope ``q``
are exactly those stored on the trie path from the root down to ``q`` (its ancestors, ``.`` included, and
``q`` itself) plus everything stored in the subtree below ``q``. A query costs the depth of ``q`` plus the
size of what it returns, not the number of entries. Nodes left empty by ``remove`` are pruned, so every
node of a subtree leads to at least one entry and walking it costs no more than its results.

Pure: no git, no I/O. Results come in insertion order (oldest entry first), so they are deterministic.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from gitlease.core.scope import ROOT

K = TypeVar("K", bound=Hashable)  # the entries' keys
P = TypeVar("P")  # their payloads


class _Node(Generic[K]):
    __slots__ = ("children", "keys")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K]] = {}
        self.keys: dict[K, None] = {}  # keys stored exactly at this scope (ordered set)


def _segments(path: str) -> list[str]:
    return [] if path == ROOT else path.split("/")


class PathIndex(Generic[K, P]):
    """Scopes -> keys (``PathIndex[K, P]``: keys of type K, payloads of type P). ``add(key, scopes, payload)``,
    ``remove(key)``, ``overlapping(scopes)``."""

    def __init__(self) -> None:
        self._root: _Node[K] = _Node()
        self._entries: dict[K, tuple[tuple[str, ...], P | None, int]] = {}
        self._seq = 0

    # ----------------------------------------------------------------------------- writing
    def add(self, key: K, scopes: Iterable[str], payload: P | None = None) -> None:
        """Store ``key`` under each of ``scopes`` (normalised paths). A key already present is replaced."""
        if key in self._entries:
            self.remove(key)
        paths = tuple(dict.fromkeys(scopes))
        for path in paths:
            node = self._root
            for seg in _segments(path):
                nxt = node.children.get(seg)
                if nxt is None:
                    nxt = node.children[seg] = _Node()
                node = nxt
            node.keys[key] = None
        self._entries[key] = (paths, payload, self._seq)
        self._seq += 1

    def remove(self, key: K) -> bool:
        """Drop ``key`` from every scope it was stored under; False if it was not there."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        for path in entry[0]:
            trail = [self._root]
            segs = _segments(path)
            for seg in segs:
                trail.append(trail[-1].children[seg])
            trail[-1].keys.pop(key, None)
            for depth in range(len(segs), 0, -1):  # prune nodes that lead to nothing any more
                node = trail[depth]
                if node.keys or node.children:
                    break
                del trail[depth - 1].children[segs[depth - 1]]
        return True

    # ----------------------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def scopes(self, key: K) -> tuple[str, ...]:
        return self._entries[key][0]

    def payload(self, key: K) -> P | None:
        return self._entries[key][1]

    def overlapping(self, scopes: Iterable[str]) -> list[K]:
        """Every key with a scope overlapping one of ``scopes``, each once, oldest first."""
        found: dict[K, None] = {}
        for path in scopes:
            self._collect(path, found)
        if len(found) < 2:
            return list(found)
        seq = self._entries
        return sorted(found, key=lambda k: seq[k][2])

    def any_overlapping(self, scopes: Iterable[str]) -> bool:
        """True when some key overlaps ``scopes`` (stops at the first one found)."""
        for path in scopes:
            node = self._root
            if node.keys:
                return True
            missing = False
            for seg in _segments(path):
                node = node.children.get(seg)  # type: ignore[assignment]
                if node is None:
                    missing = True
                    break
                if node.keys:
                    return True
            if not missing and node.children:  # pruned: any child leads to an entry
                return True
        return False

    def _collect(self, path: str, found: dict[K, None]) -> None:
        node = self._root
        found.update(node.keys)
        for seg in _segments(path):
            nxt = node.children.get(seg)
            if nxt is None:
                return  # nothing at or below the scope: only its ancestors overlap
            node = nxt
            found.update(node.keys)
        stack = list(node.children.values())
        while stack:
            node = stack.pop()
            found.update(node.keys)
            stack.extend(node.children.values())


def naive_overlapping(entries: Mapping[K, Iterable[str]], scopes: Iterable[str]) -> list[K]:
    """The double loop the index replaces (the reference for its tests and the benchmark)."""
    from gitlease.core.scope import sets_overlap

    query = list(scopes)
    return [key for key, paths in entries.items() if sets_overlap(paths, query)]


__all__ = ["PathIndex", "naive_overlapping"]
