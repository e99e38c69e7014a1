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
by the store and the lease; a row records the trust identity and ``FORMAT`` it was finished under, and is
used only under the same. The file is as trusted as the rest of the git dir; one that cannot be read or
written is removed and the read goes on without it (core/sqlitefile.py). Bump ``FORMAT`` whenever what a
read concludes of the same refs changes: the checks, ``LeaseView.to_json``, or ``record.to_fields``.
"""

from __future__ import annotations

import marshal
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from gitlease.core import record as records
from gitlease.core.refnames import ID_PREFIX
from gitlease.core.sqlitefile import SqliteFile
from gitlease.service.views import KeptView, LeaseView, json_template, kept_view

if TYPE_CHECKING:
    import sqlite3

FORMAT = 1
_KEPT_STATUSES = ("verified", "unsigned", "untrusted")  # trust.VERIFIED, UNSIGNED, UNTRUSTED: a valid history

# (trust, head, grant, ref names, data) of one kept lease
Row = tuple[str, str, str, tuple[str, ...], bytes]


def _trust_key(identity: str) -> str:
    from gitlease import __version__

    return f"{FORMAT}:{__version__}:{identity}"


class ViewCache(SqliteFile):
    def __init__(self, folder: str, store_name: str) -> None:
        super().__init__(os.path.join(folder, "cache", "views.sqlite3"), timeout=2)
        self.store = store_name
        self.absent: list[str] = []  # kept leases the last ``match`` did not find listed: dropped by ``save``

    def _setup(self, db: sqlite3.Connection) -> None:
        (fmt,) = db.execute("PRAGMA user_version").fetchone()
        if fmt != FORMAT:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DROP TABLE IF EXISTS v")
            db.execute(f"PRAGMA user_version = {FORMAT:d}")
            db.execute("COMMIT")
        db.execute(
            "CREATE TABLE IF NOT EXISTS v (store TEXT NOT NULL, lease TEXT NOT NULL, trust TEXT NOT NULL, "
            "head TEXT NOT NULL, grnt TEXT NOT NULL, refs TEXT NOT NULL, data BLOB NOT NULL, "
            "PRIMARY KEY (store, lease)) WITHOUT ROWID"
        )

    def match(self, refs: dict[str, str]) -> dict[str, Row]:
        """{lease id: row} of each kept lease whose refs in this listing are exactly those it was finished
        with: its id ref at the kept head, each kept ref at its commit, and no other listed ref at either."""
        db = self._open()
        if db is None:
            return {}
        import sqlite3

        try:
            rows = db.execute("SELECT lease, trust, head, grnt, refs, data FROM v WHERE store = ?", (self.store,))
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
                db.executemany("INSERT OR REPLACE INTO v VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                db.executemany("DELETE FROM v WHERE store = ? AND lease = ?", [(self.store, k) for k in self.absent])
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
    key = _trust_key(identity)
    out: list[KeptView] = []
    for lease_id, (trust, head, grant, names, data) in rows.items():
        if trust != key:
            return None
        try:
            paths, fields, expires, version, signed, verification, signer, template = marshal.loads(data)
        except (ValueError, TypeError, EOFError):
            return None
        if type(paths) is not tuple or type(fields) is not tuple or type(expires) is not float:
            return None
        if type(version) is not int or verification not in _KEPT_STATUSES:
            return None
        out.append(
            kept_view(
                lease_id,
                head,
                grant,
                names,
                paths,
                fields,
                expires,
                version,
                bool(signed),
                verification,
                signer,
                template if type(template) is tuple and all(type(p) is str for p in template) else None,
            )
        )
    return out


def refs_left(refs: dict[str, str], rows: dict[str, Row]) -> dict[str, str]:
    """The listed refs that are no kept lease's: what the reader still reads and checks."""
    taken = {r for row in rows.values() for r in row[3]}
    return {r: o for r, o in refs.items() if r not in taken}


def _matching(
    refs: dict[str, str], rows: Iterable[tuple[str, str, str, str, str, bytes]], absent: list[str]
) -> dict[str, Row]:
    counts = Counter(refs.values())
    found: dict[str, Row] = {}
    get = refs.get
    absent.clear()
    for lease_id, trust, head, grant, text, data in rows:
        idref = ID_PREFIX + lease_id
        at = get(idref)
        if at is None:
            absent.append(lease_id)
            continue
        if at != head:
            continue
        names = tuple(text.split("\n"))
        if counts[grant] + (counts[head] if head != grant else 0) != len(names):
            continue  # another ref at either commit, or one of the kept refs gone
        for r in names:  # each kept ref where it was (the id ref is at head: checked above)
            if r != idref and get(r) != grant:
                break
        else:
            found[lease_id] = (trust, head, grant, names, data)
    return found


def _keepable(v: LeaseView) -> bool:
    return (
        type(v) is LeaseView
        and v.valid
        and v.current_oid is not None
        and v.grant_oid is not None
        and v.verification in _KEPT_STATUSES
    )


def _row(store: str, trust: str, v: LeaseView) -> tuple[str, str, str, str, str, str, bytes] | None:
    rec = v.record
    assert rec is not None and v.current_oid is not None and v.grant_oid is not None
    data = marshal.dumps(
        (
            v.paths,
            records.to_fields(rec),
            rec.expires,
            rec.version,
            v.signed,
            v.verification,
            v.signer,
            json_template(v),
        )
    )
    names: Sequence[str] = sorted(v.refs())
    if any("\n" in r for r in names):
        return None
    return (store, v.lease_id, trust, v.current_oid, v.grant_oid, "\n".join(names), data)


__all__ = ["ViewCache", "FORMAT", "views_of", "refs_left"]
