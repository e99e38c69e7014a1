"""hold() and git lease run through the renewal agent (issue 11): renewed by the agent's push, not their own;
falling back to renewing by themselves when the agent is SIGKILLed; stopped when the agent reports the lease
lost; a dead holder's lease is dropped; due renewals ride in an acquire's or a release's push. Pushes are
counted at the server (its reference-transaction log: one receive-pack pid per push). Fake clocks and events,
no sleeps."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import cli, git
from servers import make_bare
from test_agent import checkin
from test_heartbeat import GatedClock

import gitlease
from gitlease.core import errors
from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.refnames import id_ref
from gitlease.core.repo import Repo
from gitlease.liveness.agent import Agent, AgentClient, serve
from gitlease.service.leases import LeaseService
from soak import serverlog  # noqa: E402


class Host:
    """One repository with linked worktrees leasing on one file:// remote whose pushes are counted."""

    def __init__(self, tmp_path, clock):
        self.bare = make_bare(tmp_path / "store.git")
        serverlog.install(self.bare)
        self.main = tmp_path / "main"
        git(tmp_path, "init", "-q", str(self.main))
        git(self.main, "commit", "-q", "--allow-empty", "-m", "init")
        git(self.main, "config", "lease.remote", self.bare.as_uri())
        self.tmp, self.clock = tmp_path, clock
        self.services = {}

    def path(self, name):
        wt = self.tmp / name
        if not wt.exists():
            git(self.main, "worktree", "add", "-q", "--detach", str(wt))
        return str(wt)

    def service(self, repo, remote=None):
        """The service of a worktree (the agent's open_service too: one per worktree, shared clock)."""
        repo = str(Repo.discover(repo).cwd)
        if repo not in self.services:
            r = Repo.discover(repo)
            self.services[repo] = LeaseService(
                r, resolve(r.config, env={}, agent=os.path.basename(repo), timeout=20), clock=self.clock
            )
        return self.services[repo]

    def pushes(self):
        return len({t.pid for t in serverlog.read(self.bare)})

    def version(self, lease_id):
        data = git(self.bare, "cat-file", "blob", f"{id_ref(lease_id)}:lease.json", check=False)
        import json

        return json.loads(data)["version"] if data else None


@pytest.fixture
def served(tmp_path, agent_socket):
    """An in-process agent on the test's socket, ticked by the test (no rounds thread), on a GatedClock."""
    clock = GatedClock()
    host = Host(tmp_path, clock)
    agent = Agent(host.service, clock=clock, alive=lambda pid, start: True)
    stop = threading.Event()
    thread = threading.Thread(
        target=serve, args=(agent, agent_socket), kwargs=dict(stop=stop, rounds=False), daemon=True
    )
    thread.start()
    client = AgentClient(agent_socket)
    for _ in range(400):
        if client.available():
            break
        threading.Event().wait(0.01)
    yield host, agent, client, clock
    stop.set()
    thread.join(5)


def test_hold_is_renewed_by_the_agent_not_by_itself(served):
    host, agent, client, clock = served
    svc = host.service(host.path("a"))
    with gitlease.hold(scope=["svc"], ttl=60, renew_every=20, service=svc, agent_client=client) as lease:
        assert lease.agent is not None and agent.status(lease.lease_id).state == "held"
        clock.wait_parked(1)
        assert host.pushes() == 1  # the acquire, made by the agent
        clock.step()  # the heartbeat's poll at 20 s: not renewed yet, and time enough to ask again
        clock.wait_parked(2)
        agent.tick()  # the agent's round at 20 s: one push
        assert host.pushes() == 2 and host.version(lease.lease_id) == 2
        clock.step()  # the heartbeat asks the agent: renewed
        clock.wait_parked(3)
        assert lease.agent.self_renewals == 0 and not lease.agent.fallen
        assert lease.heartbeat.beats[-1].ok and lease.heartbeat.expiry > 60
        lease.check()
        lease.heartbeat.stop()
        clock.step()
    assert host.pushes() == 3  # the release, through the agent
    assert svc.store.list_refs() == {} and agent.status(lease.lease_id) is None


