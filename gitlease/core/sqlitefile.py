"""A cache file in SQLite shared by the processes of one repository (in the common git dir): opened on first
use; when it cannot be opened, read or written (damaged, not a database, locked too long, read-only), closed,
removed under a lock and not used again by this process. A cache only saves work: it never decides, so a
reader goes on without it. Used by the verdict cache (identity/trust.py) and the record cache
(service/recordcache.py)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gitlease.core.fsutil import locked

if TYPE_CHECKING:
    import sqlite3


class SqliteFile:
    """Subclasses create their tables in ``_setup`` and call ``_give_up`` on any ``sqlite3.Error``."""

    def __init__(self, path: str, *, timeout: float, shared_threads: bool = False) -> None:
        self.path = path
        self._timeout = timeout
        self._shared_threads = shared_threads  # one connection used by several threads (under the caller's lock)
        self._db: sqlite3.Connection | None = None
        self._broken = False

    def _setup(self, db: sqlite3.Connection) -> None:
        raise NotImplementedError

    @staticmethod
    def _drop_unless_format(db: sqlite3.Connection, fmt: int, table: str) -> None:
        """A file of another format (``PRAGMA user_version``): ``table`` dropped, the file marked ``fmt``."""
        (got,) = db.execute("PRAGMA user_version").fetchone()
        if got != fmt:
            db.execute("BEGIN IMMEDIATE")
            db.execute(f"DROP TABLE IF EXISTS {table}")
            db.execute(f"PRAGMA user_version = {fmt:d}")
            db.execute("COMMIT")

    def _open(self) -> sqlite3.Connection | None:
        if self._db is not None or self._broken:
            return self._db
        import sqlite3

        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            db = sqlite3.connect(
                self.path, timeout=self._timeout, isolation_level=None, check_same_thread=not self._shared_threads
            )
            self._setup(db)
            self._db = db
        except (sqlite3.Error, OSError):
            self._give_up()
        return self._db

    def _give_up(self) -> None:
        """A damaged file: closed, removed (under the lock) and not used again by this process."""
        self._broken = True
        if self._db is not None:
            try:
                self._db.close()
            except Exception:  # noqa: BLE001 - closing a broken database may fail in any way; nothing to save
                pass
            self._db = None
        try:
            with locked(self.path + ".lock", wait=1.0):
                os.unlink(self.path)
        except OSError:
            pass

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
