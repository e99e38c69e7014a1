"""Every test runs real git in temporary folders, isolated from the developer's machine: HOME, git's global
and system config are replaced. Servers (file://, git daemon, smart HTTP) come from testing/servers.py, their
fixtures from servers.py; the git helper and the fleet of agents from testing/."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

import testing.fuzz  # noqa: F401  (registers the long hypothesis profile before pytest loads one)
from testing.bytecode import keep_bytecode
from testing.gitutil import cli, git, run_git  # noqa: F401  (re-exported: tests import them from conftest)

pytest_plugins = ["servers"] if os.path.exists(os.path.join(os.path.dirname(__file__), "servers.py")) else []

ROOT = Path(__file__).resolve().parent.parent

# The tests start thousands of Python processes (git-lease, the hooks, agents, runners) that import gitlease from
# this tree. A machine may set PYTHONDONTWRITEBYTECODE (this one does), and a fresh clone holds no bytecode: each
# of those processes compiled gitlease from source again, about 100 ms of CPU a `git lease` command (180 ms
# against 80). Their bytecode goes to one folder outside the tree instead, written once, shared by the workers.
keep_bytecode(os.path.join(tempfile.gettempdir(), "gitlease-test-pycache"), replace=False)


def _inherited_signal_state() -> dict[str, str]:
    """What every process this test process starts inherits across exec: the ignored and the blocked signals
    (and a signal's Python handler, reset by exec, is left out)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return {k: v.strip() for k, _, v in (line.partition(":") for line in fh) if k in ("SigIgn", "SigBlk")}
    except OSError:  # not Linux
        return {}


@pytest.fixture(autouse=True)
def signals_left_as_found():
    """A test that leaves this process ignoring or blocking a signal changes every process the later tests
    start (git run on a pseudo-terminal then misreads a Ctrl-C): such a test fails, named."""
    before = _inherited_signal_state()
    yield
    after = _inherited_signal_state()
    assert after == before, f"this test left the process's ignored/blocked signals changed: {before} -> {after}"


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


@pytest.fixture(params=["local", "file"])
def store_url(request):
    """The lease store of each of two kinds: None (the local store), or a file:// remote's URL."""
    return None if request.param == "local" else request.getfixturevalue("remote_file").url


@pytest.fixture
def origin(tmp_path, make_repo):
    """A bare remote (``origin.bare``) whose main holds one commit; ``origin(name)`` clones it, and the clone
    keeps its leases there (lease.remote=origin)."""
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    seed = make_repo("seed")
    git(seed, "push", "-q", bare.as_uri(), "HEAD:main")
    clones = iter(range(100))

    def clone(name=None):
        path = tmp_path / (name or f"clone{next(clones)}")
        git(tmp_path, "clone", "-q", "-b", "main", bare.as_uri(), str(path))
        git(path, "config", "lease.remote", "origin")
        return path

    clone.bare = bare
    return clone


@pytest.fixture
def pushing(make_repo, tmp_path):
    """A repository with gitlease's hooks whose origin (lease.remote) is a bare remote holding its main; returns
    (the repository, the bare remote)."""
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    r = make_repo("pusher")
    git(r, "remote", "add", "origin", bare.as_uri())
    git(r, "push", "-q", "origin", "HEAD:main")
    git(r, "fetch", "-q", "origin")
    git(r, "config", "lease.remote", "origin")
    assert cli(r, "install-hooks").returncode == 0
    return r, bare


def answer(fn, arg):
    """``fn(arg)``, or "refused" where it raises ValueError: two readings compared answer for answer."""
    try:
        return fn(arg)
    except ValueError:
        return "refused"


def in_threads(call, items, *, timeout: float) -> list:
    """``call(item)`` for each item, each in a thread of its own, all started, then joined (``timeout`` each);
    their results in the order they came back. An exception in any of them fails the test (all are listed)."""
    import threading

    results, errs = [], []

    def go(item):
        try:
            results.append(call(item))
        except Exception as exc:  # reported below
            errs.append(exc)

    threads = [threading.Thread(target=go, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errs, errs
    return results


def wait_file(path, proc=None, timeout: float = 60.0) -> list[str]:
    """The words of the file at ``path`` once it exists (a process under test wrote it); fails after ``timeout``
    seconds, or as soon as ``proc`` (the runner) has ended without it."""
    import select
    import time

    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the runner ended first: {proc.returncode} {proc.communicate()}")
        select.select([], [], [], 0.05)
    return path.read_text().split()


def read_terminal(fd: int, wait: float) -> bytes | None:
    """What a pty's leader ``fd`` has to read within ``wait`` seconds (b"" when nothing came), or None once the
    terminal is closed (EOF, or EIO: its last process is gone)."""
    import select

    ready, _, _ = select.select([fd], [], [], wait)
    if not ready:
        return b""
    try:
        chunk = os.read(fd, 65536)
    except OSError:  # EIO: the terminal's last writer closed it
        return None
    return chunk or None


def not_released_by_another(agents):
    """Agent a's lease on svc (``agents``: a Fleet), which agent b may not release (NotHeld). Returns (a, b, the
    grant, the store's refs before b tried)."""
    from gitlease.core import errors

    a, b = agents.agent("a"), agents.agent("b")
    got = a.acquire(["svc"])
    before = a.store.list_refs()
    with pytest.raises(errors.NotHeld):
        b.release(got.lease_id)
    return a, b, got, before


def write_hook(git_dir, script: str, name: str = "pre-receive") -> Path:
    """The hook ``name`` of the git directory ``git_dir`` (a bare repository's own): ``script``, executable."""
    hook = Path(git_dir) / "hooks" / name
    hook.write_text(script)
    hook.chmod(0o755)
    return hook
