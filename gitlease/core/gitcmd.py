"""Every git subprocess goes through ``run``: one place for environment, timeouts and errors.

Standard library only: hooks import this module.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from gitlease.core.errors import GitError, RemoteUnavailable
from gitlease.core.hookgit import clean_env


@dataclass(frozen=True)
class Result:
    cmd: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "surrogateescape")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")


class Timeout(RemoteUnavailable):
    """A git command that did not finish in time; its process group was killed."""

    kind = "timeout"


# The monotonic moment by which every git call of the current thread's task must have ended (None: no bound).
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("gitlease_git_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Every git call made inside the block (in this thread) ends within ``seconds`` from now, all of them
    together: each one's timeout is what is left, and one started with nothing left raises Timeout at once.
    Nested blocks keep the earlier deadline. How a caller bounds one whole operation (a renewal attempt, a
    release after a loss) without changing anything shared: the deadline belongs to the call, not the store."""
    end = time.monotonic() + max(0.0, seconds)
    outer = _DEADLINE.get()
    token = _DEADLINE.set(end if outer is None else min(outer, end))
    try:
        yield end
    finally:
        _DEADLINE.reset(token)


def remaining(default: float | None = None) -> float | None:
    """Seconds left before the current deadline (at most ``default``); ``default`` when there is none."""
    end = _DEADLINE.get()
    if end is None:
        return default
    left = max(0.0, end - time.monotonic())
    return left if default is None else min(default, left)


def run(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    input: bytes | None = None,
    timeout: float | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    keep_repo_env: bool = False,
    grace: float = 0.0,
) -> Result:
    """Run ``git *args``. ``check`` raises GitError on a non-zero exit. A timeout kills the whole
    process group (git, ssh, remote helpers) and raises Timeout.

    ``grace``: on a timeout, kill git itself first and give its children that long to finish before the
    group goes. A push to a ``file://`` remote runs the server's ``receive-pack`` as such a child: killed
    while it commits a multi-ref transaction, it can leave that transaction half done (git's files backend
    renames ref locks one by one) and stale ``.lock`` files behind. Left alone, it either commits the whole
    transaction or, its client gone, none of it."""
    cmd = ("git", *args)
    timeout = remaining(timeout)
    if timeout is not None and timeout <= 0:
        raise Timeout(f"git {args[0]} not started: no time left before the deadline", cmd=list(cmd))
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(env, keep_repo=keep_repo_env),
        start_new_session=timeout is not None,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        if grace > 0:
            proc.kill()
            try:
                proc.communicate(timeout=grace)  # the pipes close when the children are done too
            except subprocess.TimeoutExpired:
                pass
        _kill_group(proc)
        out, err = proc.communicate()
        raise Timeout(f"git {args[0]} did not answer within {timeout:g}s", cmd=list(cmd)) from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    res = Result(cmd, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise GitError(
            f"git {args[0]} failed: {_first_line(res.err) or 'exit ' + str(proc.returncode)}",
            cmd=list(cmd),
            returncode=proc.returncode,
            stdout=res.out,
            stderr=res.err,
        )
    return res


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("fatal: ", "error: ")):
            return line.split(": ", 1)[1]
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def zsplit(data: str) -> list[str]:
    """Split NUL-terminated output (``-z``) into its items."""
    data = data.strip("\0")
    return data.split("\0") if data else []
