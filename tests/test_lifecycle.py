"""One lifecycle for a held lease (gitlease/liveness/holding.py), tested where it meets the rest with real
processes: the queue runner's agents die with a killed or frozen runner (watchdog, kill-on-parent-death), a
Ctrl-C typed at a terminal reaches ``git lease work`` through git as one Ctrl-C (exit 130), a second one stops
the agents, ``lease.progressTimeout`` trips in the runner and in an MCP session as it does in ``hold()`` and
``git lease run`` (tests/test_heartbeat.py, tests/test_liveness.py), the edit guard answers from the new
state right after a release, and ``release --all`` releases every lease it can.

Real time passes only where real processes must see it (a runner's short TTL, a watchdog's deadline); every
wait is on an event (a pidfd, a pipe, a line of output) with a generous deadline, never a sleep."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import signal
import subprocess
import sys
import time

import pytest
from conftest import cli, git, read_terminal, wait_file
from test_guard import edit
from test_hooks import acquire
from test_run import wait_dead
from test_work import AGENT, FILES  # noqa: F401  (the fake agent of the queue runner's tests)

from gitlease.liveness.interrupts import WINDOW
from testing.gitutil import seed_bare
from testing.servers import make_bare

BIN = os.path.dirname(sys.executable)

# An agent for the runner that records its pid and a grandchild's (both ignoring SIGTERM: only SIGKILL stops
# them), then waits: for the file named by the task's "go" (then commits its edit), or forever.
HOLDING_AGENT = r"""
import json, os, subprocess, sys, time
task = json.load(sys.stdin)
child = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 1000"])
with open(task["pids"] + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}\n")
os.rename(task["pids"] + ".tmp", task["pids"])
import signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if task.get("progress"):
    subprocess.run(["git", "lease", "progress", task["progress"]], check=True, capture_output=True)
while not (task.get("go") and os.path.exists(task["go"])):
    time.sleep(0.05)
child.kill()
for p in task["paths"]:
    with open(p, "a") as fh:
        fh.write("edited\n")
subprocess.run(["git", "add", "-A"], check=True)
subprocess.run(["git", "commit", "-q", "--no-verify", "-m", "task " + task["id"]], check=True)
"""


@pytest.fixture
def world(tmp_path):
    bare = seed_bare(tmp_path, ["src/a/x.py", "src/b/y.py"])
    clone = tmp_path / "a"
    git(tmp_path, "clone", "-q", str(bare), str(clone))
    git(clone, "config", "lease.remote", "origin")
    agent = tmp_path / "agent.py"
    agent.write_text(HOLDING_AGENT)

    class World:
        root, remote, repo = tmp_path, bare, clone
        command = [sys.executable, str(agent)]

        def queue(self, *tasks):
            q = tmp_path / "queue.jsonl"
            q.write_text("".join(json.dumps(t) + "\n" for t in tasks))
            return q

        def lease_ids(self):
            return git(bare, "for-each-ref", "--format=%(refname)", "refs/leases/id/").split()

    return World()


def env():
    return dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])


def agent_pidfds(pids_file, proc=None):
    pid, child = wait_file(pids_file, proc)
    return [os.pidfd_open(int(pid)), os.pidfd_open(int(child))]


def start_runner(world, *args, ttl="30"):
    return subprocess.Popen(
        [os.path.join(BIN, "git-lease"), "work", *args, "--ttl", ttl, "--", *world.command],
        cwd=world.repo,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ------------------------------------------------------------------------ the runner's agents


def test_kill_9_of_the_runner_kills_its_agents_whole_process_group(world):
    """No agent outlives its runner: the watchdog sees the runner's pipe close and stops the group (SIGTERM,
    the grace, SIGKILL: the grandchild ignores SIGTERM), and the agent itself dies at once by its
    kill-on-parent-death signal. Within the lease's grace (a tenth of the 30 s TTL) and a margin."""
    pids = world.root / "pids"
    q = world.queue({"id": "k1", "paths": ["src/a/x.py"], "pids": str(pids)})
    proc = start_runner(world, str(q), "--land", "main")
    fds = agent_pidfds(pids, proc)
    killed = time.time()
    proc.kill()
    proc.communicate(timeout=30)
    dead = wait_dead(fds, timeout=30)
    assert dead - killed < 3 + 5, dead - killed  # grace 3 s (TTL 30), plus scheduling on a loaded machine


