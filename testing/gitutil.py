"""The one git helper of the tests, the soak and the benchmarks: run real git, fail loudly with its stderr."""

from __future__ import annotations

import os
import subprocess
import sys

# Variables git exports inside hooks that would point a git call at the wrong repository.
GIT_ENV_DROP = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR", "GIT_PREFIX")


def run_git(
    cwd, *args: str, check: bool = True, input: str | None = None, env: dict | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """``git ARGS`` in ``cwd`` (``env``: added to this process's environment); the finished process. A failure
    raises AssertionError with git's exit code and stderr."""
    full_env = {**os.environ, **env} if env else None
    res = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, input=input, env=full_env, timeout=timeout
    )
    if check and res.returncode != 0:
        raise AssertionError(f"git {' '.join(map(str, args))} failed ({res.returncode}):\n{res.stderr}")
    return res


def git(
    cwd, *args: str, check: bool = True, input: str | None = None, env: dict | None = None, timeout: float | None = None
) -> str:
    """``git ARGS`` in ``cwd``; its stdout (text)."""
    return run_git(cwd, *args, check=check, input=input, env=env, timeout=timeout).stdout


def git_env(extra: dict | None = None) -> dict:
    """The environment without git's per-repository variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in GIT_ENV_DROP}
    env.update(extra or {})
    return env


def cli(cwd, *args: str, env: dict | None = None, timeout: float = 60, input: str | None = None):
    """Run the real installed ``git lease`` (git dispatching to the git-lease executable next to this Python)."""
    full_env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    full_env["PATH"] = bindir + os.pathsep + full_env.get("PATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        ["git", "lease", *args], cwd=cwd, capture_output=True, text=True, env=full_env, timeout=timeout, input=input
    )


def make_repo(path, *, files: dict[str, str] | None = None) -> None:
    """A fresh repository at ``path`` with one commit (``README``, or ``files``)."""
    os.makedirs(path, exist_ok=True)
    git(path, "init", "-q")
    for name, text in (files or {"README": "x\n"}).items():
        full = os.path.join(path, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "init")


def seed_bare(base, files, *, name: str = "remote.git", bare=None):
    """A bare repository (``bare``, else ``base/name``, made with testing.servers.make_bare) whose ``main`` holds
    one commit with ``files`` (each ``x``); returns its path."""
    from pathlib import Path

    from testing.servers import make_bare

    bare = Path(bare) if bare is not None else make_bare(Path(base) / name)
    seed = Path(base) / f"seed-{Path(bare).name}"
    git(base, "init", "-q", "-b", "main", str(seed))
    for f in files:
        (seed / f).parent.mkdir(parents=True, exist_ok=True)
        (seed / f).write_text("x\n")
    git(seed, "add", "-A")
    git(seed, "commit", "-q", "--allow-empty", "-m", "init")
    git(seed, "push", "-q", str(bare), "main")
    return bare
