"""Processes on this host: is the process that holds a lease still the same one, and is it alive.

A pid alone is not an identity (pids are reused), so a holder is recorded as (pid, start time): the start
time in clock ticks since boot, field 22 of ``/proc/PID/stat``. Linux only; elsewhere the start time is None
and callers treat liveness as unknown. And ``site_packages``: this process's own packages back, for a hook
started without them. Standard library only.
"""

from __future__ import annotations

import os


def process_start(pid: int) -> int | None:
    """The start time of a process (clock ticks since boot, /proc/PID/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
        return int(data.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def same_process(pid: int, start: int | None) -> bool:
    """Whether ``pid`` runs and, when ``start`` is known, is the process that started then (not a reuse)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    return start is None or process_start(pid) == start


def can_tell() -> bool:
    """Whether this host shows process start times (``/proc``): without them no rule may judge a pid."""
    return process_start(os.getpid()) is not None


def site_packages() -> None:
    """site-packages back on ``sys.path`` in a process started without them (``python -S``: git's hooks, whose
    start-up skips ``site``), once; nothing in any other process. What needs a package from there
    (``cryptography``, to verify a signature) calls this first."""
    import sys

    if sys.flags.no_site and "site" not in sys.modules:
        import site

        site.main()
