"""The replay memory: the newest version of each lease this machine has seen on a store, and which leases it has
seen disappear (``Seen``). A reader that finds an id ref moved back to an older version, the same version at
another commit, or a lease id back after it was gone refuses that lease (trust.py's checks of a version
cannot see this: every old version verifies).

One file per store in the common git dir (``cache/seen-<hash>.marshal``), shared by every worktree and
process of the clone; read once per process and again only when another process rewrote it, written (one
rename, under a lock) only when a read saw something new. The file is a ``marshal``-ed dict, loaded in one C
call whatever its size; each entry is checked where it is used, so a damaged file or entry forgets (as if never
seen), never crashes and never refuses. A memory written by an older gitlease (``seen-<hash>.json``) is read
until the first read after the upgrade rewrites it in this format.
"""

from __future__ import annotations

import json
import marshal
import os
from collections.abc import Iterable, Mapping

from gitlease.core.fsutil import atomic_write, cache_path, lock_file

Entry = Mapping[str, object]  # {"v": version, "oid": commit, "exp": expiry, "gone": bool (optional)}

_LOADED: dict[str, tuple[tuple[int, int, int], dict[str, object]]] = {}  # Seen.load, per process


def entry(memory: Mapping[str, object], lease_id: str) -> Entry | None:
    """The well-formed entry of ``lease_id`` in a loaded memory, or None (never seen, or damaged: forgotten)."""
    v = memory.get(lease_id)
    if (
        isinstance(v, dict)
        and type(v.get("v")) is int
        and isinstance(v.get("oid"), str)
        and isinstance(v.get("exp"), (int, float))
        and isinstance(v.get("gone", False), bool)
    ):
        return v
    return None


class Seen:
    """Newest version of each lease this machine has seen on a store, and which leases it has seen disappear.

    Load it *before* listing the store: whatever was recorded then was listed by a read that finished before
    ours began, so our read must see that version or a newer one. Less is a replay (a ref moved back), and a
    lease id that comes back after it was gone is one too (lease ids are never reused)."""

    KEEP = 7 * 86400  # forget leases this long after their last known expiry

    def __init__(self, folder: str, store_name: str) -> None:
        self.path = cache_path(folder, "seen", store_name)[: -len(".json")] + ".marshal"
        self._legacy = cache_path(folder, "seen", store_name)

    def load(self) -> Mapping[str, object]:
        """The memory as a mapping of lease id to entry; read entries with ``entry`` (a damaged one forgets).
        Read once per process: again only when the file changed since (another process wrote it). The mapping
        returned is shared: read it, never change it."""
        try:
            st = os.stat(self.path)
        except OSError:
            return self._read_legacy()
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        got = _LOADED.get(self.path)
        if got is not None and got[0] == sig:
            return got[1]
        try:
            with open(self.path, "rb") as fh:
                doc = marshal.loads(fh.read())
        except (OSError, ValueError, EOFError, TypeError):
            doc = {}
        out = doc if isinstance(doc, dict) else {}
        _LOADED[self.path] = (sig, out)
        return out

    def _read_legacy(self) -> dict[str, object]:
        try:
            with open(self._legacy, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    @staticmethod
    def replay_problem(before: Mapping[str, object], lease_id: str, version: int, oid: str) -> str | None:
        prev = entry(before, lease_id)
        if not prev:
            return None
        if prev.get("gone"):
            return (
                f"replay: lease {lease_id} reappeared after it was seen gone (released or cleared); "
                "lease ids are never reused"
            )
        pv = prev["v"]
        if version < pv:  # type: ignore[operator]
            return f"replay: the id ref moved back to v{version} after v{pv} was seen"
        if version == pv and prev.get("oid") and prev.get("oid") != oid:
            return f"replay: v{version} is now {oid[:12]}, but {str(prev.get('oid'))[:12]} was seen as v{version}"
        return None

    def update(
        self, before: Mapping[str, object], listed: Iterable[tuple[str, int, str, float]], present: set[str], now: float
    ) -> None:
        """Merge what one complete listing saw: (lease id, version, oid, expires) of each valid lease, and the
        set of every lease id present. A lease remembered *before* the listing began and absent from it is
        marked gone (one first seen by a later read is not: our listing may predate it). Entries past their
        expiry by ``KEEP`` are dropped when the file is written."""
        listed = list(listed)
        try:
            lock = lock_file(self.path + ".lock")
        except OSError:
            return  # a memory that cannot be written only forgets
        with lock:
            seen = self.load()
            changes: dict[str, dict[str, object]] = {}
            for lease_id, version, oid, expires in listed:
                cur = entry(seen, lease_id)
                if cur and cur.get("gone"):
                    continue
                if cur is None or cur["v"] < version:  # type: ignore[operator]
                    changes[lease_id] = {"v": version, "oid": oid, "exp": expires}
            for lease_id in before.keys() - present:
                cur = entry(seen, lease_id)
                if cur is not None and entry(before, lease_id) is not None and not cur.get("gone"):
                    changes[lease_id] = dict(changes.get(lease_id, cur), gone=True)
            if not changes and os.path.exists(self.path):
                return  # nothing new: the file stays as it is (and no other process re-reads it)
            cutoff = now - self.KEEP
            out: dict[str, object] = {}
            for k in seen:
                e = entry(seen, k) if isinstance(k, str) else None
                if e is not None and e["exp"] >= cutoff:  # type: ignore[operator]
                    out[k] = e
            for k, v in changes.items():
                if v["exp"] >= cutoff:  # type: ignore[operator]
                    out[k] = v
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                atomic_write(self.path, marshal.dumps(out))
                st = os.stat(self.path)
            except OSError:
                return  # a memory that cannot be written only forgets
            _LOADED[self.path] = ((st.st_ino, st.st_mtime_ns, st.st_size), out)
            for old in (self._legacy, self._legacy + ".lock"):  # read until now: what it held is in the new file
                try:
                    os.unlink(old)
                except OSError:
                    pass


__all__ = ["Seen", "entry"]
