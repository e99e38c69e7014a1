"""The replay memory: the newest version of each lease this machine has seen on a store, and which leases it has
seen disappear (``Seen``). A reader that finds an id ref moved back to an older version, the same version at
another commit, or a lease id back after it was gone refuses that lease (trust.py's checks of a version
cannot see this: every old version verifies).

One file per store in the common git dir (``cache/seen-<hash>.marshal``), shared by every worktree and
process of the clone; read once per process and again only when another process rewrote it, written (one
rename, under a lock) only when a read saw something new. The file is ``marshal``-ed: the leases still
present apart from those seen gone, so a read compares the listing with the first only, and loads both in one
C call whatever their size. Each entry is checked where it is used, so a damaged file or entry forgets (as if
never seen), never crashes and never refuses. A memory written by an older gitlease (``seen-<hash>.json``) is
read until the first read after the upgrade rewrites it in this format.
"""

from __future__ import annotations

import json
import marshal
import os
from collections.abc import Iterable

from gitlease.core.cachenames import seen_paths
from gitlease.core.fsutil import atomic_write, lock_file

_TAG = "gitlease-seen-1"
_LOADED: dict[str, tuple[tuple[int, int, int], Memory]] = {}  # Seen.load, per process


class Memory:
    """What a ``Seen`` file holds: ``live`` {lease id: (version, oid, expires)} of leases last seen present,
    ``gone`` {lease id: expires} of leases seen disappear. Shared once loaded: read it, never change it."""

    __slots__ = ("live", "gone")

    def __init__(self, live: dict[str, object] | None = None, gone: dict[str, object] | None = None) -> None:
        self.live: dict[str, object] = live if live is not None else {}
        self.gone: dict[str, object] = gone if gone is not None else {}

    def get(self, lease_id: str) -> dict[str, object] | None:
        """{"v", "oid", "exp"[, "gone": True]} of a lease, or None: never seen, or its entry damaged (forgotten)."""
        exp = self.gone.get(lease_id)
        if isinstance(exp, (int, float)) and not isinstance(exp, bool):
            return {"v": 0, "oid": "", "exp": exp, "gone": True}
        v = self.live.get(lease_id)
        if (
            type(v) is tuple
            and len(v) == 3
            and type(v[0]) is int
            and isinstance(v[1], str)
            and isinstance(v[2], (int, float))
            and not isinstance(v[2], bool)
        ):
            return {"v": v[0], "oid": v[1], "exp": v[2]}
        return None

    def __len__(self) -> int:
        return len(self.live) + len(self.gone)

    def dump(self) -> bytes:
        return marshal.dumps((_TAG, self.live, self.gone))

    @classmethod
    def parse(cls, data: bytes) -> Memory:
        try:
            doc = marshal.loads(data)
        except (ValueError, EOFError, TypeError):
            return cls()
        if type(doc) is tuple and len(doc) == 3 and doc[0] == _TAG and type(doc[1]) is dict and type(doc[2]) is dict:
            return cls(doc[1], doc[2])
        return cls()

    @classmethod
    def from_legacy(cls, doc: object) -> Memory:
        """The earlier JSON form: {lease id: {"v", "oid", "exp"[, "gone"]}}."""
        out = cls()
        if not isinstance(doc, dict):
            return out
        for k, v in doc.items():
            if not isinstance(v, dict):
                continue
            ver, oid, exp, gone = v.get("v"), v.get("oid"), v.get("exp"), v.get("gone", False)
            if type(ver) is not int or not isinstance(oid, str) or type(exp) not in (int, float):
                continue
            if gone is True:
                out.gone[str(k)] = exp
            elif gone is False:
                out.live[str(k)] = (ver, oid, exp)
        return out


