"""Progress notes (``git lease renew --progress "tests 40/120"``): a short note and a counter in the record.

The counter is the number the note reports (the first integer: ``tests 40/120`` -> 40), so a worker stuck at
40/120 does not look busy by reporting it again. A note without a number counts its changes. ``at`` moves only
when the note or the counter changes: it is when progress was last made, which is what the sweeper's
stalled-progress rule (``lease.progressTimeout``) measures. Pure: no git, no I/O.
"""

from __future__ import annotations

import re

from gitlease.core.clock import iso
from gitlease.core.record import Progress

MAX_NOTE = 200
_NUMBER = re.compile(r"\d+")


def next_progress(note: str, previous: Progress | None, now: float) -> Progress:
    note = " ".join("".join(c if c.isprintable() else " " for c in note).split())[:MAX_NOTE]  # one line
    found = _NUMBER.search(note)
    if found and len(found.group()) <= 12:
        counter = int(found.group())
    elif previous is None:
        counter = 1
    else:
        counter = previous.counter + (note != previous.note)
    if previous is not None and previous.note == note and previous.counter == counter:
        return previous
    return Progress(note=note, counter=counter, at=iso(now))


__all__ = ["next_progress", "MAX_NOTE"]
