"""Files: writing one so that readers see the old contents or the new, never a part (a unique temporary file in
the same folder, then ``os.replace``), and the one way gitlease locks a file (``locked``, ``lock_file``: flock).
Standard library only."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from gitlease.core.clock import Clock


def atomic_write(path: str, data: bytes, *, mode: int | None = None, tmp_prefix: str | None = None) -> None:
    """Replace ``path`` with ``data`` (and ``mode``, if given) in one rename; the temporary file is removed
    when anything fails. ``tmp_prefix``: how the temporary file's name starts (``tmp_obj_`` in an object
    folder, which git's own prune cleans up after a crash)."""
    prefix = tmp_prefix if tmp_prefix is not None else f".{os.path.basename(path)}.tmp-"
    tmp = os.path.join(os.path.dirname(path) or ".", f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def put_file(path: str, data: bytes | None) -> None:
    """Make ``path`` hold ``data`` (its folders made, its mode kept, written by ``atomic_write``), or not exist
    when ``data`` is None."""
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        mode: int | None = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    atomic_write(path, data, mode=mode)


def write_json(path: str, doc: object, *, pretty: bool = False) -> None:
    """``atomic_write`` of ``doc`` as JSON (``pretty``: indented, sorted keys, a final newline)."""
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n" if pretty else json.dumps(doc)
    atomic_write(path, text.encode("utf-8"))


class LockBusy(BlockingIOError):
    """``lock_file`` gave up: another process holds the lock (``wait`` 0, or the wait ran out)."""


def lock_file(path: str, *, shared: bool = False, wait: float | None = None, clock: Clock | None = None) -> IO[str]:
    """Open ``path`` (created if needed, with its folder) and take an flock on it; the returned file holds the
    lock until it is closed. ``wait`` None: block until the lock is free; 0: try once; more: poll every 20 ms
    for that many seconds by ``clock`` (``monotonic`` and ``sleep``; the real clock when None). Raises
    LockBusy when it gives up."""
    import fcntl

    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fh = open(path, "a+")
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        if wait is None:
            fcntl.flock(fh, mode)
            return fh
        give_up = (clock.monotonic() if clock else time.monotonic()) + wait
        while True:
            try:
                fcntl.flock(fh, mode | fcntl.LOCK_NB)
                return fh
            except BlockingIOError:
                now = clock.monotonic() if clock else time.monotonic()
                if now >= give_up:
                    raise LockBusy(f"{path} is locked by another process") from None
                (clock.sleep if clock else time.sleep)(0.02)
    except BaseException:
        fh.close()
        raise


@contextlib.contextmanager
def locked(
    path: str, *, shared: bool = False, wait: float | None = None, clock: Clock | None = None
) -> Iterator[IO[str]]:
    """``lock_file`` as a ``with`` block: the lock is held inside it (closing the file drops it)."""
    fh = lock_file(path, shared=shared, wait=wait, clock=clock)
    with fh:
        yield fh