def test_a_frozen_runner_loses_its_leases_and_its_agents_are_stopped(world):
    """A runner frozen by SIGSTOP renews nothing: its agents are stopped by the watchdog at the lease's stop
    deadline, before anyone may take the lease (TTL 6: a real deadline, a few seconds)."""
    pids = world.root / "pids"
    q = world.queue({"id": "f1", "paths": ["src/a/x.py"], "pids": str(pids)})
    proc = start_runner(world, str(q), "--land", "main", ttl="6")
    fds = agent_pidfds(pids, proc)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        frozen = time.time()
        dead = wait_dead(fds, timeout=60)
        (lease,) = [r.rsplit("/", 1)[1] for r in world.lease_ids()]
        rec = json.loads(git(world.remote, "cat-file", "-p", f"refs/leases/id/{lease}:lease.json"))
        from gitlease.core.clock import parse_iso

        assert dead < parse_iso(rec["stopBy"]) + 1, (dead, rec["stopBy"])  # gone by the stop deadline
        assert dead - frozen < 30
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def test_progress_timeout_trips_in_the_runner(world):
    """lease.progressTimeout, honoured by the runner as by ``git lease run``: an agent that reported progress
    once and then goes silent loses its lease and is stopped; the attempt fails with that reason."""
    git(world.repo, "config", "lease.progressTimeout", "4")
    pids = world.root / "pids"
    q = world.queue({"id": "p1", "paths": ["src/a/x.py"], "pids": str(pids), "progress": "step 1/3"})
    res = cli(world.repo, "work", str(q), "--land", "main", "--ttl", "30", "--attempts", "1", "--json", "--",
              *world.command, timeout=120)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()[:-1]]
    failed = [e for e in events if e["event"] == "failed"]
    assert failed and "no progress reported for 4s" in failed[0]["message"], events
    assert world.lease_ids() == []


# ------------------------------------------------------------------------------ Ctrl-C through git


CTRL_C = "ctrl-c"


def as_a_shell_starts_a_job() -> None:
    """Every signal at its default and none blocked, as a shell starts a foreground job. This process may
    have inherited less: Python ignores SIGPIPE and SIGXFSZ, and a suite started in the background of a
    non-interactive shell (``make test &``, ``nohup ... &``) ignores SIGINT and SIGQUIT. A git that starts
    with SIGINT ignored installs its child-cleanup handler anyway, reaps git-lease in it after a Ctrl-C, and
    cannot die by the SIGINT it re-raises: it reports ``waitpid ... No child processes`` and exits 128
    (seen in every ``make test-stress`` round started with ``nohup ... &``)."""
    for sig in range(1, signal.NSIG):
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _on_a_terminal(world, q, steps):
    """``git lease work`` started as a user types it (through git), alone on a terminal (a pty: git and
    git-lease in its foreground process group). ``steps``: (text, action) in order: once the runner's output
    holds the text, the action runs: CTRL_C writes a ^C to the terminal (one key press), a callable is called
    with ``pump(until, seconds)``, which keeps reading the terminal while it waits (a terminal nobody reads fills
    up, and the runner's next line, its live view's redraw included, blocks: under load its agent then never
    started). Returns (the wait status's exit code, the output)."""
    argv = ["git", "lease", "work", str(q), "--land", "main", "--ttl", "30", "--", *world.command]
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own with the pty as its terminal
        os.chdir(world.repo)
        as_a_shell_starts_a_job()
        os.execvpe(argv[0], argv, env())
    out, todo, closed = b"", list(steps), False

    def pump(until=lambda: False, seconds: float = 60.0) -> None:
        """Read the terminal until ``until()`` holds or ``seconds`` pass (or the terminal closes)."""
        nonlocal out, closed
        stop = time.monotonic() + seconds
        while not closed and not until() and time.monotonic() < stop:
            chunk = read_terminal(fd, min(0.2, max(0.0, stop - time.monotonic())))
            if chunk is None:  # EOF, or EIO: the terminal's last process is gone
                closed = True
            else:
                out += chunk

    end = time.monotonic() + 120
    while not closed:
        assert time.monotonic() < end, out.decode(errors="replace")
        while todo and todo[0][0].encode() in out:
            _text, action = todo.pop(0)
            if action == CTRL_C:
                os.write(fd, b"\x03")
            else:
                action(pump)
        pump(seconds=0.2)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert not todo, (todo, out.decode(errors="replace"))
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def _ctrl_c_once(world):
    pids, go = world.root / "pids", world.root / "go"
    for f in (pids, go):
        f.unlink(missing_ok=True)
    q = world.queue(
        {"id": "c1", "paths": ["src/a/x.py"], "pids": str(pids), "go": str(go)},
        {"id": "c2", "paths": ["src/b/y.py"], "pids": str(world.root / "pids2")},
    )
    code, out = _on_a_terminal(world, q, [("running    c1", CTRL_C), ("taking no more tasks", lambda _: go.touch())])
    # git re-raises the SIGINT after its child ended: the shell's 130
    assert code in (130, -signal.SIGINT), (code, out)
    assert "taking no more tasks" in out and "stopping the running commands" not in out, out
    assert "landed c1" in out and "every lease released" in out, out
    assert world.lease_ids() == []


