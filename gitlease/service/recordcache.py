"""What each lease commit holds, read and parsed once per repository, not once per process.

A read of the store lists every lease ref, then needs each commit's ``lease.json`` and ``lease.sig`` (two
``cat-file`` runs over every object) and each record parsed and checked (``record.parse``). At 10,000 leases
that was most of a ``status`` and of every hook's read, and every process paid it again for the same commits.

``RecordCache`` keeps, per commit id, the bytes ``Store.read`` returned (record, signature, problem) and the
outcome of parsing them (the record as ``record.to_fields`` writes it, or the parse error), in a SQLite file in
the common git dir shared by every worktree. Safe to share: what a commit id names never changes, and
parsing is a function of those bytes; the file's format number (``FORMAT``) changes whenever the parse rules
do, and a file of another format is emptied. It decides nothing: trust and replay checks run on every read as
before (``LeaseService._verify``), on the same bytes.

Bounded: when it holds more than ``SLACK`` times the commits of the current listing (plus ``FLOOR``), the
commits no longer listed are dropped. A file that cannot be read or written (damaged, read-only, locked too
long) is removed and the read goes on without it (core/sqlitefile.py). The file is as trusted as the rest of
the git dir (hooks and config live there too).
"""

from __future__ import annotations

import marshal
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gitlease.core import record as records
from gitlease.core.sqlitefile import SqliteFile
from gitlease.core.store import Blob
from gitlease.service.recordindex import FORMAT, path_in, rows
from gitlease.service.views import Parsed

if TYPE_CHECKING:
    import sqlite3

SLACK = 3
FLOOR = 4096


class RecordCache(SqliteFile):
    def __init__(self, folder: str) -> None:
        super().__init__(path_in(folder), timeout=2)

    def _setup(self, db: sqlite3.Connection) -> None:
        self._drop_unless_format(db, FORMAT, "r")
        db.execute(
            "CREATE TABLE IF NOT EXISTS r (oid TEXT PRIMARY KEY, lease TEXT, paths TEXT, data BLOB NOT NULL) "
            "WITHOUT ROWID"
        )
        db.execute("CREATE INDEX IF NOT EXISTS r_index ON r (oid, lease, paths)")  # index() reads no record

    def load(self, oids: Iterable[str]) -> dict[str, tuple[Blob, Parsed]]:
        """What is kept of these commits: {oid: (blob, (record, problem))}. Rows that do not decode are left out
        (read again from git)."""
        wanted = set(oids)
        db = self._open()
        if db is None or not wanted:
            return {}
        import sqlite3

        out: dict[str, tuple[Blob, Parsed]] = {}
        try:
            rows: Iterable[tuple[str, bytes]]
            if len(wanted) > 500:  # most of the file: one scan beats thousands of lookups
                rows = db.execute("SELECT oid, data FROM r")
            else:
                ordered = sorted(wanted)
                rows = [
                    row
                    for i in range(0, len(ordered), 500)
                    for row in db.execute(
                        f"SELECT oid, data FROM r WHERE oid IN ({','.join('?' * len(ordered[i : i + 500]))})",
                        ordered[i : i + 500],
                    )
                ]
            for oid, data in rows:
                if oid in wanted:
                    got = _decode(data)
                    if got is not None:
                        out[oid] = got
        except sqlite3.Error:
            self._give_up()
            return {}
        return out

    def index(self) -> dict[str, tuple[str, str] | None]:
        """{oid: (lease id, its record's paths joined by newlines), or None when it holds none} for every kept
        commit: what a read restricted to some paths needs of every listed commit to choose the few it reads
        whole (bearing.restrict_refs). One pass over the covering index, no record decoded, no path split."""
        db = self._open()
        if db is None:
            return {}
        import sqlite3

        try:
            return rows(db)
        except sqlite3.Error:
            self._give_up()
            return {}

    def save(self, got: dict[str, tuple[Blob, Parsed]], listed: Iterable[str]) -> None:
        """Keep these (newly read) commits; drop what is no longer ``listed`` once the file is too large. Only
        commits whose record was read are kept: "no record" may only mean "not fetched yet" (an object missing
        here, a ref deleted between listing and fetching), and must be asked of git again next time."""
        got = {oid: v for oid, v in got.items() if v[0].record is not None}
        db = self._open()
        if db is None or not got:
            return
        import sqlite3

        try:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT OR REPLACE INTO r (oid, lease, paths, data) VALUES (?, ?, ?, ?)",
                [
                    (oid, rec.lease_id if rec else None, "\n".join(rec.paths) if rec else None, _encode(blob, (rec, p)))
                    for oid, (blob, (rec, p)) in got.items()
                ],
            )
            live = set(listed)
            (count,) = db.execute("SELECT count(*) FROM r").fetchone()
            if count > SLACK * len(live) + FLOOR:
                db.execute("CREATE TEMP TABLE IF NOT EXISTS keep (oid TEXT PRIMARY KEY)")
                db.execute("DELETE FROM keep")
                db.executemany("INSERT OR IGNORE INTO keep VALUES (?)", [(o,) for o in live])
                db.execute("DELETE FROM r WHERE oid NOT IN (SELECT oid FROM keep)")
            db.execute("COMMIT")
        except sqlite3.Error:
            self._give_up()


def _encode(blob: Blob, parsed: Parsed) -> bytes:
    rec, problem = parsed
    return marshal.dumps(
        (blob.record, blob.signature, blob.problem, records.to_fields(rec) if rec is not None else None, problem)
    )


def _decode(data: Any) -> tuple[Blob, Parsed] | None:
    try:
        raw, sig, blob_problem, fields, problem = marshal.loads(data)
    except (ValueError, TypeError, EOFError):
        return None
    if raw is not None and type(raw) is not bytes or sig is not None and type(sig) is not bytes:
        return None
    if blob_problem is not None and type(blob_problem) is not str or problem is not None and type(problem) is not str:
        return None
    try:
        rec = records.from_fields(fields) if fields is not None else None
    except (ValueError, TypeError):
        return None
    if (rec is None) == (problem is None):
        return None
    return Blob(raw, sig, blob_problem), (rec, problem)


__all__ = ["RecordCache", "FORMAT"]
