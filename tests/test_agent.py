"""The renewal agent (issue 11): one push renews many leases; a lost lease fails only itself; dead holders'
leases are not kept alive; holders talk to it over a unix socket."""

import os
import subprocess
import sys
import threading

import pytest
from conftest import git
from servers import make_bare

from gitlease.core import gitcmd
from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.errors import LeaseLost
from gitlease.core.repo import Repo
from gitlease.liveness.agent import Agent, AgentClient
from gitlease.liveness.batch import renew_many
from gitlease.service.leases import LeaseService, Renewed


@pytest.fixture
def worktrees(tmp_path):
    """Three linked worktrees of one repository (one object store), all leasing on one file:// remote."""
    bare = make_bare(tmp_path / "store.git")
    main = tmp_path / "main"
    git(tmp_path, "init", "-q", str(main))
    git(main, "commit", "-q", "--allow-empty", "-m", "init")
    clock = FakeClock()
    paths = []
    for name in ("a", "b", "c"):
        git(main, "worktree", "add", "-q", "--detach", str(tmp_path / name))
        paths.append(str(tmp_path / name))

    def service(path, remote=None, clock=clock):
        repo = Repo.discover(path)
        return LeaseService(
            repo,
            resolve(repo.config, env={}, remote=bare.as_uri(), agent=os.path.basename(path), timeout=20),
            clock=clock,
        )

    return bare, clock, paths, service


def _pushes(monkeypatch):
    calls = []
    real = gitcmd.run

    def spy(args, **kw):
        if args and args[0] == "push":
            calls.append(list(args))
        return real(args, **kw)

    monkeypatch.setattr(gitcmd, "run", spy)
    return calls


def checkin(agent, leases):
    """The holders poll the agent (their heartbeats' check-ins): without them it renews nothing (issue 17)."""
    for lid in leases:
        agent.status(lid)


def _forge(bare, lease_id):
    """Someone else moves the lease's id ref (a takeover, as far as its holder can tell)."""
    tree = git(bare, "hash-object", "-t", "tree", "-w", "--stdin", input="").strip()
    other = git(bare, "commit-tree", tree, "-m", "forged").strip()
    git(bare, "update-ref", f"refs/leases/id/{lease_id}", other)


def test_one_push_renews_all_and_a_lost_lease_fails_alone(worktrees, monkeypatch):
    bare, clock, paths, service = worktrees
    svcs = [service(p) for p in paths]
    leases = [s.acquire([f"pkg{i}"], ttl=60).lease_id for i, s in enumerate(svcs)]
    _forge(bare, leases[1])
    before = {lid: git(bare, "rev-parse", f"refs/leases/id/{lid}").strip() for lid in leases}
    clock.advance(20)
    pushes = _pushes(monkeypatch)
    res = renew_many(list(zip(svcs, leases)))
    assert len(pushes) == 1 and "--atomic" not in pushes[0]
    assert isinstance(res[leases[0]], Renewed) and isinstance(res[leases[2]], Renewed)
    assert isinstance(res[leases[1]], LeaseLost)
    after = {lid: git(bare, "rev-parse", f"refs/leases/id/{lid}").strip() for lid in leases}
    assert after[leases[1]] == before[leases[1]]  # the forged value stays: CAS refused
    assert after[leases[0]] != before[leases[0]] and after[leases[2]] != before[leases[2]]
    assert git(bare, "cat-file", "-p", after[leases[0]] + ":lease.json").count('"version":2') == 1
    assert leases[1] not in svcs[1].held_here()  # forgotten: a stop signal for that holder only
    assert svcs[0].renew(leases[0]).record.version == 3  # the holder's own state moved on with the batch


