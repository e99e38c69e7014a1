"""A command's process group under a held lease: ``Guard`` (one command: ``git lease run``'s, each task's agent
and verifier in ``git lease work``) and ``run_under`` (``git lease run`` itself).

A guarded command runs in a process group of its own and is stopped (SIGTERM to the whole group, then
SIGKILL ``grace`` seconds later) before anyone else may take its lease: when the lease is lost (the
Holding's loss listener), when its holder says so (a second Ctrl-C, ``git lease work`` stopping), and by two
backstops when the holder itself cannot act:

* a **watchdog** process (gitlease.liveness.watchdog), in a session of its own, armed with the lease's stop
  deadline before the command may start and moved on after each confirmed renewal: it stops the group when the
  holder dies (its pipe closes: kill -9, the OOM killer) or misses the deadline (frozen by SIGSTOP, stuck);
* a **start gate** with **kill-on-parent-death**: the command starts through a tiny standard-library wrapper
  (``GATE``: ``python -S``) that asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG, Linux),
  then waits on a pipe until the holder has armed the watchdog, then execs the command. The holder gone before
  that: the command never starts. The wrapper makes this safe from a threaded holder (the queue runner), where
  work between fork and exec in Python is not.

When the command ends by itself, what is left of its group (background jobs) is stopped the same way.

Progress: the command (or ``git lease progress NOTE`` run by it) writes a short note into the file named by
``$GITLEASE_PROGRESS_FILE``; the heartbeat sends the newest note with the next renewal, and with
``lease.progressTimeout`` a command that has reported once and then reports nothing for that long loses its
lease and is stopped (Heartbeat.progress_timeout). ``$GITLEASE_LEASE`` names the lease. The module prints
nothing: ``log`` receives its messages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from gitlease.core.errors import GitLeaseError, LeaseLost, UsageError
from gitlease.liveness.watchdog import group_alive, stop_group

if TYPE_CHECKING:
    from gitlease.liveness.holding import Holding
    from gitlease.liveness.interrupts import Interrupts


PROGRESS_ENV = "GITLEASE_PROGRESS_FILE"
MAX_NOTE_BYTES = 4096


def progress_file(folder: str, lease_id: str) -> str:
    """Where the command of ``git lease run`` reports progress: in the worktree's gitlease folder, next to the
    held state (so ``git lease progress`` finds both from the one path it is given)."""
    return os.path.join(folder, f"progress-{lease_id}")


def report_progress(path: str, lease_id: str, note: str, now: float) -> float:
    """``git lease progress`` inside ``git lease run``: write ``note`` for the supervisor to send with its next
    renewal; the lease's stop deadline (wall clock) is returned. Refused with LeaseLost (exit 6: stop, write
    nothing) when this worktree no longer holds the lease (lost, released) or its stop deadline has passed:
    a frozen holder that resumes finds out here, before its supervisor or watchdog has even run."""
    from gitlease.core import record as records
    from gitlease.core.clock import iso
    from gitlease.core.fsutil import atomic_write
    from gitlease.core.state import HeldState

    held = HeldState(os.path.dirname(path)).load().get(lease_id)
    if held is None:
        raise LeaseLost(f"lease lost: {lease_id} is no longer held here (stop writing)", leaseId=lease_id)
    stop = records.parse(held.record.encode("utf-8")).stop_deadline
    if now >= stop:
        raise LeaseLost(
            f"lease lost: {lease_id} passed its stop deadline ({iso(stop)}) without a renewal (stop writing)",
            leaseId=lease_id,
        )
    atomic_write(path, note.encode("utf-8")[:MAX_NOTE_BYTES] + b"\n")
    return stop


class ProgressFile:
    """The supervisor's side: ``poll()`` (at each heartbeat wake-up) hands a changed note to the heartbeat."""

    def __init__(self, path: str, report: Callable[[str], None]) -> None:
        self.path, self.report = path, report
        self._seen: tuple[int, int, int] | None = None
        try:
            os.unlink(path)  # nothing from an earlier run
        except OSError:
            pass

    def poll(self) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._seen:
                return
            with open(self.path, "rb") as fh:
                data = fh.read(MAX_NOTE_BYTES)
        except OSError:
            return
        self._seen = stamp
        note = data.decode("utf-8", "replace").strip().splitlines()
        if note and note[-1].strip():
            self.report(note[-1].strip())

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


@dataclass
class RunResult:
    returncode: int  # the command's exit status (128 + signal when a signal ended it)
    lost: bool
    reason: str | None
    released: bool
    release_error: str | None = None


