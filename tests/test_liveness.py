"""Liveness that follows the work (issue 17): whoever renews signs exactly as the holder would; renewal proves the
holder checks in (a frozen holder tree loses its lease on time); no early rule reclaims before the holder's
recorded stop deadline (a holder cut off from the store is dead before anyone else gets its scope); a crashed
holder is reclaimed by an ordinary key on its host; progress from any command under ``git lease run``.

Real processes and real stores; fake clocks wherever no real process has to see time pass."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from conftest import git
from servers import make_bare

from gitlease.core.clock import FakeClock, parse_iso
from gitlease.identity import sshsig
from gitlease.liveness.agent import Agent
from gitlease.service.factory import open_service

TRUST = ".gitlease/allowed_signers"


class SignedHost:
    """One repository (linked worktrees) on a file:// store whose default branch trusts the workers' keys; each
    worktree signs with its worker's key (``lease.signingKey``, an absolute path in the worktree's config)."""

    def __init__(self, tmp_path: Path, workers=("w1", "w2"), admins=()):
        self.tmp = tmp_path
        self.bare = make_bare(tmp_path / "store.git")
        (tmp_path / "keys").mkdir()
        self.keys = {n: sshsig.generate_key(str(tmp_path / "keys" / n), comment=n) for n in (*workers, *admins)}
        self.main = tmp_path / "main"
        git(tmp_path, "init", "-q", str(self.main))
        lines = [f'{n} namespaces="gitlease" {self.keys[n].public_key()}' for n in workers]
        lines += [f'{n} namespaces="gitlease,gitlease-admin" {self.keys[n].public_key()}' for n in admins]
        (self.main / ".gitlease").mkdir()
        (self.main / TRUST).write_text("\n".join(lines) + "\n")
        git(self.main, "add", TRUST)
        git(self.main, "commit", "-q", "-m", "trust")
        git(self.main, "push", "-q", self.bare.as_uri(), "HEAD:refs/heads/main")
        git(self.main, "config", "lease.remote", self.bare.as_uri())
        git(self.main, "config", "extensions.worktreeConfig", "true")

    def worktree(self, name: str, key: str | None) -> str:
        """A linked worktree whose own config names ``key`` (a worker's) as its signing key (None: unsigned)."""
        wt = self.tmp / name
        git(self.main, "worktree", "add", "-q", "--detach", str(wt))
        git(wt, "config", "--worktree", "lease.agent", key or name)
        if key:
            git(wt, "config", "--worktree", "lease.signingKey", str(self.tmp / "keys" / key))
        return str(wt)

    def reader(self, clock):
        return open_service(str(self.main), clock=clock)


def _all_verified(reader, lease_id: str, versions: int) -> None:
    view, history, _ = reader.show(lease_id)
    assert view is not None and view.valid, view and view.problems
    assert [h.record.version for h in history] == list(range(versions, 0, -1))
    assert {h.verification for h in history} == {"verified"}, [(h.record.version, h.problem) for h in history]


class RemovedDir:
    """A working directory that no longer exists, for the steps of a process that started in it: ``with
    removed:`` runs a block there (fchdir to a descriptor kept open on it), and returns to ``back`` after."""

    def __init__(self, path: Path, back: Path):
        path.mkdir()
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        shutil.rmtree(path)
        self.back = back

    def __enter__(self):
        os.fchdir(self.fd)
        with pytest.raises(FileNotFoundError):
            os.getcwd()

    def __exit__(self, *exc):
        os.chdir(self.back)
        return False


def test_a_signed_lease_renewed_20_times_through_the_agent_verifies_at_every_version(tmp_path, monkeypatch):
    """The agent works in a folder that was removed (it was started there, by a holder since gone): it must still
    sign every renewal with the key the holder signs with. git cannot run in a removed working directory, so
    reading the configuration there must not silently come back empty, i.e. unsigned."""
    host = SignedHost(tmp_path)
    wt = host.worktree("a", "w1")
    clock = FakeClock(time.time())
    monkeypatch.chdir(tmp_path)
    removed = RemovedDir(tmp_path / "agent-start", tmp_path)
    holder = open_service(wt, clock=clock)
    got = holder.acquire(["svc"], ttl=60, renew_every=20, holder_pid=os.getpid())
    with removed:
        agent = Agent(lambda repo, remote: open_service(repo, remote=remote, clock=clock), clock=clock)
        agent.register(wt, got.lease_id, os.getpid(), remote=holder.settings.remote)  # as a holder registers
    reader = host.reader(clock)
    for n in range(2, 22):
        clock.advance(20)
        with removed:
            agent.status(got.lease_id)  # the holder checks in (its heartbeat's poll)
            agent.tick()
            reg = agent.status(got.lease_id)
        assert reg.state == "held" and reg.version == n, reg.error
        view = reader.snapshot(use_cache=False).find(got.lease_id)
        assert view.valid and view.verification == "verified" and view.record.version == n, view.problems
    _all_verified(reader, got.lease_id, 21)
    assert holder.held_here()[got.lease_id].version == 21  # the holder's own state moved with the agent


def test_a_signed_hold_renewed_by_a_real_agent_started_in_a_removed_folder(tmp_path, agent_socket):
    """End to end: an agent process started from a folder that is then removed renews a signed hold() (each
    renewal made by the agent's push, none by the holder), and every version verifies."""
    import subprocess
    import sys

    import gitlease
    from gitlease.liveness.agent import AgentClient

    host = SignedHost(tmp_path)
    wt = host.worktree("a", "w1")
    start = tmp_path / "agent-start"
    start.mkdir()
    agent = subprocess.Popen(
        [sys.executable, "-m", "gitlease.liveness.agent", "--socket", agent_socket, "--idle", "30"],
        cwd=start,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        shutil.rmtree(start)
        client = AgentClient(agent_socket, timeout=20)
        ready = threading.Event()
        while not client.available() and agent.poll() is None and not ready.wait(0.05):
            pass
        with gitlease.hold(wt, scope=["svc"], ttl=6, renew_every=1, grace=1) as lease:
            assert lease.agent is not None
            wait = threading.Event()
            deadline = time.monotonic() + 30
            while (_record(host.bare, lease.lease_id) or {}).get("version", 0) < 4 and time.monotonic() < deadline:
                wait.wait(0.1)
            lease.check()
            assert lease.agent.self_renewals == 0 and not lease.agent.fallen
            version = _record(host.bare, lease.lease_id)["version"]
            assert version >= 4
            _all_verified(host.reader(FakeClock(time.time())), lease.lease_id, version)
    finally:
        client.request("stop")
        agent.wait(30)


def test_the_agent_drops_what_it_knew_of_a_repository_removed_and_made_again(tmp_path):
    """The fleet trial: a worktree served unsigned, removed, made again at the same path signed (git lease init);
    the agent must renew the new holder's lease with the new configuration, never from its cached service."""
    host = SignedHost(tmp_path)
    clock = FakeClock(time.time())
    agent = Agent(lambda repo, remote: open_service(repo, remote=remote, clock=clock), clock=clock)
    old = host.worktree("a", None)  # unsigned at first (a local trial before signing was set up)
    git(old, "config", "--worktree", "lease.allowedSignersFile", str(tmp_path / "no-trust"))
    first = open_service(old, clock=clock).acquire(["old"], ttl=60, renew_every=20)
    agent.register(old, first.lease_id, 0)
    clock.advance(20)
    agent.tick()
    assert agent.status(first.lease_id).version == 2
    agent.unregister(first.lease_id)
    git(host.main, "worktree", "remove", "--force", old)
    git(host.main, "worktree", "prune")
    wt = host.worktree("a", "w2")  # the same path, signed now
    assert wt == old
    got = open_service(wt, clock=clock).acquire(["svc"], ttl=60, renew_every=20)
    agent.register(wt, got.lease_id, 0)
    for _ in range(3):
        clock.advance(20)
        agent.status(got.lease_id)  # the holder's check-in
        agent.tick()
    assert agent.status(got.lease_id).state == "held" and agent.status(got.lease_id).version == 4
    _all_verified(host.reader(clock), got.lease_id, 4)


def test_the_agent_never_pushes_a_version_the_owner_key_did_not_sign(tmp_path):
    """A holder registering a signed lease with an agent that cannot sign with its key: refused (the holder renews
    by itself), and a renewal that would not be signed by the owner key is never pushed."""
    from gitlease.core import errors
    from gitlease.identity.signer import UNSIGNED
    from gitlease.liveness.agent import AgentRefused

    host = SignedHost(tmp_path)
    clock = FakeClock(time.time())
    wt = host.worktree("a", "w1")
    holder = open_service(wt, clock=clock)
    got = holder.acquire(["svc"], ttl=60, renew_every=20)
    unsigned = open_service(wt, clock=clock, signer=UNSIGNED)
    agent = Agent(lambda repo, remote: unsigned, clock=clock)
    with pytest.raises(AgentRefused):
        agent.register(wt, got.lease_id, 0, who={"key": holder.signer.public_key})
    with pytest.raises(errors.Forbidden):  # the one renewal path: never a version without the owner's signature
        unsigned.prepare_renewal(got.lease_id)
    before = json.loads(git(host.bare, "cat-file", "blob", f"refs/leases/id/{got.lease_id}:lease.json"))
    assert before["version"] == 1


# ------------------------------------------------------------------ reclaim never precedes the holder's stop


def _pidfds_dead(fds) -> bool:
    """Whether every process is gone right now (a pidfd is readable once its process exited)."""
    import select

    ready, _, _ = select.select(list(fds), [], [], 0)
    return len(ready) == len(fds)


def _record(bare, lease_id):
    data = git(bare, "cat-file", "blob", f"refs/leases/id/{lease_id}:lease.json", check=False)
    return json.loads(data) if data else None


def test_a_run_holder_cut_off_from_the_store_is_dead_before_anyone_else_gets_its_scope(tmp_path, remote_file):
    """Issue 17, item 4: a `git lease run` holder loses contact with the store (its remote hangs). Another agent
    sweeps (missed heartbeats, dead holder, stalled) and acquires as fast as it can, on the real clock with a
    1 s skew margin: when it is granted the scope, the holder's command (a shell and a grandchild, both
    ignoring SIGTERM) must already be dead."""
    from servers import HangingServer
    from test_run import FAST, WORKER, agent_repo, start_run, started

    from gitlease.core.config import resolve
    from gitlease.core.errors import HeldError
    from gitlease.core.repo import Repo
    from gitlease.ops.sweep import Sweeper
    from gitlease.service.leases import LeaseService

    work = agent_repo(tmp_path, remote_file.url)
    other = agent_repo(tmp_path, remote_file.url, "b")
    repo = Repo.discover(other)
    b = LeaseService(repo, resolve(repo.config, env={}, agent="b", skew=1, timeout=20))
    with HangingServer() as hang:
        proc = start_run(work, "--scope", "svc", *FAST, "--", "sh", "-c", WORKER)
        lease, fds = started(proc)
        git(work, "remote", "set-url", "origin", hang.url)  # from now on every renewal hangs
        granted, reasons = None, []
        deadline = time.monotonic() + 60
        while granted is None and time.monotonic() < deadline:
            reasons += [r.line() for r in Sweeper(b).sweep().results]
            try:
                granted = b.acquire(["svc"], ttl=60)
            except HeldError:
                threading.Event().wait(0.1)
        assert granted is not None, reasons
        dead = _pidfds_dead(fds)
        out, err = proc.communicate(timeout=60)
    for fd in fds:
        os.close(fd)
    assert dead, f"another agent was granted {lease}'s scope while its command ran: {reasons}"
    assert proc.returncode == 6, err


def _trusted_worktree(host: SignedHost, name: str, key: str) -> Path:
    wt = Path(host.worktree(name, key))
    git(wt, "config", "--worktree", "lease.agent", key)
    return wt


def test_a_crashed_signed_holder_is_reclaimed_by_an_ordinary_key_on_its_host(tmp_path):
    """Issue 17, item 3: `kill -9` of a `git lease run` holder on a signed store (the default `git lease init`:
    no admin key among the workers). Another worker on the same host, with its ordinary trusted key, reclaims
    the lease by the dead-holder rule once the holder's stop deadline plus the skew has passed, long before its
    expiry; the reclaim is audited, signed, and verifies for every reader. A sweeper on another host still
    needs an admin key for an early rule."""
    import signal

    from test_run import WORKER, start_run, started, wait_dead

    from gitlease.core.record import canonical
    from gitlease.identity.trust import check_audit_entry
    from gitlease.ops.sweep import Sweeper, history
    from gitlease.service.audit import read_log

    host = SignedHost(tmp_path)
    holder = _trusted_worktree(host, "a", "w1")
    sweeper_wt = _trusted_worktree(host, "b", "w2")
    proc = start_run(holder, "--scope", "svc", "--ttl", "60", "--renew-every", "5", "--", "sh", "-c", WORKER)
    lease, fds = started(proc)
    os.kill(proc.pid, signal.SIGKILL)  # the holder (the run supervisor, the pid its lease records) crashes
    proc.communicate()
    wait_dead(fds)  # its watchdog stops the command's group at once
    rec = _record(host.bare, lease)
    assert rec["owner"]["pid"] == proc.pid and rec["owner"]["key"]
    stop = parse_iso(rec.get("stopBy") or rec["expiresAt"])
    expires = parse_iso(rec["expiresAt"])
    clock = FakeClock(stop + 30 - 1)  # the default skew: 30 s
    w2 = open_service(str(sweeper_wt), clock=clock)
    assert Sweeper(w2).sweep().results == []  # before the stop deadline + skew: nothing, not even refused
    clock.advance(2)
    assert clock.now() < expires + 30  # the expiry rule would still wait
    elsewhere = Sweeper(open_service(str(sweeper_wt), clock=FakeClock(clock.now())), host="elsewhere")
    (far,) = elsewhere.sweep().results  # a sweeper on another host: only missed heartbeats, and no admin key
    assert far.outcome == "forbidden" and far.rule == "missed-heartbeats", far.line()
    got = Sweeper(w2).sweep()
    assert [(r.lease_id, r.rule, r.outcome) for r in got.results] == [(lease, "dead-holder", "reclaimed")]
    events = [e for e in history(w2) if e.event == "reclaim" and e.lease_id == lease]  # git lease log
    assert len(events) == 1 and events[0].signed and events[0].problem is None and events[0].by == "w2"
    assert w2.acquire(["svc"]).lease_id
    reader = host.reader(FakeClock(clock.now()))
    trust = reader.trust()
    (entry,) = [
        e
        for e in read_log(reader.store, verify=lambda data, sig, doc: check_audit_entry(trust, doc, data, sig))
        if e.lease_id == lease
    ]
    assert entry.problem is None and entry.doc["by"] == "w2" and entry.doc["rule"] == "dead-holder"
    assert entry.doc["host"] == entry.doc["owner"]["host"] == os.uname().nodename
    forged = dict(entry.doc, host="another-host")  # the same claim made from another host: an admin's only
    data = canonical(forged)
    problem = check_audit_entry(trust, forged, data, sshsig.sign(host.keys["w2"], data, "gitlease").encode())
    assert problem and "gitlease-admin" in problem


# ------------------------------------------------------------------ renewal proves the holder is alive


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    fields = fh.read().decode("ascii", "replace").rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def test_a_frozen_holder_tree_loses_its_lease_on_time_and_its_command_never_writes_again(tmp_path, remote_file):
    """Issue 17, item 1: the whole holder tree of `git lease run` (supervisor, watchdog, command) is SIGSTOPped
    past its TTL, while the per-host renewal agent runs on. The agent must stop renewing a holder that no longer
    checks in: another agent gets the scope once the lease expired (plus its 1 s skew). On SIGCONT the stale
    command, about to write, is stopped first: its `git lease progress` (what it calls before each write) exits
    6 because the lease's stop deadline has passed, and the run exits 6."""
    import signal
    import subprocess

    from test_run import FAST, GIT_LEASE, agent_repo, spawn, wait_dead

    from gitlease.core.config import resolve
    from gitlease.core.errors import HeldError
    from gitlease.core.repo import Repo
    from gitlease.liveness.agent import AgentClient
    from gitlease.service.leases import LeaseService

    work = agent_repo(tmp_path, remote_file.url)
    out = tmp_path / "written"
    command = (
        'echo "$GITLEASE_LEASE $$"; read go; git lease progress "writing" || exit 6; '
        f'echo late > "{out}"; exec sleep 1000'
    )
    proc = spawn([GIT_LEASE, "run", "--scope", "svc", *FAST, "--", "sh", "-c", command], work, stdin=subprocess.PIPE)
    lease, cmd_pid = proc.stdout.readline().split()
    cmd_fd = os.pidfd_open(int(cmd_pid))
    client = AgentClient()
    assert client.request("status", lease=lease)["state"] == "held"  # renewed by the agent (this poll: no check-in)
    (watchdog,) = [p for p in _children(proc.pid) if "gitlease.liveness.watchdog" in _cmdline(p)]
    tree = [proc.pid, watchdog]
    for pid in tree:
        os.kill(pid, signal.SIGSTOP)
    os.killpg(int(cmd_pid), signal.SIGSTOP)
    repo = Repo.discover(agent_repo(tmp_path, remote_file.url, "b"))
    b = LeaseService(repo, resolve(repo.config, env={}, agent="b", skew=1, timeout=20))
    try:
        granted, last = None, None
        give_up = time.monotonic() + 40
        while granted is None and time.monotonic() < give_up:
            last = _record(remote_file.path, lease) or last
            try:
                granted = b.acquire(["svc"], ttl=60)
            except HeldError:
                threading.Event().wait(0.2)
        assert granted is not None and granted.cleared == (lease,), (
            f"the frozen holder's lease was still renewed: {last}"
        )
        assert time.time() > parse_iso(last["expiresAt"]) + 1  # taken only once expired beyond the skew
        assert client.request("status", lease=lease)["state"] in ("dropped", "unknown")  # not renewed any more
        proc.stdin.write("go\n")  # the command's next step: write
        proc.stdin.flush()
    finally:
        os.killpg(int(cmd_pid), signal.SIGCONT)  # the command first: it runs before its supervisor can act
        for pid in tree:
            os.kill(pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    wait_dead([cmd_fd])
    assert proc.returncode == 6, err
    assert not out.exists(), "the stale command wrote after its lease was taken"


def test_the_agent_renews_only_holders_that_check_in(tmp_path):
    """The agent's side of a frozen, stopped or hung holder (hold() or run alike: their heartbeats poll the agent
    every renewal interval): while it checks in, the lease is renewed; once it stops, at most one more interval,
    then no renewal, and the registration ends at the lease's stop deadline. A poll from another process (a
    status query) is not the holder checking in."""
    clock = FakeClock(time.time())
    bare = make_bare(tmp_path / "store.git")
    wt = tmp_path / "a"
    git(tmp_path, "init", "-q", str(wt))
    git(wt, "config", "lease.remote", bare.as_uri())
    svc = open_service(str(wt), clock=clock)
    agent = Agent(lambda repo, remote: svc, clock=clock, alive=lambda pid, start: True)
    got = svc.acquire(["svc"], ttl=60, renew_every=20, stop_after=40, holder_pid=os.getpid())
    agent.register(str(wt), got.lease_id, os.getpid(), every=20, stop_after=40)
    for v in (2, 3):
        clock.advance(20)
        agent.status(got.lease_id, peer=os.getpid())  # the holder's poll
        agent.tick()
        assert agent.status(got.lease_id, peer=1).version == v
    clock.advance(20)  # the holder froze right after its last poll: 20 s silent, within 20 + 5
    agent.tick()
    assert agent.status(got.lease_id, peer=1).version == 4
    clock.advance(20)  # 40 s silent: not renewed
    agent.status(got.lease_id, peer=1)  # someone else asking is no check-in
    agent.tick()
    reg = agent.status(got.lease_id, peer=1)
    assert reg.state == "held" and reg.version == 4 and "not checked in" in reg.error
    clock.advance(20)  # past the stop deadline of v4 (renewed at 60 s, stopBy 100 s)
    agent.tick()
    assert agent.status(got.lease_id, peer=1).state == "dropped"
    assert _record(bare, got.lease_id)["version"] == 4


def test_the_agent_exits_once_it_renews_nothing(tmp_path, agent_socket):
    """Issue 17, item 6: a registration whose holder died is dropped, and then forgotten; with nothing left to
    renew the agent stops after its idle time (a stale registration used to keep it alive)."""
    import subprocess
    import sys

    from gitlease.liveness.agent import AgentClient

    bare = make_bare(tmp_path / "store.git")
    wt = tmp_path / "a"
    git(tmp_path, "init", "-q", str(wt))
    git(wt, "config", "lease.remote", bare.as_uri())
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    lid = open_service(str(wt)).acquire(["svc"], ttl=300, holder_pid=holder.pid).lease_id
    client = AgentClient(agent_socket, timeout=20)
    assert client.ensure_running(idle=1)
    agent_fd = os.pidfd_open(client.request("ping")["pid"])
    ans = client.request("register", repo=str(wt), lease=lid, pid=holder.pid, remote=bare.as_uri())
    assert ans["ok"] and ans["state"] == "held"
    holder.communicate(b"")  # the holder exits without unregistering
    import select

    assert select.select([agent_fd], [], [], 30)[0], "the agent kept running with only a dead holder's lease"
    os.close(agent_fd)
    # and in-process, on a fake clock: dropped at the next round, forgotten at the one after
    clock = FakeClock(time.time())
    agent = Agent(lambda repo, remote: open_service(repo, remote=remote, clock=clock), clock=clock, idle=60)
    agent.register(str(wt), lid, holder.pid, bare.as_uri())
    assert agent.idle_for() == 0
    agent.tick()
    assert agent.status(lid).state == "dropped"
    clock.advance(60)
    assert agent.idle_for() >= 60
    agent.tick()
    assert agent.status(lid) is None and agent.regs == {}


# ------------------------------------------------------------------------------ progress from any command


def test_progress_from_a_run_command_is_recorded_and_silence_stops_it(tmp_path, remote_file):
    """Issue 17, item 5: `git lease progress` inside `git lease run` reaches the run's lease (from the
    environment) and is recorded with the next renewal (here through the renewal agent); with
    lease.progressTimeout, a command that reported once and then goes silent loses its lease and is stopped
    (exit 6) by its own supervisor."""
    import subprocess

    from test_run import agent_repo, env, spawn, wait_dead

    work = agent_repo(tmp_path, remote_file.url)
    run = ["git", "lease", "run", "--renew-every", "1", "--grace", "1"]
    command = 'git lease progress "tests 40/120" >/dev/null || exit 9; echo "reported $GITLEASE_LEASE $$"; '
    proc = spawn(
        [*run, "--scope", "svc", "--ttl", "30", "--", "sh", "-c", command + "read go"], work, stdin=subprocess.PIPE
    )
    word, lease, _pid = proc.stdout.readline().split()
    assert word == "reported"
    recorded, give_up = None, time.monotonic() + 60
    while recorded is None and time.monotonic() < give_up:  # the agent's next round renews it with the note
        recorded = ((_record(remote_file.path, lease) or {}).get("progress") or {}).get("note")
        threading.Event().wait(0.1)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    _, err = proc.communicate(timeout=60)
    assert recorded == "tests 40/120" and proc.returncode == 0, err
    git(work, "config", "lease.progressTimeout", "6")  # now a command that goes silent after reporting once
    silent = command + 'trap "" TERM; exec sleep 1000'
    proc = spawn([*run, "--no-renew-agent", "--scope", "svc", "--ttl", "30", "--", "sh", "-c", silent], work)
    word, lease, pid = proc.stdout.readline().split()
    fd = os.pidfd_open(int(pid))
    wait_dead([fd])  # silent since: stopped once the timeout (6 s) ran out
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 6 and "no progress reported for 6s" in err, err
    res = subprocess.run(
        ["git", "lease", "acquire", "--scope", "svc", "--json"], cwd=work, capture_output=True, text=True, env=env()
    )
    held = json.loads(res.stdout)["result"]["leaseId"]  # the lost lease was released: the scope is free
    res = subprocess.run(
        ["git", "lease", "progress", "tests 41/120", "--json"], cwd=work, capture_output=True, text=True, env=env()
    )
    assert res.returncode == 0, res.stderr  # outside a run: a renewal carrying the note, now
    assert _record(remote_file.path, held)["progress"]["counter"] == 41