def test_agent_renews_when_half_the_ttl_is_left_in_one_push_per_round(worktrees, monkeypatch):
    bare, clock, paths, service = worktrees
    svcs = [service(p) for p in paths[:2]]
    leases = [s.acquire([f"pkg{i}"], ttl=60).lease_id for i, s in enumerate(svcs)]
    agent = Agent(lambda repo, remote: service(repo), clock=clock, alive=lambda pid, start: True)
    for p, lid in zip(paths, leases):
        agent.register(p, lid, pid=os.getpid())
    pushes = _pushes(monkeypatch)
    wait = agent.tick()
    assert pushes == [] and 27 <= wait <= 30  # due at expiry - ttl/2
    clock.advance(29)  # within the gather window of both
    checkin(agent, leases)
    agent.tick()
    assert len(pushes) == 1
    assert [agent.status(lid).version for lid in leases] == [2, 2]
    _forge(bare, leases[0])
    clock.advance(31)
    checkin(agent, leases)
    agent.tick()
    assert agent.status(leases[0]).state == "lost" and "lost or replaced" in agent.status(leases[0]).error
    assert agent.status(leases[1]).state == "held" and agent.status(leases[1]).version == 3
    assert len(pushes) == 2


def test_agent_never_keeps_a_dead_holders_lease_alive(worktrees, monkeypatch):
    bare, clock, paths, service = worktrees
    svc = service(paths[0])
    lid = svc.acquire(["pkg"], ttl=60).lease_id
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(done.stdout)
    agent = Agent(lambda repo, remote: service(repo), clock=clock)
    agent.register(paths[0], lid, pid=dead_pid)
    clock.advance(40)
    pushes = _pushes(monkeypatch)
    agent.tick()
    assert pushes == [] and agent.status(lid).state == "dropped"


def test_unconfirmed_renewal_past_the_deadline_is_reported_lost(worktrees, tmp_path):
    bare, clock, paths, service = worktrees
    svc = service(paths[0])
    lid = svc.acquire(["pkg"], ttl=60).lease_id
    agent = Agent(lambda repo, remote: service(repo), clock=clock, alive=lambda pid, start: True, margin=5)
    agent.register(paths[0], lid, pid=1)
    bare.rename(tmp_path / "gone.git")  # the store is unreachable from now on
    clock.advance(31)
    checkin(agent, [lid])
    agent.tick()
    assert agent.status(lid).state == "held" and agent.status(lid).error  # not yet past the deadline
    clock.advance(25)  # 4 s before expiry: inside the margin
    checkin(agent, [lid])
    agent.tick()
    assert agent.status(lid).state == "lost" and "deadline" in agent.status(lid).error


def test_holders_reach_a_real_agent_process_over_its_socket(worktrees, tmp_path):
    bare, clock, paths, service = worktrees
    svc = service(paths[0])
    real = LeaseService(svc.repo, svc.settings)  # the agent process runs on the real clock
    lid = real.acquire(["pkg"], ttl=300).lease_id
    sock = str(tmp_path / "run" / "agent.sock")
    client = AgentClient(sock, timeout=20)  # a loaded machine: the agent's first answers import modules
    assert not client.available()
    assert client.ensure_running(idle=0.5)
    ans = client.request("register", repo=paths[0], lease=lid, pid=os.getpid(), remote=bare.as_uri())
    assert ans["ok"] and ans["state"] == "held" and ans["version"] == 1
    assert client.request("status", lease=lid)["state"] == "held"
    assert client.request("status", lease="lease_unknown")["state"] == "unknown"
    bad = client.request("register", repo=paths[1], lease=lid, pid=1, remote=bare.as_uri())
    assert not bad["ok"] and bad["kind"] == "not-held"
    assert client.request("unregister", lease=lid)["state"] == "held"
    assert oct(os.stat(os.path.dirname(sock)).st_mode & 0o777) == "0o700"
    gone = threading.Event()
    for _ in range(200):  # idle for 0.5 s: it stops by itself
        if not client.available():
            gone.set()
            break
        threading.Event().wait(0.05)
    assert gone.is_set()


