"""Each lease's finished view, kept per repository, so a read pays for what changed, not for every lease.

A full read of the store (``Reader.snapshot``) lists every lease ref, then for each lease reads its records,
groups its refs, checks its whole history under the trust file (trust.check_chain) and writes its JSON. What
that concludes of a lease is a function of its refs (the id ref's commit, the commit its scope and task refs
point at, and which refs those are), of what those commits hold (a commit id names its content for ever) and
of the trust file (``Trust.identity``; None when verdicts depend on the time, and then nothing is kept). So a
valid lease's finished view is kept here under those, with the JSON template of its ``status`` entry
(views.json_template), and a later read whose listing names the same commits for exactly the same refs takes
the view as it is (views.KeptView). What a listing can change around a lease is checked on every read:

- the lease's own refs, exactly: its id ref at the kept head, each kept ref at its commit, and no other ref
  at either commit (``match``); anything else and the lease is read and checked again;
- another commit whose record names the lease (a second grant, a forged scope ref): the reader reads every
  ref it did not take from here, and when one of them names a kept lease, reads the whole store again
  without this cache (reader.py);
- the replay memory (identity/replay.py), which depends on what this machine saw before: checked on every
  read for every lease, kept or not.

Only valid views are kept: an invalid one is read again each time (it is a fault, and rare). Rows are keyed
by the store and the lease; a row records the trust identity, ``FORMAT`` and gitlease version it was
finished under, and is used only under the same. One row a lease: a lease gone from the listing loses its
row, and the rows of another store are dropped once they outnumber the current store's (``SLACK``). The file
is as trusted as the rest of the git dir; one that cannot be read or written is removed and the read goes on
without it (core/sqlitefile.py). Bump ``FORMAT`` whenever what a read concludes of the same refs changes: the
checks, ``LeaseView.to_json``, or ``record.to_fields``.
"""

from __future__ import annotations

import marshal
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gitlease.core import record as records
from gitlease.core.refnames import ID_PREFIX
from gitlease.core.sqlitefile import SqliteFile
from gitlease.service.views import JSON_SLOTS, KeptView, LeaseView, json_template, kept_view

if TYPE_CHECKING:
    import sqlite3

FORMAT = 5  # 2: the record's fields marshalled apart; 3: refs as _refs_key; 4: rowid; 5: one blob a row
SLACK, FLOOR = 3, 4096  # rows kept beyond the listed leases, before other stores' rows are dropped
_KEPT_STATUSES = ("verified", "unsigned", "untrusted")  # trust.VERIFIED, UNSIGNED, UNTRUSTED: a valid history

# One kept lease: (trust key, head, grant, its refs (``_refs_key``), paths, its record's fields (marshalled),
# expires, version, signed, verification, signer, JSON template), marshalled whole in its row
Row = tuple[Any, ...]
_ROW_LEN = 12


def _trust_key(identity: str) -> str:
    from gitlease import __version__

    return f"{FORMAT}:{__version__}:{identity}"


class ViewCache(SqliteFile):
    def __init__(self, folder: str, store_name: str) -> None:
        super().__init__(os.path.join(folder, "cache", "views.sqlite3"), timeout=2)
        self.store = store_name
        self.absent: list[str] = []  # kept leases the last ``match`` did not find listed: dropped by ``save``

    def _setup(self, db: sqlite3.Connection) -> None:
        self._drop_unless_format(db, FORMAT, "v")
        db.execute(  # a rowid table: its rows are large (a JSON template each), a WITHOUT ROWID one 3x the size
            "CREATE TABLE IF NOT EXISTS v (store TEXT NOT NULL, lease TEXT NOT NULL, data BLOB NOT NULL)"
        )
        db.execute("CREATE UNIQUE INDEX IF NOT EXISTS v_lease ON v (store, lease)")

    def match(self, refs: dict[str, str]) -> dict[str, Row]:
        """{lease id: row} of each kept lease whose refs in this listing are exactly those it was finished
        with: its id ref at the kept head, each kept ref at its commit, and no other listed ref at either."""
        db = self._open()
        if db is None:
            return {}
        import sqlite3

        try:
            rows = db.execute("SELECT lease, data FROM v WHERE store = ? ORDER BY lease", (self.store,))
            found = _matching(refs, rows, self.absent)
        except sqlite3.Error:
            self._give_up()
            return {}
        return found

    def save(self, identity: str | None, views: Iterable[LeaseView]) -> None:
        """Keep each valid view read and checked in full by this read (not one taken from here), under the
        trust it was checked with; drop the rows of leases the listing no longer holds; close the file."""
        made = [] if identity is None else [_row(self.store, _trust_key(identity), v) for v in views if _keepable(v)]
        rows = [r for r in made if r is not None]
        db = self._open() if rows or self.absent else None
        if db is not None:
            import sqlite3

            try:
                db.execute("BEGIN IMMEDIATE")
                db.executemany("INSERT OR REPLACE INTO v VALUES (?, ?, ?)", rows)
                db.executemany("DELETE FROM v WHERE store = ? AND lease = ?", [(self.store, k) for k in self.absent])
                if rows:  # bounded: the rows of stores no longer read (another lease.remote) go once too many
                    ((total,), (mine,)) = db.execute(
                        "SELECT count(*) FROM v UNION ALL SELECT count(*) FROM v WHERE store = ?", (self.store,)
                    ).fetchall()
                    if total > SLACK * mine + FLOOR:
                        db.execute("DELETE FROM v WHERE store != ?", (self.store,))
                db.execute("COMMIT")
            except sqlite3.Error:
                self._give_up()
        self.absent = []
        self.close()


