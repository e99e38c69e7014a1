"""The backstop of ``git lease run``: a tiny process that kills the command's process group when the
supervisor can no longer do it.

``python -m gitlease.liveness.watchdog PGID GRACE [DEADLINE]`` runs in a session of its own (armed with its first
deadline before the command may start) and reads lines from the supervisor on stdin:

* ``deadline <monotonic seconds>``: stop the group (SIGTERM, ``GRACE`` seconds, SIGKILL) if this moment passes
  without a later deadline (the supervisor sends one after each confirmed renewal);
* ``done``: the command has stopped; exit without touching anything.

End of file without ``done`` means the supervisor died (SIGKILL, OOM killer): the group is stopped at once.
So the command's group (grandchildren included, unless they left it with setsid) is dead before the lease can
expire even when the supervisor is SIGKILLed or frozen (SIGSTOP). CLOCK_MONOTONIC is system-wide on Linux, so
the two processes agree on deadlines. It writes ``fired`` on stdout when it stopped the group. Standard library
only, and it imports nothing of gitlease: it must start fast and depend on nothing that can fail.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(pgid: int, grace: float) -> bool:
    """SIGTERM (and SIGCONT: a stopped process cannot act on SIGTERM) to the group, up to ``grace`` seconds for
    it to go, then SIGKILL what is left. False when the group was gone already."""
    if not group_alive(pgid):
        return False
    try:
        os.killpg(pgid, signal.SIGTERM)
        os.killpg(pgid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
    except ProcessLookupError:
        return True
    end = time.monotonic() + grace
    while time.monotonic() < end and group_alive(pgid):
        time.sleep(0.02)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def main(argv: list[str]) -> int:
    pgid, grace = int(argv[0]), float(argv[1])
    deadline: float | None = float(argv[2]) if len(argv) > 2 else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's ^C is for the supervisor to forward
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    buf = b""
    fd = sys.stdin.fileno()
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:  # the deadline passed with no renewal
            break
        chunk = os.read(fd, 4096)
        if not chunk:  # the supervisor is gone
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            word, _, value = line.decode("ascii", "replace").partition(" ")
            if word == "done":
                return 0
            if word == "deadline":
                deadline = float(value)
    stop_group(pgid, grace)
    try:
        os.write(1, b"fired\n")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
