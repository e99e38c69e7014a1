"""Ctrl-C, SIGTERM and SIGHUP for everything that holds leases while a command runs (``git lease run``,
``git lease work``): counted in the signal handler, acted on elsewhere.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread is: inside a
``threading.Event``'s lock, a ``print``, a ``with lock:``. So the handler here takes no lock, does no I/O and
sets no Event: it only counts (plain integers). The code that waits (a supervisor's wait loop, the runner's
main loop) reads the counts a few times a second and acts: forward the signal, stop taking work, stop the
running commands.

One Ctrl-C typed at a terminal reaches every process of the foreground process group, git included, and git,
when it runs ``git-lease`` as ``git lease``, forwards its own copy to its child: one key press, two SIGINTs.
So when the parent process is git, SIGINTs are paired: a SIGINT within ``window`` (2 s) of an unpaired one is
its other copy and is not counted again, and one Ctrl-C means one Ctrl-C whether started as ``git lease ...``
or as ``git-lease ...``. git's copy may come late on a loaded machine (a 0.5 s dead time counted it as a
second press under 8 CPU hogs, and one Ctrl-C stopped the agents). The limit, both ways: the two copies of
one press can also arrive as one signal (a signal already pending is not queued twice), and then a second
press within the window pairs with the first and must be typed again; a copy more than 2 s late counts as a
press. (A process between git and the runner that absorbs git's copy would end both; not built.)

The semantics every user of this module follows (docs/work.md, docs/cli.md): the first Ctrl-C stops starting
new work and lets what runs finish; a second one stops what runs (SIGTERM, a grace period, SIGKILL); SIGTERM
and SIGHUP stop what runs at once. The exit code after an interrupt is 128 + the signal (130 for Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import threading
import time

WINDOW = 2.0  # seconds: a SIGINT this close to an unpaired one is its other copy (the terminal's, git's)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def parent_is_git() -> bool:
    """Whether this process was started by git (``git lease ...`` runs the ``git-lease`` executable as git's
    child). Read from /proc (Linux); elsewhere assumed, so that a Ctrl-C is never counted twice."""
    try:
        with open(f"/proc/{os.getppid()}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip() == "git"
    except OSError:
        return not os.path.isdir("/proc/self")


class Interrupts:
    """Signal counts since ``install()``. ``interrupts`` counts Ctrl-Cs (deduplicated); ``terminated`` is the
    first SIGTERM or SIGHUP received (its number), else 0; ``seq`` moves on every counted signal."""

    def __init__(self, window: float | None = None) -> None:
        self.window = (WINDOW if parent_is_git() else 0.0) if window is None else window
        self.interrupts = 0
        self.terminated = 0
        self.seq = 0
        self._unpaired = float("-inf")  # when the last counted SIGINT came, until its other copy comes
        self._previous: dict[int, object] = {}

    def _handler(self, signum: int, _frame: object) -> None:  # no lock, no I/O, no Event: see the module doc
        if signum == signal.SIGINT:
            now = time.monotonic()
            if now - self._unpaired < self.window:
                self._unpaired = float("-inf")
                return  # the other copy of the same Ctrl-C
            self._unpaired = now
            self.interrupts += 1
        elif not self.terminated:
            self.terminated = signum
        self.seq += 1

    def install(self) -> Interrupts:
        """Take over the signals (main thread only; elsewhere nothing is installed and nothing is counted)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return self
        for sig in SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    @property
    def stop_now(self) -> bool:
        """What runs must stop: a second Ctrl-C, or SIGTERM / SIGHUP."""
        return self.interrupts >= 2 or bool(self.terminated)

    @property
    def any(self) -> bool:
        return self.seq > 0

    def exit_code(self) -> int | None:
        """128 + the signal that interrupted (SIGTERM or SIGHUP first, else SIGINT), or None."""
        if self.terminated:
            return 128 + self.terminated
        if self.interrupts:
            return 128 + int(signal.SIGINT)
        return None

    def __enter__(self) -> Interrupts:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()


__all__ = ["Interrupts", "WINDOW"]
