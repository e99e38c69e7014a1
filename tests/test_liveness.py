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