def test_one_ctrl_c_through_git_on_a_terminal_is_one_ctrl_c(world):
    """One ^C reaches git and git-lease, and git forwards a copy to git-lease: still one Ctrl-C. The running
    task finishes and lands, no new one starts, every lease is released, and the shell sees 130."""
    _ctrl_c_once(world)


@pytest.mark.slow
def test_one_ctrl_c_through_git_twenty_times(world):
    for _ in range(20):
        _ctrl_c_once(world)
        git(world.remote, "update-ref", "-d", "refs/leases/outcome/c1")  # the next round runs c1 again


def test_a_second_ctrl_c_through_git_stops_the_agents(world):
    pids = world.root / "pids"
    q = world.queue({"id": "s1", "paths": ["src/a/x.py"], "pids": str(pids)})
    fds = []

    def a_moment(pump):  # a person's second press comes well after the first (past the pairing window)
        pump(pids.exists)
        fds.extend(agent_pidfds(pids))
        pump(seconds=WINDOW + 0.5)

    code, out = _on_a_terminal(
        world, q, [("running    s1", CTRL_C), ("taking no more tasks", a_moment), ("taking no more tasks", CTRL_C)]
    )
    assert code in (130, -signal.SIGINT), (code, out)
    assert "stopping the running commands" in out, out
    wait_dead(fds, timeout=30)
    assert world.lease_ids() == []


# ------------------------------------------------------------------------------ the MCP session


def test_progress_timeout_trips_in_an_mcp_session(tmp_path):
    """An MCP session's lease is a Holding like any other: lease.progressTimeout applies (injected clock)."""
    from helpers import Fleet
    from test_heartbeat import GatedClock

    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo
    from gitlease.mcp.session import Session
    from gitlease.service.leases import LeaseService

    clock = GatedClock()
    where = Fleet(tmp_path, None, clock).path("a")

    def open_service(path, remote=None, **flags):
        repo = Repo.discover(path)
        settings = resolve(repo.config, env={}, agent="a", progress_timeout=30, **flags)
        return LeaseService(repo, settings, clock=clock)

    s = Session(str(where), open_service=open_service)
    got = s.acquire(["svc"], ttl=60)
    s.progress("step 1/3")  # at 0; then silent: lost at 30 - grace 6 - 0.5
    clock.wait_parked(1)
    clock.step()  # the renewal at 20 (it records the note)
    clock.wait_parked(2)
    clock.step()  # woken at the progress deadline
    holding = s.held[got["leaseId"]]
    assert holding.lost.wait(30)
    assert "no progress reported for 30s" in holding.reason
    from gitlease.core.errors import LeaseLost

    with pytest.raises(LeaseLost):
        s.progress("step 2/3")
    assert s.close() == []


# ------------------------------------------------------------------------------ local state


@pytest.fixture
def shared(tmp_path):
    """A clone of a bare remote holding ``svc`` (by the CLI), its last listing (what the guard reads) fresh."""
    bare = make_bare(tmp_path / "remote.git")
    repo = tmp_path / "a"
    git(tmp_path, "clone", "-q", str(bare), str(repo))
    git(repo, "commit", "-q", "--allow-empty", "-m", "init")
    git(repo, "push", "-q", "origin", "HEAD:main")
    git(repo, "config", "lease.remote", "origin")
    lease = json.loads(cli(repo, "acquire", "--scope", "svc", "--json").stdout)["result"]["leaseId"]
    assert cli(repo, "status").returncode == 0
    return repo, lease


def test_the_guard_answers_from_the_new_state_right_after_a_release(shared):
    repo, lease = shared
    assert cli(repo, "release", lease).returncode == 0
    res = edit(repo, "svc/x.py")  # no lease here now, and nobody else's: free (no `status` in between)
    assert (res.returncode, res.stderr) == (0, ""), res.stderr


def test_the_guard_answers_from_the_new_state_right_after_an_mcp_release(shared):
    from gitlease.mcp.session import Session

    repo, lease = shared
    s = Session(str(repo))
    assert s.release(lease)["released"]
    assert s.release(lease)["already"]  # idempotent, as the CLI's release is
    s.close()
    res = edit(repo, "svc/x.py")
    assert (res.returncode, res.stderr) == (0, ""), res.stderr


