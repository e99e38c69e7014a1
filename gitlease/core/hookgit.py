"""git for the hooks: the one way a hook's lean path starts git, and what it reads of git's answers, in the
standard library's cheapest parts (``os``, ``select``, ``time``: no ``subprocess``, no ``dataclasses``).

The hooks run on every commit and push, so they must not import what the library's git runner
(``core/gitcmd.py``) costs. ``gitcmd`` builds on this module's environment rule (``clean_env``), and the store
(``core/store.py``) on its reading of a listing (``parse_listing``): one rule each, whichever path runs.
"""

from __future__ import annotations

import os
import time

from gitlease.core.refnames import NAMESPACE, PROBE_PREFIX, SCOPE_REF

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy reads it alike
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# Variables git exports inside hooks that would point a git call at the wrong repository or index.
REPO_ENV = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_PREFIX",
        "GIT_QUARANTINE_PATH",
        "GIT_EDITOR",
        "GIT_REFLOG_ACTION",
        "GIT_INTERNAL_GETTEXT_SH_SCHEME",
    }
)
RESERVED = (PROBE_PREFIX,)  # throw-away probe refs of `git lease doctor`: not leases, never listed


def clean_env(extra: Mapping[str, str] | None = None, *, keep_repo: bool = False) -> dict[str, str]:
    """The caller's environment without the per-repository GIT_* variables (credentials, ssh and
    config variables are kept, so the user's authentication works as with plain git)."""
    env = {k: v for k, v in os.environ.items() if keep_repo or k not in REPO_ENV}
    env.setdefault("LC_ALL", "C")
    if extra:
        env.update(extra)
    return env


def run(
    args: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None, timeout: float | None = None
) -> tuple[int, bytes] | None:
    """``git *args`` -> (exit code, stdout), or None when it outlived ``timeout`` seconds (then killed with
    the helpers it started, ssh or a remote helper: with a timeout it runs in a session of its own, as
    ``gitcmd.run`` runs it). stdin and stderr are /dev/null; ``env``: the caller's environment when None."""
    r, w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        actions = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
        argv = ["git", *args] if cwd is None else ["git", "-C", cwd, *args]
        pid = os.posix_spawnp(
            "git", argv, os.environ if env is None else env, file_actions=actions, setsid=timeout is not None
        )
    finally:
        os.close(w)
        os.close(devnull)
    chunks = []
    end = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            if end is not None and not _readable(r, end):
                _kill(pid, timeout is not None)
                return None
            b = os.read(r, 1 << 16)
            if not b:
                break
            chunks.append(b)
    except BaseException:  # Ctrl-C: git and its helpers go with us (in a session of its own, no terminal sends it)
        _kill(pid, timeout is not None)
        raise
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)


def _kill(pid: int, group: bool) -> None:
    """Kill git (``group``: and everything in its session), and reap it."""
    try:
        if group:
            os.killpg(pid, 9)
        else:
            os.kill(pid, 9)
    except OSError:
        pass
    os.waitpid(pid, 0)


def _readable(fd: int, end: float) -> bool:
    import select

    left = end - time.monotonic()
    return left > 0 and bool(select.select([fd], [], [], left)[0])


def parse_listing(text: str) -> tuple[dict[str, str], str | None, str | None]:
    """``git ls-remote [--symref] <remote> [HEAD] refs/leases/*`` -> (the lease refs {ref: oid}, the branch HEAD
    names, HEAD's commit). Doctor's probe refs, peeled tags and names only ending like ours are left out.
    ValueError for a line git does not write."""
    text, branch = strip_symref(text)
    # every other line is "<oid>\t<ref>", and neither holds white space (git's ref name rules): one split
    words = text.split()
    if len(words) % 2:
        raise ValueError("a listing line git did not write")
    listed = dict(zip(words[1::2], words[0::2]))
    oid = listed.pop("HEAD", None)  # only there when asked for (a lease ref's name never is exactly HEAD)
    under = NAMESPACE + "/"
    names = "\n" + "\n".join(listed)
    if names.count("\n" + under) == len(listed) and "^{}" not in names and not any("\n" + r in names for r in RESERVED):
        return listed, branch, oid  # the common case, judged in three scans of the text
    refs = {  # not a peeled tag (listed without --refs), nor a probe ref, nor a name only ending like ours
        ref: o
        for ref, o in listed.items()
        if (ref.startswith(under) or ref == SCOPE_REF) and not ref.startswith(RESERVED) and not ref.endswith("^{}")
    }
    return refs, branch, oid


def strip_symref(text: str) -> tuple[str, str | None]:
    """A listing without the line ``--symref`` adds for HEAD ("ref: <branch>\tHEAD"), and that branch."""
    at = text.find("ref: ")
    if at < 0 or (at > 0 and text[at - 1] != "\n"):
        return text, None
    end = text.find("\n", at)
    end = len(text) if end < 0 else end
    return text[:at] + text[end + 1 :], text[at + 5 : end].partition("\t")[0].strip()


def touched_paths_args(include: Sequence[str], exclude: Sequence[str]) -> list[str]:
    """The ``git log`` arguments whose ``-z`` output is every path changed by the commits ``include`` reaches and
    ``exclude`` does not: deletions, both sides of renames and what a merge itself changes."""
    return ["log", "--format=", "--name-only", "--no-renames", "--cc", "-z", *include, "--not", *exclude, "--"]