class Seen:
    """Newest version of each lease this machine has seen on a store, and which leases it has seen disappear.

    Load it *before* listing the store: whatever was recorded then was listed by a read that finished before
    ours began, so our read must see that version or a newer one. Less is a replay (a ref moved back), and a
    lease id that comes back after it was gone is one too (lease ids are never reused)."""

    KEEP = 7 * 86400  # forget leases this long after their last known expiry

    def __init__(self, folder: str, store_name: str) -> None:
        self.path, self._legacy = seen_paths(folder, store_name)

    def load(self) -> Memory:
        """The memory. Read once per process: again only when the file changed since (another process wrote
        it). The memory returned is shared: read it, never change it."""
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
                out = Memory.parse(fh.read())
        except OSError:
            out = Memory()
        _LOADED[self.path] = (sig, out)
        return out

    def load_opened(self, opened: tuple[int, bool] | None) -> Memory:
        """The memory as it was when its file was opened (``opened``: the descriptor, and whether it is the
        legacy JSON file; None: neither file existed then), however it was replaced since: how a caller that
        listed the store before it could afford this module keeps "loaded before listing" (the pre-push
        hook's lean path, enforce/quickpush.py). The descriptor is closed."""
        if opened is None:
            return Memory()
        fd, legacy = opened
        try:
            with os.fdopen(fd, "rb") as fh:
                data = fh.read()
            return Memory.from_legacy(json.loads(data)) if legacy else Memory.parse(data)
        except (OSError, ValueError):
            return Memory()

    def _read_legacy(self) -> Memory:
        try:
            with open(self._legacy, encoding="utf-8") as fh:
                return Memory.from_legacy(json.load(fh))
        except (OSError, ValueError):
            return Memory()

    @staticmethod
    def replay_problem(before: Memory, lease_id: str, version: int, oid: str) -> str | None:
        last = before.live.get(lease_id)
        if type(last) is tuple and last[:2] == (version, oid) and lease_id not in before.gone:
            return None  # the version last seen, at the same commit (the common case: one lookup)
        prev = before.get(lease_id)
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
        self, before: Memory, listed: Iterable[tuple[str, int, str, float]], present: set[str], now: float
    ) -> None:
        """Merge what one complete listing saw: (lease id, version, oid, expires) of each valid lease, and the
        set of every lease id present. A lease remembered present *before* the listing began and absent from
        it is marked gone (one first seen by a later read is not: our listing may predate it). Entries past
        their expiry by ``KEEP`` are dropped when the file is written."""
        listed = list(listed)
        try:
            lock = lock_file(self.path + ".lock")
        except OSError:
            return  # a memory that cannot be written only forgets
        with lock:
            seen = self.load()
            live: dict[str, tuple[int, str, float]] = {}
            gone: dict[str, float] = {}
            for lease_id, version, oid, expires in listed:
                cur = seen.get(lease_id)
                if cur and cur.get("gone"):
                    continue
                if cur is None or cur["v"] < version:  # type: ignore[operator]
                    live[lease_id] = (version, oid, expires)
            for lease_id in before.live.keys() - present:
                cur = seen.get(lease_id)
                if cur is not None and before.get(lease_id) is not None and not cur.get("gone"):
                    gone[lease_id] = cur["exp"]  # type: ignore[assignment]
            if not live and not gone and os.path.exists(self.path):
                return  # nothing new: the file stays as it is (and no other process re-reads it)
            cutoff = now - self.KEEP
            out = Memory()
            for k in seen.live:
                e = seen.get(k) if isinstance(k, str) and k not in gone else None
                if e is not None and not e.get("gone") and e["exp"] >= cutoff:  # type: ignore[operator]
                    out.live[k] = (e["v"], e["oid"], e["exp"])
            for k, exp in seen.gone.items():
                if isinstance(k, str) and type(exp) in (int, float) and exp >= cutoff:  # type: ignore[operator]
                    out.gone[k] = exp
            for k, (version, oid, expires) in live.items():
                if expires >= cutoff:
                    out.live[k] = (version, oid, expires)
            for k, exp in gone.items():
                out.live.pop(k, None)
                if exp >= cutoff:
                    out.gone[k] = exp
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                atomic_write(self.path, out.dump())
                st = os.stat(self.path)
            except OSError:
                return  # a memory that cannot be written only forgets
            _LOADED[self.path] = ((st.st_ino, st.st_mtime_ns, st.st_size), out)
            for old in (self._legacy, self._legacy + ".lock"):  # read until now: what it held is in the new file
                try:
                    os.unlink(old)
                except OSError:
                    pass


__all__ = ["Seen", "Memory"]