def test_agent_reports_loss_and_the_holder_stops_within_its_deadline(served):
    host, agent, client, clock = served
    svc = host.service(host.path("a"))
    reasons = []
    with pytest.raises(errors.LeaseLost) as err:
        with gitlease.hold(
            scope=["svc"], ttl=60, renew_every=20, service=svc, agent_client=client, on_lost=reasons.append
        ) as lease:
            clock.wait_parked(1)
            tree = git(host.bare, "hash-object", "-t", "tree", "-w", "--stdin", input="").strip()
            other = git(host.bare, "commit-tree", tree, "-m", "taken").strip()
            git(host.bare, "update-ref", id_ref(lease.lease_id), other)  # taken over
            clock.step()  # the heartbeat's poll at 20 s: still held (the agent's round has not run)
            clock.wait_parked(2)  # its next poll comes before its stop deadline leaves too little time
            agent.tick()  # the round at 20 s: the renewal is refused
            assert agent.status(lease.lease_id).state == "lost"
            clock.step()
            assert lease.lost.wait(30)
            hb = lease.heartbeat
            assert hb.stopped_at <= hb.deadline and "lost or replaced" in lease.reason
            lease.check()
    assert len(reasons) == 1
    # said once, however many layers passed it on (agent, delegate, heartbeat, hold): issue 21, item 5
    msg = str(err.value)
    assert msg.count("lease lost") == 1 and msg.count("(stop writing)") == 1 and msg.count(lease.lease_id) == 1, msg
    assert git(host.bare, "rev-parse", id_ref(lease.lease_id)).strip() == other  # nothing of the taker's touched


def test_agent_sigkilled_mid_hold_the_holder_renews_by_itself(tmp_path, agent_socket):
    clock = GatedClock()
    clock.advance(time.time() - clock.now())  # the real agent process and the holder agree on wall time
    host = Host(tmp_path, clock)
    svc = host.service(host.path("a"))
    client = AgentClient(agent_socket)
    assert client.ensure_running()
    agent_pid = client.request("ping")["pid"]
    with gitlease.hold(scope=["svc"], ttl=300, renew_every=100, service=svc, agent_client=client) as lease:
        assert client.request("status", lease=lease.lease_id)["state"] == "held"
        clock.wait_parked(1)
        os.kill(agent_pid, signal.SIGKILL)
        while client.available():
            threading.Event().wait(0.01)
        clock.step()  # the heartbeat finds no agent: renews by itself, in the same attempt
        clock.wait_parked(2)
        assert lease.agent.fallen and "does not answer" in lease.agent.fallen
        assert not lease.lost.is_set() and lease.heartbeat.beats[-1].ok
        assert host.version(lease.lease_id) == 2 and lease.lease_id in svc.held_here()
        clock.step()  # the next interval: still by itself
        clock.wait_parked(3)
        assert host.version(lease.lease_id) == 3 and lease.agent.self_renewals == 2
        lease.heartbeat.stop()
        clock.step()
    assert svc.store.list_refs() == {}  # released by the holder itself