def test_the_guard_answers_from_the_new_state_right_after_extend_and_narrow(shared):
    repo, lease = shared
    assert cli(repo, "extend", lease, "--scope", "docs").returncode == 0
    assert edit(repo, "docs/x.md").returncode == 0
    assert cli(repo, "narrow", lease, "--scope", "docs").returncode == 0
    res = edit(repo, "docs/x.md")
    assert res.returncode == 2 and "docs/x.md is outside this worktree's leases" in res.stderr, res.stderr
    other = repo.parent / "b"  # another clone sees the narrowed path free once it reads the store
    git(repo.parent, "clone", "-q", str(repo.parent / "remote.git"), str(other))
    git(other, "config", "lease.remote", "origin")
    assert cli(other, "acquire", "--scope", "docs").returncode == 0


# ------------------------------------------------------------------------------ release --all


def test_release_all_releases_every_lease_it_can_and_exits_with_the_worst(make_repo):
    repo = make_repo("w")
    first, lost, last = (acquire(repo, s) for s in ("a", "b", "c"))
    git(repo, "update-ref", "-d", f"refs/leases/id/{lost}")  # taken away behind this worktree's back
    res = cli(repo, "release", "--all")
    assert res.returncode == 6, res.stdout + res.stderr
    assert f"lease released: {first}" in res.stdout and f"lease released: {last}" in res.stdout
    assert f"not released: {lost}" in res.stdout
    assert "1 of 3 leases not released (the others were)" in res.stderr
    assert git(repo, "for-each-ref", "refs/leases/id/") == ""


# ------------------------------------------------------------------------------ a renewal's own late write


def test_a_renewal_whose_push_outlived_its_timeout_and_landed_later_is_not_reported_lost(tmp_path):
    """A renewal given up on (its outcome unknown: kept pending) lands on the server only after the next
    renewal's read of the store, before that renewal's own push: the next renewal is refused, and the late
    version, ours, is adopted as the renewal instead of the lease being declared lost. The interleaving is
    forced at the store's read (a seam around a real store: every push and read is real git)."""
    from helpers import Fleet

    bare = make_bare(tmp_path / "remote.git")
    fleet = Fleet(tmp_path, bare.as_uri())
    a = fleet.agent("a")
    got = a.acquire(["svc"], ttl=60)
    late = a.prepare_renewal(got.lease_id)
    assert a.settle_renewal(late, None) is None  # its push "timed out": pending, not on the store yet
    real = a.store.list_refs
    landed = []

    def list_refs(**kw):
        refs = real(**kw)
        if not landed:  # the late push lands right after this read (the settle), before the next push
            landed.append(a.store.apply([late.update]).ok)
        return refs

    a.store.list_refs = list_refs
    renewed = a.renew(got.lease_id)
    a.store.list_refs = real
    assert landed == [True]
    assert renewed.oid == late.update.new and renewed.record.version == 2  # the late write, adopted
    assert a.held_here()[got.lease_id].current == late.update.new
    assert a.renew(got.lease_id).record.version == 3  # and the lease goes on from there


def test_the_two_copies_of_one_ctrl_c_pair_up_however_late_gits_comes(monkeypatch):
    """Started by git, each press is two SIGINTs (the terminal's, git's forwarded copy): they pair up, also when
    git's copy comes seconds late on a loaded machine; a second press counts, whenever it comes."""
    import signal as sig

    from gitlease.liveness import interrupts

    now = [100.0]
    monkeypatch.setattr(interrupts.time, "monotonic", lambda: now[0])
    it = interrupts.Interrupts(window=interrupts.WINDOW)

    def press(after: float) -> None:
        now[0] += after
        it._handler(sig.SIGINT, None)

    press(0)  # the terminal's copy
    press(1.5)  # git's, late under load (a 0.5 s dead time counted it as a second press)
    assert (it.interrupts, it.stop_now) == (1, False)
    press(0.2)  # a second press soon after: its terminal copy counts
    assert (it.interrupts, it.stop_now) == (2, True)
    press(0.01)  # and its git copy does not
    assert it.interrupts == 2
    press(30)  # a copy alone (a kill -INT of git-lease itself) long after: a press
    assert it.interrupts == 3
    alone = interrupts.Interrupts(window=0.0)  # not started by git: every SIGINT is a press
    alone._handler(sig.SIGINT, None)
    alone._handler(sig.SIGINT, None)
    assert alone.interrupts == 2