# What a terminal sends a foreground process group. Between fork and setsid (or setpgid), a new child is still in
# the runner's group with default dispositions (subprocess resets them before exec), so a Ctrl-C typed in that
# moment killed the gate, and the worker's write to the gate failed with EPIPE (found by test_lifecycle's
# one-Ctrl-C test, one run in many). They are blocked in the starting thread across the fork: the child starts
# with them blocked, and the gate drops what is pending once it is in a session or group of its own.
SHIELDED = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTSTP)

# The start gate (run as ``python -S -c GATE PARENT_PID GATE_FD COMMAND...``): standard library only, no site.
GATE = r"""
import os, signal, sys
TERMINAL = (@SHIELDED@)
for sig in TERMINAL:  # blocked by the parent until this process had left its group (SHIELDED): drop what is
    signal.signal(sig, signal.SIG_IGN)  # pending (a Ctrl-C meant for the runner), then take them again
signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINAL)
parent, fd, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
if sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
if os.getppid() != parent:
    os._exit(137)
go = os.read(fd, 1)
os.close(fd)
if not go or os.getppid() != parent:
    os._exit(137)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE, signal.SIGTSTP):
    signal.signal(sig, signal.SIG_DFL)
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    os.write(2, ("git-lease: cannot run %r: %s\n" % (argv[0], exc.strerror or exc)).encode())
    os._exit(127)
""".replace("@SHIELDED@", ", ".join(f"signal.{sig.name}" for sig in SHIELDED))
CANNOT_RUN = 127


