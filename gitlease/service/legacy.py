"""Leases that an earlier version wrote under ``%XX`` ref names (docs/protocol.md, "Path encoding").

A scope ref is now named with ``+XX`` escapes. git's directory/file rule refuses two overlapping scopes only
when their shared path segments are named alike, so a path whose shared segments need an escape (``.github``,
``a b``) is not protected by it against a lease an earlier version wrote, still live across the upgrade. An
acquire of such a path looks once more after its grant: a live lease of the other naming that overlaps it makes
the acquire undo its grant and refuse (HeldError, exit 3), as the directory/file rule would have. Paths whose
segments need no escape (the usual ones) are named alike in both versions and cost nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gitlease.core.record import Record
from gitlease.core.refnames import ESCAPE, LEGACY_ESCAPE, encode_segment
from gitlease.service.views import held_error

if TYPE_CHECKING:
    from gitlease.service.leases import LeaseService


def needs_escape(path: str) -> bool:
    """True when a segment of the normalised ``path`` is named differently by earlier versions."""
    return any(ESCAPE in encode_segment(seg) for seg in path.split("/"))


def refuse_legacy_overlap(svc: LeaseService, paths: Sequence[str], rec: Record, oid: str) -> None:
    """After a grant of ``paths`` (lease ``rec`` at ``oid``): when a live lease named the earlier way overlaps
    them, delete our grant again and raise HeldError naming it. Nothing to do (no read) for paths that need no
    escape."""
    if not any(needs_escape(p) for p in paths):
        return
    mine = {rec.lease_id}
    snap = svc.snapshot(use_cache=False, paths=paths, keep=mine)
    now, skew = svc.clock.now(), svc.settings.skew
    live = [
        v
        for v in snap.blocking(paths, now, skew)
        if v.lease_id not in mine and any(LEGACY_ESCAPE in ref for ref in v.scope_refs)
    ]
    if live:
        svc._undo_partial({rec.lease_id: (rec, oid)}, snap)
        raise held_error(paths, live, now, skew)