def _agents_on(sock: str) -> list[str]:
    """Command lines of the live agent processes serving ``sock``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "gitlease.liveness.agent" in argv and sock in argv:
            found.append(" ".join(argv))
    return found


def test_holders_that_find_no_agent_together_start_one(tmp_path):
    """Eight holders that find no agent at the same moment (a barrier releases them together, as a runner's
    workers claiming at once) start ONE agent process between them. Each used to start its own: every new one
    took the socket over, and the ones before it went on renewing leases that no holder could reach."""
    sock = str(tmp_path / "run" / "agent.sock")
    barrier = threading.Barrier(8)
    got = []

    def start():
        client = AgentClient(sock, timeout=20)
        barrier.wait()
        got.append(client.ensure_running(idle=3, wait=30))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == [True] * 8
    assert len(_agents_on(sock)) == 1, _agents_on(sock)


def test_twenty_holders_one_renewal_push_counted_at_the_server(tmp_path):
    """Issue 11's acceptance: 20 holders on one host over a file:// remote; the server's own
    reference-transaction log shows one renewal push per round for all 20; a lease taken over stops only its
    holder."""
    from soak import serverlog

    bare = make_bare(tmp_path / "store.git")
    serverlog.install(bare)
    main = tmp_path / "main"
    git(tmp_path, "init", "-q", str(main))
    git(main, "commit", "-q", "--allow-empty", "-m", "init")
    clock = FakeClock()

    def service(path, remote=None):
        repo = Repo.discover(path)
        return LeaseService(
            repo,
            resolve(repo.config, env={}, remote=bare.as_uri(), agent=os.path.basename(path), timeout=20),
            clock=clock,
        )

    paths = []
    for i in range(20):
        git(main, "worktree", "add", "-q", "--detach", str(tmp_path / f"h{i}"))
        paths.append(str(tmp_path / f"h{i}"))
    leases = [service(p).acquire([f"pkg{i}"], ttl=600).lease_id for i, p in enumerate(paths)]
    agent = Agent(lambda repo, remote: service(repo), clock=clock, alive=lambda pid, start: True)
    for p, lid in zip(paths, leases):
        agent.register(p, lid, pid=1)
    before = len(serverlog.read(bare))
    clock.advance(300)  # half the TTL
    checkin(agent, leases)
    agent.tick()
    renewals = serverlog.read(bare)[before:]
    # one push (one receive-pack process; non-atomic, so git commits each ref on its own), twenty id refs
    assert len({t.pid for t in renewals}) == 1 and sum(len(t.updates) for t in renewals) == 20
    _forge(bare, leases[7])
    before = len(serverlog.read(bare))
    clock.advance(300)
    checkin(agent, leases)
    agent.tick()
    txns = serverlog.read(bare)[before:]
    assert len({t.pid for t in txns}) == 1 and sum(len(t.updates) for t in txns) == 19  # one refused on its own
    states = {lid: agent.status(lid).state for lid in leases}
    assert states.pop(leases[7]) == "lost" and set(states.values()) == {"held"}


def test_release_and_the_next_acquire_go_in_one_push(tmp_path):
    """Issue 11: a worker moving to its next task pays one push (counted at the server), not two; overlapping
    scopes fall back to two; a refused next scope still gives the old lease back."""
    from gitlease.core.errors import HeldError
    from soak import serverlog

    bare = make_bare(tmp_path / "store.git")
    serverlog.install(bare)
    main = tmp_path / "w"
    git(tmp_path, "init", "-q", str(main))
    clock = FakeClock()
    repo = Repo.discover(main)
    svc = LeaseService(repo, resolve(repo.config, env={}, remote=bare.as_uri(), agent="w"), clock=clock)
    pushes = lambda: len({t.pid for t in serverlog.read(bare)})  # noqa: E731  (one receive-pack per push)
    first = svc.acquire(["pkg1"]).lease_id
    n = pushes()
    second = svc.acquire(["pkg2"], replace=first).lease_id
    assert pushes() == n + 1
    refs = git(bare, "for-each-ref", "--format=%(refname)", "refs/leases/").split()
    assert refs == [f"refs/leases/id/{second}", "refs/leases/scope/pkg2"]
    assert set(svc.held_here()) == {second}
    n = pushes()
    third = svc.acquire(["pkg2/sub"], replace=second).lease_id  # overlaps: git cannot do both in one push
    assert pushes() == n + 2 and set(svc.held_here()) == {third}
    other = fleet_agent(tmp_path, bare, clock, "other")
    other.acquire(["taken"])
    with pytest.raises(HeldError):
        svc.acquire(["taken"], replace=third)
    assert svc.held_here() == {} and f"refs/leases/id/{third}" not in git(bare, "for-each-ref")


def fleet_agent(tmp_path, bare, clock, name):
    path = tmp_path / name
    git(tmp_path, "init", "-q", str(path))
    repo = Repo.discover(path)
    return LeaseService(repo, resolve(repo.config, env={}, remote=bare.as_uri(), agent=name), clock=clock)
