"""``git lease run``: run a command under a lease, and stop it before anyone else may take the lease once it is
lost.

The command runs in a process group of its own. A Heartbeat renews the lease in a background thread; when the
lease is lost (a renewal refused, or none confirmed by the stop deadline) the whole group gets SIGTERM, then
SIGKILL ``grace`` seconds later, which is still before the version's recorded stop deadline (``stopBy``, which
every early reclaim rule waits for) and its expiry (Timing.check). When the command ends by itself, what is
left of its group (background jobs) is stopped the same way; only then is the lease released.

Progress: the command (or ``git lease progress NOTE`` run by it) writes a short note into the file named by
``$GITLEASE_PROGRESS_FILE``; the heartbeat sends the newest note with the next renewal, and with
``lease.progressTimeout`` a command that has reported once and then reports nothing for that long loses its
lease and is stopped (Heartbeat.progress_timeout). ``$GITLEASE_LEASE`` names the lease.

Two backstops for a supervisor that cannot act (docs/limits.md): the direct child gets PR_SET_PDEATHSIG
(SIGKILL when the supervisor dies, Linux), and a watchdog process (gitlease.liveness.watchdog) in its own session kills
the group when the supervisor dies or misses a deadline (frozen by SIGSTOP, stuck). SIGINT, SIGTERM and SIGHUP
sent to the supervisor are forwarded to the group. The module prints nothing: ``log`` receives its messages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gitlease.core.errors import GitLeaseError, LeaseLost, UsageError
from gitlease.liveness.heartbeat import Heartbeat, Timing, service_attempt

PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


def _prctl():
    """libc's prctl (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def spawn_gated(argv: Sequence[str], env: dict[str, str], cwd: str | None = None) -> tuple[int, int]:
    """Fork the command into a process group of its own, with PR_SET_PDEATHSIG (SIGKILL when the supervisor
    dies, Linux; it survives exec), held at a gate until the supervisor opens it (``os.write(gate, b"g")``) once
    the watchdog is armed. End of file on the gate (the supervisor died first): the command never starts.
    Returns (pid, gate fd). Call it before starting any thread."""
    prctl = _prctl()
    parent = os.getpid()
    gate_r, gate_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-safe work until exec
        try:
            os.close(gate_w)
            os.setpgid(0, 0)
            if prctl is not None:
                prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            go = os.read(gate_r, 1)
            os.close(gate_r)
            if not go or os.getppid() != parent:
                os._exit(137)
            for sig in FORWARDED:
                signal.signal(sig, signal.SIG_DFL)
            if cwd is not None:
                os.chdir(cwd)
            os.execvpe(argv[0], list(argv), env)
        except OSError as exc:
            os.write(2, f"git-lease: cannot run {argv[0]!r}: {exc.strerror or exc}\n".encode())
            os._exit(127)
        finally:
            os._exit(127)
    os.close(gate_r)
    try:
        os.setpgid(pid, pid)  # also from the parent, so the group exists before anyone signals it
    except OSError:
        pass
    return pid, gate_w


