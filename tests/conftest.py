"""Every test runs real git in temporary folders, isolated from the developer's machine: HOME, git's global
and system config are replaced. Servers (file://, git daemon, smart HTTP) come from servers.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

pytest_plugins = ["servers"] if os.path.exists(os.path.join(os.path.dirname(__file__), "servers.py")) else []

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated_git(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    (home / ".gitconfig").write_text("[init]\n\tdefaultBranch = main\n[protocol]\n\tversion = 2\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GITLEASE_AGENT", "GITLEASE_TASK"):
        monkeypatch.delenv(var, raising=False)
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.invalid")
    monkeypatch.setenv("GIT_TERMINAL_PROMPT", "0")
    return home


@pytest.fixture(autouse=True)
def agent_socket(monkeypatch):
    """The renewal agent's socket in a short private folder of this test (unix socket paths are short); an
    agent a test started (hold(), git lease run) is told to stop afterwards."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="gl-agent-", dir="/tmp")
    path = os.path.join(folder, "agent.sock")
    monkeypatch.setenv("GITLEASE_AGENT_SOCKET", path)
    yield path
    if os.path.exists(path):
        from gitlease.liveness.agent import AgentClient

        try:
            AgentClient(path, timeout=5).request("stop")
        except OSError:
            pass
    shutil.rmtree(folder, ignore_errors=True)


def git(cwd, *args, check=True, input=None):
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, input=input)
    if check and res.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {res.stderr}")
    return res.stdout


@pytest.fixture
def make_repo(tmp_path):
    """A fresh repository with one commit; each call makes another (another agent's clone)."""
    counter = iter(range(1000))

    def make(name=None):
        path = tmp_path / (name or f"work{next(counter)}")
        git(tmp_path, "init", "-q", str(path))
        (path / "README").write_text("x\n")
        git(path, "add", "README")
        git(path, "commit", "-q", "-m", "init")
        return path

    return make


def cli(cwd, *args, env=None, timeout=60):
    """Run the real installed ``git lease`` (git dispatching to the git-lease executable)."""
    full_env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    full_env["PATH"] = bindir + os.pathsep + full_env.get("PATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        ["git", "lease", *args], cwd=cwd, capture_output=True, text=True, env=full_env, timeout=timeout
    )


@pytest.fixture(params=["local", "file", "daemon", "http"])
def fleet(request, tmp_path):
    """Agents sharing one lease store of each kind."""
    from helpers import Fleet

    if request.param == "local":
        return Fleet(tmp_path, None)
    remote = request.getfixturevalue("remote_" + request.param)
    return Fleet(tmp_path, remote.url)
