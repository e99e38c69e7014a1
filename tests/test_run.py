"""``git lease run`` and ``git lease push`` as real processes: a lost lease stops the whole process group
(grandchildren that ignore SIGTERM included) before the lease's expiry, when the remote dies, hangs, or the
supervisor itself is SIGKILLed or frozen; a holder taken over while SIGSTOPped cannot land its branch with
``git lease push`` (and can with plain ``git push``: the hazard); ``acquire --wait`` from the CLI.

Real time is used only where a real process must see it pass (a 6 s TTL renewed every second); tests wait on
events (pidfd readiness, pipes, process exit), never sleep."""

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest
from conftest import cli, git
from servers import GitDaemon, HangingServer

from gitlease.core.clock import FakeClock, parse_iso
from gitlease.core.config import resolve
from gitlease.core.repo import Repo
from gitlease.service.leases import LeaseService

BIN = os.path.dirname(sys.executable)
GIT_LEASE = os.path.join(BIN, "git-lease")
# The command under the lease: a shell and a grandchild, both ignoring SIGTERM (only SIGKILL stops them).
WORKER = "trap '' TERM; (trap '' TERM; exec sleep 1000) & echo \"$GITLEASE_LEASE $$ $!\"; wait"
FAST = ["--ttl", "6", "--renew-every", "1", "--grace", "1"]


def env():
    e = dict(os.environ)
    e["PATH"] = BIN + os.pathsep + e.get("PATH", "")
    return e


def agent_repo(base, url, name="a"):
    path = base / name
    git(base, "init", "-q", str(path))
    git(path, "commit", "-q", "--allow-empty", "-m", "init")
    git(path, "remote", "add", "origin", url)
    git(path, "config", "lease.remote", "origin")
    git(path, "config", "lease.agent", name)
    return path


def spawn(argv, cwd, *, stdin=None):
    """``argv`` started in ``cwd``, this venv's git-lease first on PATH, its output read as text from pipes
    (``stdin``: subprocess.PIPE to write to it)."""
    return subprocess.Popen(
        argv, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )


def start_run(cwd, *args):
    return spawn([GIT_LEASE, "run", *args], cwd)


def started(proc):
    """The worker's first line: lease id, its pid, its grandchild's pid; with a pidfd for each process."""
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    lease, pid, gpid = line.split()
    return lease, [os.pidfd_open(int(pid)), os.pidfd_open(int(gpid))]


def wait_dead(pidfds, timeout=30.0):
    """Block until every process is gone (a pidfd turns readable when its process exits); the wall time."""
    pending = list(pidfds)
    end = time.monotonic() + timeout
    while pending:
        ready, _, _ = select.select(pending, [], [], max(0.0, end - time.monotonic()))
        assert ready, (
            "a process of the command's group outlived the test's patience: "
            + subprocess.run(["ps", "-eo", "pid,ppid,pgid,sid,stat,args"], capture_output=True, text=True).stdout
        )
        pending = [fd for fd in pending if fd not in ready]
    dead_at = time.time()
    for fd in pidfds:
        os.close(fd)
    return dead_at


def remote_expiry(bare, lease):
    """Expiry of the lease's newest version on the remote itself (ground truth, read from disk)."""
    data = git(bare, "cat-file", "blob", f"refs/leases/id/{lease}:lease.json", check=False)
    return parse_iso(json.loads(data)["expiresAt"]) if data else None


def other_agent(base, url, clock=None, name="b"):
    path = agent_repo(base, url, name)
    repo = Repo.discover(path)
    return LeaseService(
        repo, resolve(repo.config, env={}, agent=name, timeout=20), clock=clock or FakeClock(time.time())
    )


@pytest.fixture
def daemon(tmp_path):
    d = GitDaemon(tmp_path / "daemon").start()
    yield d
    d.stop()


# ------------------------------------------------------------------ losing the lease


def test_remote_dies_group_dead_before_expiry(tmp_path, daemon):
    bare = daemon.make_bare("r.git")
    work = agent_repo(tmp_path, daemon.url_for("r.git"))
    proc = start_run(work, "--scope", "svc", *FAST, "--", "sh", "-c", WORKER)
    lease, fds = started(proc)
    daemon.kill()
    dead_at = wait_dead(fds)
    assert dead_at < remote_expiry(bare, lease)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 6, err
    assert "lease lost" in err and "stopping the command" in err