class _Child:
    def __init__(self, pid: int) -> None:
        self.pid = pid


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class Supervisor:
    def __init__(
        self,
        svc,
        lease_id: str,
        expires: float,
        timing: Timing,
        argv: Sequence[str],
        *,
        release: bool = True,
        env: dict[str, str] | None = None,
        watchdog: bool = True,
        log: Callable[[str], None] = lambda line: None,
        cwd: str | None = None,
        link=None,
        stop_by: float | None = None,
        progress_timeout: float | None = None,
    ) -> None:
        from gitlease.service.leases import LeaseService

        if not argv:
            raise UsageError("no command to run: git lease run --scope PATH -- COMMAND [ARGS...]")
        timing.check()
        self.svc, self.lease_id, self.timing, self.argv = svc, lease_id, timing, list(argv)
        self.release, self.log, self.use_watchdog, self.cwd = release, log, watchdog, cwd
        self.progress = ProgressFile(progress_file(svc.held.folder, lease_id), self._report)
        self.env = dict(
            os.environ if env is None else env, GITLEASE_LEASE=lease_id, **{PROGRESS_ENV: self.progress.path}
        )
        beat_svc = LeaseService(svc.repo, svc.settings, clock=svc.clock, signer=svc.signer)
        attempt = service_attempt(beat_svc, lease_id, stop_after=timing.stop_after)
        self.link = link  # gitlease.liveness.delegate.AgentLink: renew through the per-host agent
        self.agent_attempt = link.attempt(lease_id, timing, expires, attempt, stop_by) if link else None
        self.heartbeat = Heartbeat(
            self.agent_attempt or attempt,
            timing,
            expires,
            clock=svc.clock,
            on_lost=self._on_lost,
            on_renewed=self._on_renewed,
            stop_by=stop_by,
            progress_timeout=progress_timeout,
            poll=self.progress.poll,
        )
        self.child: _Child | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Lock()

    # ------------------------------------------------------------------ stopping the group
    def stop_group(self, why: str) -> None:
        """SIGTERM the group, wait up to ``grace``, SIGKILL what is left. Safe to call twice."""
        child = self.child
        if child is None:
            return
        with self._stopping:
            pgid = child.pid
            if not group_alive(pgid):
                return
            self.log(f"stopping the command ({why}): SIGTERM, SIGKILL after {self.timing.grace:g}s")
            for sig in (signal.SIGTERM, signal.SIGCONT):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    return
            gone = threading.Event()
            end = self.svc.clock.monotonic() + self.timing.grace
            while self.svc.clock.monotonic() < end and group_alive(pgid):
                gone.wait(0.02)
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _on_lost(self, reason: str) -> None:
        self.log(LeaseLost.say(self.lease_id, reason))
        self.stop_group("lease lost")

    def _report(self, note: str) -> None:
        self.heartbeat.report(note)

    def _on_renewed(self, expiry: float) -> None:
        self._tell_watchdog(f"deadline {self.heartbeat.hard_stop - self.timing.grace:.3f}")

    def _tell_watchdog(self, line: str) -> None:
        wd = self.watchdog
        if wd is None or wd.stdin is None:
            return
        try:
            wd.stdin.write(line.encode() + b"\n")
            wd.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    # ------------------------------------------------------------------ the run
    def run(self) -> RunResult:
        hb = self.heartbeat
        if self.svc.clock.monotonic() >= hb.deadline:
            raise GitLeaseError(
                f"lease {self.lease_id} is too close to its stop deadline to start a command under it; renew it first"
            )
        previous = {sig: signal.getsignal(sig) for sig in FORWARDED}
        for sig in FORWARDED:
            signal.signal(sig, self._forward)
        try:
            pid, gate = spawn_gated(self.argv, self.env, self.cwd)
            self.child = _Child(pid)
            try:
                if self.use_watchdog:  # armed with its first deadline before the command may start
                    first = hb.hard_stop - self.timing.grace  # SIGTERM then; SIGKILL by the hard stop
                    self.watchdog = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "gitlease.liveness.watchdog",
                            str(pid),
                            f"{self.timing.grace:g}",
                            f"{first:.3f}",
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                os.write(gate, b"g")
            finally:
                os.close(gate)
            beat = threading.Thread(target=hb.run, name="gitlease-heartbeat", daemon=True)
            beat.start()
            status = self._wait_child()
            hb.stop()
            self.stop_group("the command exited; stopping what it left running")
            beat.join(self.timing.timeout + 1)
            fired = self._finish_watchdog()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.progress.remove()
        lost = hb.lost.is_set() or fired
        reason = hb.reason or ("the watchdog stopped the command at the deadline" if fired else None)
        released, release_error = False, None
        if self.agent_attempt is not None and not self.release:
            self.link.unregister(self.lease_id)  # a --lease given is kept, and not renewed by the agent any more
        if self.release:
            if lost:
                self.svc.store.timeout = min(float(self.svc.store.timeout), self.timing.timeout)
            try:
                if self.agent_attempt is not None and not self.agent_attempt.fallen and not lost:
                    self.link.release(self.lease_id)
                else:
                    if self.agent_attempt is not None:
                        self.link.unregister(self.lease_id)
                    self.svc.release(self.lease_id)
                released = True
            except GitLeaseError as exc:
                release_error = str(exc)
        return RunResult(status, lost, reason, released, release_error)

    def _wait_child(self) -> int:
        assert self.child is not None
        _, status = os.waitpid(self.child.pid, 0)  # retried on EINTR (PEP 475); handlers forward signals
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code

    def _finish_watchdog(self) -> bool:
        wd = self.watchdog
        if wd is None:
            return False
        self._tell_watchdog("done")
        try:
            out, _ = wd.communicate(timeout=self.timing.grace + 5)
        except subprocess.TimeoutExpired:
            wd.kill()
            out, _ = wd.communicate()
        return b"fired" in (out or b"")

    def _forward(self, signum: int, _frame) -> None:
        child = self.child
        if child is not None:
            try:
                os.killpg(child.pid, signum)
            except ProcessLookupError:
                pass


__all__ = ["Supervisor", "RunResult", "group_alive"]