def views_of(rows: dict[str, Row], identity: str | None) -> list[KeptView] | None:
    """The kept views of ``rows``, or None when one was not finished under this trust (``identity``) or does not
    decode: then nothing is taken from the cache."""
    if identity is None:
        return None
    wanted = _trust_key(identity)
    out: list[KeptView] = []
    for lease_id, row in rows.items():
        trust, _h, _g, _k, paths, fields, expires, version, _s, verification, _w, template = row
        if trust != wanted:
            return None
        if type(paths) is not tuple or type(fields) is not bytes or type(expires) is not float:
            return None
        if type(version) is not int or verification not in _KEPT_STATUSES:
            return None
        if template is not None and (type(template) is not tuple or len(template) != len(JSON_SLOTS) + 1):
            row = (*row[:-1], None)
        out.append(kept_view(lease_id, row))
    return out


def refs_left(refs: dict[str, str], rows: dict[str, Row]) -> dict[str, str]:
    """The listed refs that are no kept lease's: what the reader still reads and checks. Every listed ref at a
    matched lease's commits is that lease's (``match``: no other ref is at either)."""
    taken = {oid for row in rows.values() for oid in (row[1], row[2])}
    return {r: o for r, o in refs.items() if o not in taken}


def _refs_key(at_head: Sequence[str], at_grant: Sequence[str]) -> str:
    """Which refs a lease has, as kept and as matched: the refs at its current commit, then (a renewed lease)
    those at its grant, each group in ref name order (the listing's), one a line."""
    return "\n".join([*at_head, *at_grant])


def _matching(refs: dict[str, str], rows: Iterable[tuple[str, bytes]], absent: list[str]) -> dict[str, Row]:
    by_oid: dict[str, list[str]] = {}
    for ref, oid in refs.items():  # the listing's refs at each commit, in the listing's order
        got = by_oid.get(oid)
        if got is None:
            by_oid[oid] = [ref]
        else:
            got.append(ref)
    found: dict[str, Row] = {}
    get, empty = by_oid.get, ()
    absent.clear()
    for lease_id, data in rows:
        if ID_PREFIX + lease_id not in refs:
            absent.append(lease_id)
            continue
        try:
            row = marshal.loads(data)
        except (ValueError, TypeError, EOFError):
            continue  # read again, and written again
        if type(row) is not tuple or len(row) != _ROW_LEN or type(row[1]) is not str or type(row[2]) is not str:
            continue
        head, grant = row[1], row[2]
        if row[3] == _refs_key(get(head, empty), empty if head == grant else get(grant, empty)):
            found[lease_id] = row
    return found


def _keepable(v: LeaseView) -> bool:
    return (
        type(v) is LeaseView
        and v.valid
        and v.current_oid is not None
        and v.grant_oid is not None
        and v.verification in _KEPT_STATUSES
    )


def _row(store: str, trust: str, v: LeaseView) -> tuple[str, str, bytes] | None:
    rec = v.record
    assert rec is not None and v.current_oid is not None and v.grant_oid is not None
    refs = v.refs()
    if any("\n" in r for r in refs):
        return None
    key = _refs_key(
        sorted(r for r, o in refs.items() if o == v.current_oid),
        [] if v.current_oid == v.grant_oid else sorted(r for r, o in refs.items() if o == v.grant_oid),
    )
    row = (
        trust,
        v.current_oid,
        v.grant_oid,
        key,
        v.paths,
        marshal.dumps(records.to_fields(rec)),  # decoded only when the record is looked at (views.KeptView)
        rec.expires,
        rec.version,
        v.signed,
        v.verification,
        v.signer,
        json_template(v),
    )
    return (store, v.lease_id, marshal.dumps(row))


__all__ = ["ViewCache", "FORMAT", "views_of", "refs_left"]