def test_remote_hangs_group_dead_before_expiry(tmp_path, daemon):
    bare = daemon.make_bare("r.git")
    work = agent_repo(tmp_path, daemon.url_for("r.git"))
    with HangingServer() as hang:
        proc = start_run(work, "--scope", "svc", *FAST, "--", "sh", "-c", WORKER)
        lease, fds = started(proc)
        git(work, "remote", "set-url", "origin", hang.url)  # from now on every git call to it hangs
        dead_at = wait_dead(fds)
        assert dead_at < remote_expiry(bare, lease)
        out, err = proc.communicate(timeout=30)
        assert hang.connections >= 1
    assert proc.returncode == 6, err
    assert "no renewal confirmed before the stop deadline" in err


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(5))
@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_lost_remote_group_dead_before_expiry_every_time(tmp_path, daemon, how, round_):
    if how == "dies":
        test_remote_dies_group_dead_before_expiry(tmp_path, daemon)
    else:
        test_remote_hangs_group_dead_before_expiry(tmp_path, daemon)


def test_supervisor_sigkilled_group_dies_and_lease_is_reclaimable(tmp_path, daemon):
    url = daemon.url_for("r.git")
    bare = daemon.make_bare("r.git")
    work = agent_repo(tmp_path, url)
    # the self-renewing path (with the agent, a renewal in flight when the supervisor dies may still land)
    proc = start_run(work, "--scope", "svc", *FAST, "--no-renew-agent", "--", "sh", "-c", WORKER)
    lease, fds = started(proc)
    proc.kill()  # SIGKILL the supervisor: PDEATHSIG kills its child, the watchdog the rest of the group
    proc.communicate()
    dead_at = wait_dead(fds)
    expires = remote_expiry(bare, lease)
    assert dead_at < expires
    b_now = other_agent(tmp_path, url, FakeClock(time.time()), "b")
    with pytest.raises(Exception) as err:  # still held until it expires: fail closed
        b_now.acquire(["svc"])
    assert lease in str(err.value)
    b_later = other_agent(tmp_path, url, FakeClock(expires + 31), "c")  # past expiry and the skew margin
    got = b_later.acquire(["svc"])
    assert got.cleared == (lease,)


def test_supervisor_frozen_watchdog_stops_group_before_expiry(tmp_path, daemon):
    bare = daemon.make_bare("r.git")
    work = agent_repo(tmp_path, daemon.url_for("r.git"))
    proc = start_run(work, "--scope", "svc", *FAST, "--", "sh", "-c", WORKER)
    lease, fds = started(proc)
    os.kill(proc.pid, signal.SIGSTOP)  # the supervisor can renew nothing and stop nothing
    try:
        dead_at = wait_dead(fds)
        assert dead_at < remote_expiry(bare, lease)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 6, err


# --------------------------------------------------------------------- normal runs


def test_run_exits_with_the_command_code_and_releases(tmp_path, remote_file):
    work = agent_repo(tmp_path, remote_file.url)
    res = cli(work, "run", "--scope", "svc", "--", "sh", "-c", "git lease status; exit 7")
    assert res.returncode == 7, res.stderr
    assert "svc" in res.stdout and "lease released" in res.stderr
    assert git(remote_file.path, "for-each-ref", "refs/leases/") == ""


def test_run_with_a_held_lease_keeps_it(tmp_path, remote_file):
    work = agent_repo(tmp_path, remote_file.url)
    res = cli(work, "acquire", "--scope", "svc", "--json")
    lease = json.loads(res.stdout)["result"]["leaseId"]
    res = cli(work, "run", "--lease", lease, "--json", "--", "true")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["result"]["released"] is False
    assert lease in cli(work, "status").stdout


def test_run_refuses_timings_that_do_not_fit(tmp_path, remote_file):
    work = agent_repo(tmp_path, remote_file.url)
    res = cli(work, "run", "--scope", "svc", "--ttl", "60", "--renew-every", "55", "--", "true")
    assert res.returncode == 2 and "timings do not fit the TTL" in res.stderr
    assert git(remote_file.path, "for-each-ref", "refs/leases/") == ""  # refused before acquiring


def test_sigterm_is_forwarded_to_the_group(tmp_path, remote_file):
    work = agent_repo(tmp_path, remote_file.url)
    script = "trap 'echo got-term; exit 143' TERM; echo ready; sleep 1000 & wait"
    proc = start_run(work, "--scope", "svc", "--", "sh", "-c", script)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert "got-term" in out and proc.returncode == 143, err
    assert git(remote_file.path, "for-each-ref", "refs/leases/") == ""


# ------------------------------------------------------------------- fenced pushes


def _frozen_holder_then_takeover(tmp_path, remote_file, push_cmd):
    """A acquires, commits on feature, and its pusher is SIGSTOPped; B (whose clock is past A's TTL) takes the
    scope; A resumes and pushes. Returns (push result, A's commit)."""
    url = remote_file.url
    work = agent_repo(tmp_path, url)
    git(work, "push", "-q", "origin", "HEAD:refs/heads/main")
    res = cli(work, "acquire", "--scope", "svc", "--ttl", "60", "--json")
    expires = parse_iso(json.loads(res.stdout)["result"]["expiresAt"])
    git(work, "checkout", "-q", "-b", "feature")
    (work / "svc.txt").write_text("A's change\n")
    git(work, "add", "svc.txt")
    git(work, "commit", "-q", "-m", "A's work")
    head = git(work, "rev-parse", "HEAD").strip()
    pusher = spawn(["sh", "-c", f"read go; exec {push_cmd}"], work, stdin=subprocess.PIPE)
    pusher.send_signal(signal.SIGSTOP)
    b = other_agent(tmp_path, url, FakeClock(expires + 31))  # A's lease expired, beyond the skew margin
    got = b.acquire(["svc"])
    assert got.cleared
    pusher.send_signal(signal.SIGCONT)
    out, err = pusher.communicate("go\n", timeout=60)
    return pusher.returncode, err, head