def test_a_dead_holders_lease_is_dropped_by_the_agent(tmp_path, agent_socket):
    clock = FakeClock(time.time())
    host = Host(tmp_path, clock)
    path = host.path("a")
    agent = Agent(host.service, clock=clock)  # the real process check
    stop = threading.Event()
    threading.Thread(
        target=serve, args=(agent, agent_socket), kwargs=dict(stop=stop, rounds=False), daemon=True
    ).start()
    try:
        code = (
            "import sys, gitlease\n"
            "with gitlease.hold(sys.argv[1], scope=['svc'], ttl=300) as lease:\n"
            "    print(lease.lease_id, lease.agent is not None, flush=True)\n"
            "    sys.stdin.read()\n"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = child.stdout.readline()
        assert line, child.stderr.read()
        lease_id, through_agent = line.split()
        assert through_agent == "True" and agent.status(lease_id).state == "held"
        child.kill()
        child.wait()
        before = host.pushes()
        clock.advance(200)  # past the renewal point
        agent.tick()
        assert agent.status(lease_id).state == "dropped" and "gone" in agent.status(lease_id).error
        assert host.pushes() == before  # not renewed: it expires and can be reclaimed
    finally:
        stop.set()


def test_an_acquire_carries_the_due_renewals_one_push_not_two(tmp_path):
    clock = FakeClock()
    host = Host(tmp_path, clock)
    a, b, c = (host.path(n) for n in "abc")
    agent = Agent(host.service, clock=clock, alive=lambda pid, start: True)
    la = agent.acquire(a, None, ["pkg-a"], pid=1, ttl=60)[0].lease_id
    lb = agent.acquire(b, None, ["pkg-b"], pid=1, ttl=60)[0].lease_id
    clock.advance(20)  # both due in 10 s: within half their 30 s renewal interval
    checkin(agent, [la, lb])
    n = host.pushes()
    got, reg = agent.acquire(c, None, ["pkg-c"], pid=1, ttl=60)
    assert host.pushes() == n + 1 and got.piggybacked and agent.piggybacked == 2
    assert host.version(la) == 2 and host.version(lb) == 2 and host.version(got.lease_id) == 1
    assert agent.status(la).version == 2 and reg.state == "held"
    clock.advance(20)
    n = host.pushes()
    assert agent.tick() > 0 and host.pushes() == n  # nothing due: no round
    clock.advance(5)  # a and b due in 5 s, c in 10: all within the window
    checkin(agent, [la, lb, got.lease_id])
    agent.release(c, None, got.lease_id)
    assert host.pushes() == n + 1 and host.version(la) == 3 and host.version(lb) == 3
    assert host.version(got.lease_id) is None
    # a renewal that is refused fails the atomic push: the acquire is retried alone, the lost lease found later
    tree = git(host.bare, "hash-object", "-t", "tree", "-w", "--stdin", input="").strip()
    git(host.bare, "update-ref", id_ref(la), git(host.bare, "commit-tree", tree, "-m", "x").strip())
    clock.advance(20)
    checkin(agent, [la, lb])
    n = host.pushes()
    got2, _ = agent.acquire(c, None, ["pkg-c2"], pid=1, ttl=60)
    assert host.pushes() == n + 1 and not got2.piggybacked and host.version(got2.lease_id) == 1
    assert host.version(lb) == 3  # nothing of the refused push landed
    clock.advance(10)
    checkin(agent, [la, lb, got2.lease_id])
    agent.tick()
    assert agent.status(la).state == "lost" and agent.status(lb).state == "held" and host.version(lb) == 4


def test_git_lease_run_uses_the_agent_and_opts_out(tmp_path, agent_socket):
    host = Host(tmp_path, FakeClock())
    work = host.path("w")
    res = cli(work, "run", "--scope", "svc", "--ttl", "60", "--", "true")
    assert res.returncode == 0, res.stderr
    client = AgentClient(agent_socket)
    assert client.available() and client.request("ping")["leases"] == 0  # started on demand, lease released
    assert host.pushes() == 2  # acquire and release, both through the agent
    client.request("stop")
    while client.available():
        threading.Event().wait(0.01)
    git(work, "config", "lease.renewAgent", "false")
    res = cli(work, "run", "--scope", "svc", "--ttl", "60", "--", "true")
    assert res.returncode == 0, res.stderr
    assert not client.available()  # no agent started
    git(work, "config", "lease.renewAgent", "true")
    res = cli(work, "run", "--no-renew-agent", "--scope", "svc", "--ttl", "60", "--", "true")
    assert res.returncode == 0 and not client.available()


def test_a_second_hold_on_the_host_carries_the_first_ones_due_renewal(served):
    host, agent, client, clock = served
    a, b = host.service(host.path("a")), host.service(host.path("b"))
    with gitlease.hold(scope=["pkg-a"], ttl=60, renew_every=20, service=a, agent_client=client) as first:
        clock.wait_parked(1)
        clock.advance(12)  # due in 8 s: within half its 20 s interval
        n = host.pushes()
        with gitlease.hold(scope=["pkg-b"], ttl=60, renew_every=20, service=b, agent_client=client) as second:
            assert host.pushes() == n + 1  # one push: b's acquire and a's renewal
            assert host.version(first.lease_id) == 2 and host.version(second.lease_id) == 1
            clock.wait_parked(2)
            second.heartbeat.stop()
            first.heartbeat.stop()
            clock.step()  # each parked heartbeat wakes, sees its stop, and ends
            clock.step()
    assert a.store.list_refs() == {}