def popen_shielded(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` with the terminal's signals blocked in this thread while it forks (``SHIELDED``);
    the child must unblock them itself (``GATE`` does). Other threads, the main one included, still take them."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        return subprocess.Popen(list(argv), **kwargs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Guard:
    """One command's process group under a Holding (module docstring). ``start()``, then ``wait()``; ``stop()``
    from any thread. ``stdin``: bytes written to the command's stdin (then closed); ``stdout``/``stderr``: files
    (default: inherited). ``session``: a session of its own (no controlling terminal: a Ctrl-C typed at the
    terminal never reaches it; the queue runner's agents), else a process group of its own in this session."""

    def __init__(
        self,
        holding: Holding,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        grace: float | None = None,
        watchdog: bool = True,
        log: Callable[[str], None] = lambda line: None,
        stdin: bytes | None = None,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | int | None = None,
        session: bool = False,
    ) -> None:
        if not argv:
            raise UsageError("no command to run")
        self.holding, self.argv, self.env, self.cwd = holding, list(argv), env, cwd
        # never longer than the holding's own grace: the group must be gone by the lease's hard stop
        self.grace = holding.timing.grace if grace is None else min(grace, holding.timing.grace)
        self.use_watchdog, self.log = watchdog, log
        self.stdin, self.stdout, self.stderr, self.session = stdin, stdout, stderr, session
        self.proc: subprocess.Popen[bytes] | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.stopped: str | None = None  # why it was stopped, if it was
        self._stopping = threading.Lock()
        self._unlisten: list[Callable[[], None]] = []

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """Start the command at its gate, arm the watchdog with the lease's stop deadline, open the gate."""
        gate_r, gate_w = os.pipe()
        try:
            self.proc = popen_shielded(
                [sys.executable, "-S", "-c", GATE, str(os.getpid()), str(gate_r), *self.argv],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE if self.stdin is not None else None,
                stdout=self.stdout,
                stderr=self.stderr,
                pass_fds=(gate_r,),
                start_new_session=self.session,
                process_group=None if self.session else 0,
            )
        finally:
            os.close(gate_r)
        try:
            if self.use_watchdog:  # shielded too (it ignores the terminal's signals, and has none in its session)
                self.watchdog = popen_shielded(
                    [
                        sys.executable,
                        "-m",
                        "gitlease.liveness.watchdog",
                        str(self.proc.pid),
                        f"{self.grace:g}",
                        f"{self._real(self.holding.hard_stop) - self.grace:.3f}",  # SIGTERM then; SIGKILL by then
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                self._unlisten.append(self.holding.on_renewed(self._renewed))
            self._unlisten.append(self.holding.on_lost(self._lost))
            os.write(gate_w, b"g")
        finally:
            os.close(gate_w)
        if self.stdin is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(self.stdin)
            except OSError:
                pass
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _renewed(self, hard_stop: float) -> None:
        self._tell_watchdog(f"deadline {self._real(hard_stop) - self.grace:.3f}")

    def _real(self, moment: float) -> float:
        """A moment of the holder's clock (``clock.monotonic()``: injected in tests) on the system's monotonic
        clock, which the watchdog reads (CLOCK_MONOTONIC is one clock for every process on Linux)."""
        return time.monotonic() + (moment - self.holding.svc.clock.monotonic())

    def _lost(self, reason: str) -> None:
        self.log(LeaseLost.say(self.holding.lease_id, reason))
        self.stop("lease lost")

    def _tell_watchdog(self, line: str) -> None:
        wd = self.watchdog
        if wd is None or wd.stdin is None:
            return
        try:
            wd.stdin.write(line.encode() + b"\n")
            wd.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the command's group."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, why: str) -> None:
        """SIGTERM the group, wait up to ``grace``, SIGKILL what is left. Safe to call twice, from any thread."""
        proc = self.proc
        if proc is None:
            return
        with self._stopping:
            if self.stopped is None:
                self.stopped = why
            if group_alive(proc.pid):
                self.log(f"stopping the command ({why}): SIGTERM, SIGKILL after {self.grace:g}s")
                stop_group(proc.pid, self.grace)

    def wait(self, should_stop: Callable[[], str | None] | None = None, poll: float = 0.05) -> int:
        """Wait for the command; ``should_stop()`` (asked every ``poll`` seconds) naming a reason stops it. Then
        stop what is left of its group and disarm the watchdog. Returns its exit status (128 + the signal that
        ended it)."""
        proc = self.proc
        assert proc is not None
        while True:
            try:
                rc = proc.wait(timeout=poll)
                break
            except subprocess.TimeoutExpired:
                why = should_stop() if should_stop is not None else None
                if why:
                    self.stop(why)
        self.stop("the command exited; stopping what it left running")
        for remove in self._unlisten:
            remove()
        self._unlisten.clear()
        return 128 - rc if rc < 0 else rc

    def finish_watchdog(self) -> bool:
        """Tell the watchdog the command is done; True when it had fired (stopped the group itself)."""
        wd = self.watchdog
        if wd is None:
            return False
        self._tell_watchdog("done")
        try:
            out, _ = wd.communicate(timeout=self.grace + 5)
        except subprocess.TimeoutExpired:
            wd.kill()
            out, _ = wd.communicate()
        return b"fired" in (out or b"")


def run_under(
    holding: Holding,
    argv: Sequence[str],
    *,
    interrupts: Interrupts,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    watchdog: bool = True,
    log: Callable[[str], None] = lambda line: None,
) -> RunResult:
    """``git lease run``: ``argv`` under ``holding`` (started here), then the holding closed (released, or kept
    when it was adopted). Signals (counted by ``interrupts``): each one is forwarded to the command's group
    (the command decides what a Ctrl-C means); a second Ctrl-C, or a second SIGTERM/SIGHUP after the first was
    forwarded, stops the group."""
    if not argv:
        raise UsageError("no command to run: git lease run --scope PATH -- COMMAND [ARGS...]")
    hb = holding.heartbeat
    if holding.svc.clock.monotonic() >= hb.deadline:
        raise GitLeaseError(
            f"lease {holding.lease_id} is too close to its stop deadline to start a command under it; renew it first"
        )
    progress = ProgressFile(progress_file(holding.svc.held.folder, holding.lease_id), holding.progress)
    env = dict(os.environ if env is None else env, GITLEASE_LEASE=holding.lease_id, **{PROGRESS_ENV: progress.path})
    guard = Guard(holding, argv, env=env, cwd=cwd, watchdog=watchdog, log=log)
    seen = [0, 0]  # Ctrl-Cs and other signals forwarded so far

    def on_signal() -> str | None:
        if interrupts.interrupts > seen[0]:
            seen[0] = interrupts.interrupts
            if seen[0] >= 2:
                return "a second Ctrl-C"
            guard.signal(signal.SIGINT)
        if interrupts.terminated and not seen[1]:
            seen[1] = interrupts.terminated
            guard.signal(interrupts.terminated)
        return None

    try:
        guard.start()
        holding.start(poll=progress.poll)
        status = guard.wait(on_signal)
        holding.stop()
        fired = guard.finish_watchdog()
    finally:
        progress.remove()
    closed = holding.close()
    lost = closed.lost or fired
    reason = closed.reason or ("the watchdog stopped the command at the deadline" if fired else None)
    error = str(closed.release_error) if closed.release_error is not None else None
    return RunResult(status, lost, reason, closed.released, error)


__all__ = ["Guard", "RunResult", "run_under", "group_alive", "stop_group", "GATE"]
