"""Every test runs real git in temporary folders, isolated from the developer's machine: HOME, git's global
and system config are replaced. Servers (file://, git daemon, smart HTTP) come from testing/servers.py, their
fixtures from servers.py; the git helper and the fleet of agents from testing/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import testing.fuzz  # noqa: F401  (registers the long hypothesis profile before pytest loads one)
from testing.gitutil import cli, git  # noqa: F401  (re-exported: tests import them from conftest)

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


@pytest.fixture(params=["local", "file", "daemon", "http"])
def fleet(request, tmp_path):
    """Agents sharing one lease store of each kind."""
    from testing.fleet import Fleet

    if request.param == "local":
        return Fleet(tmp_path, None)
    remote = request.getfixturevalue("remote_" + request.param)
    return Fleet(tmp_path, remote.url)
