"""What this worktree holds: a small JSON file in the worktree's own git dir, so later commands and the
hooks know their leases without a network call. Writes are atomic (temp file + rename) under a lock.

Standard library only: the pre-commit hook reads this file.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from gitlease.core.errors import InvalidRecord
from gitlease.core.fsutil import locked, write_json

FILE = "held.json"
VERSION = 1


@dataclass
class Held:
    lease_id: str
    store: str  # remote name or URL, or "local"
    current: str  # oid of the version we wrote last
    grant: str  # oid of version 1 (what the scope refs point at)
    record: str  # the exact record bytes of the current version (UTF-8 JSON)
    paths: list[str]
    expires_at: str
    version: int
    pending: str | None = None  # a renewal whose outcome could not be confirmed: its oid ...
    pending_record: str | None = None  # ... and its record; the next renew reads the remote first
    task: str | None = None  # the queued task it claims (refs/leases/task/<task>, deleted with the lease)


class HeldState:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path = os.path.join(folder, FILE)

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Held]]:
        """Read-modify-write under an exclusive lock; the dict is written back on success."""
        with locked(os.path.join(self.folder, "held.lock")):
            held = self._read()
            yield held
            self._write(held)

    def load(self) -> dict[str, Held]:
        return self._read()

    def _read(self) -> dict[str, Held]:
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise InvalidRecord(f"cannot read local lease state {self.path}: {exc.strerror}") from None
        try:
            doc = json.loads(raw.decode("utf-8"))
            if doc.get("version") != VERSION or not isinstance(doc.get("leases"), dict):
                raise ValueError("unknown layout")
            return {k: Held(**v) for k, v in doc["leases"].items()}
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
            raise InvalidRecord(
                f"local lease state {self.path} is corrupt (move it aside; the leases "
                "on the remote are unaffected and expire on their own)"
            ) from None

    def _write(self, held: dict[str, Held]) -> None:
        doc = {"version": VERSION, "leases": {k: asdict(v) for k, v in sorted(held.items())}}
        write_json(self.path, doc, pretty=True)
