"""The record cache's index (service/recordcache.py): each kept commit's lease id and paths, read without the
record, for a read restricted to some paths (core/bearing.py). Its own module, ``os`` at import and
``sqlite3`` when read: the lean pre-push path (enforce/quickpush.py) checks its digest against ``FORMAT`` on
every push, and builds the digest from ``read`` (read-only) after a full check."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (7 ms in a hook); mypy reads it alike
if TYPE_CHECKING:
    import sqlite3

    from gitlease.core.bearing import Index

FORMAT = 3  # bump when record.parse or Store.read change what they answer for the same bytes


def path_in(folder: str) -> str:
    """The record cache's file in gitlease's shared folder."""
    return os.path.join(folder, "cache", "records.sqlite3")


def rows(db: sqlite3.Connection) -> Index:
    """{oid: (lease id, its record's paths joined by newlines), or None when it holds none} for every kept
    commit: one pass over the covering index, no record decoded, no path split."""
    return {
        oid: (lease, paths) if isinstance(lease, str) and isinstance(paths, str) and paths else None
        for oid, lease, paths in db.execute("SELECT oid, lease, paths FROM r")
    }


def read(folder: str) -> Index | None:
    """The index as the file holds it, opened read-only (nothing created, nothing dropped); None when there
    is no file, it is of another format, locked or unreadable: the caller then reads the store as usual."""
    import sqlite3

    path = path_in(folder)
    if not os.path.exists(path):
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
        try:
            (got,) = db.execute("PRAGMA user_version").fetchone()
            return rows(db) if got == FORMAT else None
        finally:
            db.close()
    except sqlite3.Error:
        return None
