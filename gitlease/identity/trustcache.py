"""The last trust file read from a store, kept in the common git dir (``TrustCache``): what a stale read
verifies with, what the next read of the same default-branch commit takes instead of asking git, and what
the lean pre-push path (enforce/quickpush.py) reads to know a store is unsigned at a commit
(``unsigned_at``). JSON and ``os`` only: the trust module itself (signatures, the file's grammar) is imported
only when a kept file is turned back into a Trust."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from gitlease.core.fsutil import cache_path, write_json

if TYPE_CHECKING:
    from gitlease.identity.trust import Trust


def _cache_name(folder: str, prefix: str, store_name: str) -> str:
    return cache_path(folder, prefix, store_name)


def _write_json(path: str, doc: object) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, doc)
    except OSError:
        pass  # a cache that cannot be written only costs what it would have remembered


TRUST_CACHE_FORMAT = 2  # 2: the text is the trust file and the signer files (``combine``)


class TrustCache:
    """The last trust file read from a store, so a stale ``status`` (store unreachable) still verifies; and,
    with the commit and path it was read at, what that commit holds, so the next read of the same default
    branch commit asks git nothing more (``at``). Safe like the verified cache: a commit id names its tree, so
    the file at a path of it never changes. The file is rewritten only when what it says changes."""

    def __init__(self, folder: str, store_name: str) -> None:
        self.path = _cache_name(folder, "trust", store_name)
        self._doc: dict[str, object] | None = None  # as read from the file (None: not read yet)

    def _read(self) -> dict[str, object]:
        if self._doc is None:
            try:
                with open(self.path, encoding="utf-8") as fh:
                    doc = json.load(fh)
            except (OSError, ValueError):
                doc = None
            self._doc = doc if isinstance(doc, dict) else {}
        return self._doc

    def at(self, commit: str, path: str, where: str) -> tuple[bytes | None] | None:
        """(the trust file's bytes, None when the commit has none) as last read at ``commit``, ``path`` and
        ``where`` (branch and store), or None when the last read was not of exactly that."""
        doc = self._read()
        text = doc.get("text")
        if doc.get("commit") != commit or doc.get("path") != path or doc.get("where") != where:
            return None
        if doc.get("format") != TRUST_CACHE_FORMAT:  # read before the signer files were: read again
            return None
        if text is None:
            return (None,)
        return (text.encode("utf-8"),) if isinstance(text, str) else None

    def save(self, trust: Trust, data: bytes | None, at: tuple[str, str, str] | None = None) -> None:
        """Remember ``trust`` (read as ``data``), and ``at``: the (commit, path, where) it was read at."""
        doc: dict[str, object] = {
            "source": trust.source,
            "text": data.decode("utf-8") if data is not None else None,
            "format": TRUST_CACHE_FORMAT,
        }
        if at is not None:
            doc.update(commit=at[0], path=at[1], where=at[2])
        if doc != self._read():
            _write_json(self.path, doc)
            self._doc = doc

    def load(self, *, label: bool = True) -> Trust | None:
        """The trust last read (None: never); ``label``: its source says it is used because the store is
        unreachable."""
        try:
            doc = self._read()
            source, text = str(doc["source"]), doc["text"]
        except (KeyError, TypeError):
            return None
        label_text = f"{source}, as last read (store unreachable)" if label else f"{source}, as last read"
        from gitlease.core.errors import InvalidRecord
        from gitlease.identity.trust import Trust, parse_files, split_combined

        if text is None:
            return Trust(None, label_text)
        try:
            signers, origins = parse_files(split_combined(str(text).encode("utf-8")), "")
        except InvalidRecord:
            return None
        return Trust(signers, label_text, origins)


def unsigned_at(folder: str, store_name: str, commit: str, path: str) -> bool:
    """Whether the trust last read from ``store_name`` was read at ``commit`` and ``path`` and found no trust
    file there: the store is unsigned at that commit of its default branch, as a read would find it."""
    doc = TrustCache(folder, store_name)._read()
    return (
        doc.get("format") == TRUST_CACHE_FORMAT
        and doc.get("commit") == commit
        and doc.get("path") == path
        and "text" in doc
        and doc["text"] is None
    )