def test_taken_over_holder_cannot_land_its_branch_with_git_lease_push(tmp_path, remote_file):
    code, err, head = _frozen_holder_then_takeover(tmp_path, remote_file, "git lease push origin feature")
    assert code == 6 and "lease lost or replaced" in err
    assert git(remote_file.path, "for-each-ref", "refs/heads/feature") == ""
    assert subprocess.run(["git", "cat-file", "-e", head], cwd=remote_file.path).returncode != 0


def test_control_plain_git_push_lands_the_stale_holders_branch(tmp_path, remote_file):
    code, err, head = _frozen_holder_then_takeover(tmp_path, remote_file, "git push -q origin feature")
    assert code == 0, err
    assert git(remote_file.path, "rev-parse", "refs/heads/feature").strip() == head  # the hazard


def test_git_lease_push_cli(tmp_path, remote_file):
    work = agent_repo(tmp_path, remote_file.url)
    cli(work, "acquire", "--scope", "svc")
    git(work, "commit", "-q", "--allow-empty", "-m", "work")
    res = cli(work, "push", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)["result"]
    assert doc["refspec"] == "refs/heads/main:refs/heads/main" and doc["version"] == 2
    assert git(remote_file.path, "rev-parse", "main") == git(work, "rev-parse", "main")
    local = tmp_path / "local"
    git(tmp_path, "init", "-q", str(local))
    git(local, "commit", "-q", "--allow-empty", "-m", "x")
    cli(local, "acquire", "--scope", "svc")
    res = cli(local, "push", "origin", "main")
    assert res.returncode == 2 and "this repository's own refs" in res.stderr


# ----------------------------------------------------------------------- acquire --wait


def test_acquire_wait_cli_wakes_on_release_and_gives_up(tmp_path, remote_file):
    a = agent_repo(tmp_path, remote_file.url, "a")
    b = agent_repo(tmp_path, remote_file.url, "b")
    lease = json.loads(cli(a, "acquire", "--scope", "svc", "--json").stdout)["result"]["leaseId"]
    res = cli(b, "acquire", "--scope", "svc/x", "--wait", "1s")
    assert res.returncode == 3 and "gave up after waiting 1s" in res.stderr and lease in res.stderr
    waiter = spawn(["git", "lease", "acquire", "--scope", "svc/x", "--wait", "60s"], b)
    assert "waiting" in waiter.stderr.readline()  # refused once, now backing off
    assert cli(a, "release", lease).returncode == 0
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and "lease acquired" in out, err


@pytest.mark.parametrize("session", [True, False])
def test_a_ctrl_c_as_a_guarded_command_starts_neither_kills_its_gate_nor_stays_with_it(session):
    """A Ctrl-C typed while a guarded command is being started reaches its child between fork and setsid (or
    setpgid), still in the runner's group. It killed the gate, and the worker's write to the gate failed with
    EPIPE (test_lifecycle's one-Ctrl-C test, one run in many). Here the signal is sent to the child at once,
    every time: the gate holds it blocked (``popen_shielded``), drops it, and the command runs with the
    terminal's signals neither blocked nor ignored."""
    from gitlease.liveness import supervise

    gate_r, gate_w = os.pipe()
    # the command says its own masks (Python: a shell may reset its signal mask at start)
    script = "print(''.join(ln for ln in open('/proc/self/status') if ln.startswith(('SigBlk', 'SigIgn'))))"
    proc = supervise.popen_shielded(
        [sys.executable, "-S", "-c", supervise.GATE, str(os.getpid()), str(gate_r), sys.executable, "-S", "-c", script],
        pass_fds=(gate_r,),
        stdout=subprocess.PIPE,
        start_new_session=session,
        process_group=None if session else 0,
    )
    os.close(gate_r)
    os.kill(proc.pid, signal.SIGINT)  # as the terminal would, in the moment it still shared the runner's group
    os.write(gate_w, b"g")
    os.close(gate_w)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    masks = dict(line.split(":\t") for line in out.decode().splitlines() if line)
    for sig in supervise.SHIELDED:
        bit = 1 << (sig - 1)
        assert not int(masks["SigBlk"], 16) & bit and not int(masks["SigIgn"], 16) & bit, (sig, masks)
