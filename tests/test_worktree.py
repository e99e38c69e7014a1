"""Worktrees bound to leases, against real git: lease first, then a clean worktree; reuse only what is
provably clean; never lose work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import cli, git

from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.errors import GitLeaseError, NotHeld, UsageError
from gitlease.core.repo import Repo
from gitlease.core.state import HeldState
from gitlease.service.leases import LeaseService
from gitlease.worktree.manager import WorktreeManager

TTL = 60


@pytest.fixture
def repo(tmp_path):
    """Two commits on main (README x -> y) and a branch ``side`` from the first (README x -> z), so merges,
    cherry-picks and rebases in a worktree can conflict without a commit of the worktree's own."""
    path = tmp_path / "repo"
    git(tmp_path, "init", "-q", str(path))
    (path / "README").write_text("x\n")
    (path / ".gitignore").write_text("*.o\n")
    git(path, "add", "README", ".gitignore")
    git(path, "commit", "-q", "-m", "one")
    git(path, "branch", "side")
    (path / "README").write_text("y\n")
    git(path, "commit", "-q", "-am", "two")
    git(path, "switch", "-q", "side")
    (path / "README").write_text("z\n")
    git(path, "commit", "-q", "-am", "side")
    git(path, "switch", "-q", "main")
    git(path, "config", "lease.worktreeRoot", str(tmp_path / "pool root with spaces"))
    return path


@pytest.fixture
def clock():
    return FakeClock()


def manager(where, clock, agent="agent-a") -> WorktreeManager:
    r = Repo.discover(where)
    return WorktreeManager(LeaseService(r, resolve(r.config, env={}, agent=agent, task=f"task-{agent}"), clock=clock))


def release_in(att, clock):
    """Release the lease where it now lives: inside its worktree."""
    manager(att.path, clock).svc.release(att.lease_id)


def held_in(path) -> dict:
    return HeldState(os.path.join(Repo.discover(path).git_dir, "gitlease")).load()


def lock_reasons(repo) -> dict[str, str]:
    out, cur = {}, {}
    for item in git(repo, "worktree", "list", "--porcelain", "-z").split("\0"):
        if not item:
            if "locked" in cur:
                out[os.path.realpath(cur["worktree"])] = cur["locked"]
            cur = {}
            continue
        k, _, v = item.partition(" ")
        cur[k] = v
    return out


def fingerprint(path) -> tuple:
    """What a worktree holds: HEAD, status (ignored included), every file's bytes, the stash list."""
    files = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".git"]
        for n in names:
            p = os.path.join(root, n)
            if n != ".git":
                files[os.path.relpath(p, path)] = Path(p).read_bytes()
    return (
        git(path, "rev-parse", "HEAD"),
        git(path, "status", "--porcelain=v2", "--ignored", "-uall"),
        tuple(sorted(files.items())),
        git(path, "stash", "list"),
    )


# --------------------------------------------------------------------------------- attach


def test_acquire_attaches_a_locked_worktree_bound_to_the_lease(repo, clock, tmp_path):
    m = manager(repo, clock)
    att = m.acquire(["services/billing"], ttl=TTL)
    path = Path(att.path)
    assert path.parent == tmp_path / "pool root with spaces" and att.id == path.name == "wt-billing-1"
    assert att.acquired.record.workspace_id == att.id  # the record names this worktree
    assert att.branch == f"lease/{att.lease_id}" and not att.reused
    assert git(path, "rev-parse", "HEAD").strip() == git(repo, "rev-parse", "main").strip() == att.base_oid
    assert git(path, "symbolic-ref", "--short", "HEAD").strip() == att.branch
    # the lock reason names the lease
    assert att.lease_id in lock_reasons(repo)[os.path.realpath(path)]
    # bound: the worktree holds the lease (held.json in its own git dir); the acquiring worktree no longer does
    assert list(held_in(path)) == [att.lease_id] and held_in(repo) == {}
    # strict enforcement in the worktree's own config only
    assert git(path, "config", "--worktree", "--get", "lease.enforce").strip() == "strict"
    assert git(repo, "config", "--get", "lease.enforce", check=False) == ""
    assert git(repo, "config", "--get", "extensions.worktreeConfig").strip() == "true"
    # later commands in the worktree know their lease: renew and release work there
    wsvc = manager(path, clock).svc
    assert wsvc.renew(att.lease_id).record.version == 2
    wsvc.release(att.lease_id)
    assert path.is_dir()  # releasing a lease does not remove its worktree
    assert [e.lease_state for e in m.list()] == ["released"]


def test_worktree_add_for_a_held_lease(repo, clock):
    m = manager(repo, clock)
    got = m.svc.acquire(["libs/tax"], ttl=TTL)
    att = m.add(got.lease_id, branch="task/tax-fix")
    assert att.branch == "task/tax-fix" and list(held_in(att.path)) == [got.lease_id]
    with pytest.raises(NotHeld, match=f"already attached to worktree {att.id}"):
        m.add(got.lease_id)
    with pytest.raises(NotHeld, match="not held by this worktree"):
        m.add("lease_0000000000000000")


def test_released_clean_worktree_is_reused_and_reset_to_the_base(repo, clock):
    m = manager(repo, clock)
    first = m.acquire(["a"], ttl=TTL)
    release_in(first, clock)
    (Path(repo) / "README").write_text("three\n")
    git(repo, "commit", "-q", "-am", "three")  # the base moved on
    second = m.acquire(["b"], ttl=TTL)
    # the same worktree, renamed after its new task (issue 21): wt-a-1 now holding b would mislead
    assert second.reused and (first.id, second.id) == ("wt-a-1", "wt-b-1")
    assert not os.path.exists(first.path) and second.path == os.path.join(os.path.dirname(first.path), "wt-b-1")
    assert git(second.path, "rev-parse", "HEAD").strip() == git(repo, "rev-parse", "main").strip()
    assert (Path(second.path) / "README").read_text() == "three\n"
    assert git(repo, "branch", "--list", first.branch) == ""  # the old task branch (nothing only on it) is gone
    assert list(held_in(second.path)) == [second.lease_id]
    assert second.lease_id in lock_reasons(repo)[os.path.realpath(second.path)]
    assert second.acquired.record.workspace_id == second.id


def _merge(wt, repo):
    git(wt, "merge", "side", check=False)


def _cherry_pick(wt, repo):
    git(wt, "cherry-pick", "side", check=False)


def _rebase(wt, repo):
    git(wt, "rebase", "--exec", "false", "HEAD~1", check=False)


def _bisect(wt, repo):
    git(wt, "bisect", "start")


def _stash(wt, repo):
    (Path(wt) / "README").write_text("stashed\n")
    git(wt, "stash", "push", "-q", "-m", "mine")


def _unpushed(wt, repo):
    (Path(wt) / "work.txt").write_text("work\n")
    git(wt, "add", "work.txt")
    git(wt, "commit", "-q", "-m", "work")


def _detached(wt, repo):
    git(wt, "checkout", "-q", "--detach")


DIRT = {
    "staged": (lambda wt, repo: ((Path(wt) / "README").write_text("s\n"), git(wt, "add", "README")), "staged change"),
    "unstaged": (lambda wt, repo: (Path(wt) / "README").write_text("u\n"), "unstaged change"),
    "untracked": (
        lambda wt, repo: (
            (Path(wt) / "deep" / "dir").mkdir(parents=True) or (Path(wt) / "deep" / "dir" / "new.txt").write_text("n\n")
        ),
        "untracked file",
    ),
    "ignored": (lambda wt, repo: (Path(wt) / "build.o").write_text("o\n"), "ignored file"),
    "merge": (_merge, "merge in progress"),
    "cherry-pick": (_cherry_pick, "cherry-pick in progress"),
    "rebase": (_rebase, "rebase in progress"),
    "bisect": (_bisect, "bisect in progress"),
    "stash": (_stash, "stash entry of its own"),
    "unpushed": (_unpushed, "unpushed commit"),
    "detached": (_detached, "detached HEAD"),
}


@pytest.mark.parametrize("kind", sorted(DIRT))
def test_dirty_worktree_is_not_reused_and_stays_intact(repo, clock, kind):
    make_dirty, reason = DIRT[kind]
    m = manager(repo, clock)
    first = m.acquire(["a"], ttl=TTL)
    release_in(first, clock)
    make_dirty(first.path, repo)
    before = fingerprint(first.path)
    second = m.acquire(["b"], ttl=TTL)
    assert not second.reused and second.id != first.id and second.path != first.path
    skipped = dict(second.skipped)
    assert any(reason in r for r in skipped[first.id]), skipped
    assert fingerprint(first.path) == before  # nothing of it was touched
    # and prune does not touch its files either: it quarantines it
    actions = {a.id: a for a in m.prune()}
    assert actions[first.id].action == "quarantined" and fingerprint(first.path) == before


def test_stash_of_another_worktree_does_not_count(repo, clock):
    m = manager(repo, clock)
    first = m.acquire(["a"], ttl=TTL)
    release_in(first, clock)
    (Path(repo) / "README").write_text("main's own work\n")
    git(repo, "stash", "push", "-q")  # stashes are shared; this one is main's ("WIP on main: ...")
    assert m.acquire(["b"], ttl=TTL).reused


def test_live_process_in_the_worktree_blocks_reuse(repo, clock):
    m = manager(repo, clock)
    first = m.acquire(["a"], ttl=TTL)
    release_in(first, clock)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=first.path, stdin=subprocess.PIPE
    )
    try:
        second = m.acquire(["b"], ttl=TTL)
        assert not second.reused
        assert any(f"process {proc.pid} has its working directory in it" in r for r in dict(second.skipped)[first.id])
    finally:
        proc.communicate(b"")
    third = m.acquire(["c"], ttl=TTL)  # once it is gone, the worktree is free again (and named after c)
    assert third.reused and third.id == "wt-c-1" and not os.path.exists(first.path)


def test_pid_file_of_a_running_command_blocks_reuse_and_removal(repo, clock):
    m = manager(repo, clock)
    first = m.acquire(["a"], ttl=TTL)
    release_in(first, clock)
    with m.busy(first.id, "make test"):
        second = m.acquire(["b"], ttl=TTL)
        assert not second.reused and "running a command in it (make test)" in " ".join(dict(second.skipped)[first.id])
        with pytest.raises(GitLeaseError, match="in use"):
            m.remove(first.id)
        assert [a.action for a in m.prune() if a.id == first.id] == ["skipped"]
    assert Path(first.path).is_dir()
    assert m.acquire(["c"], ttl=TTL).reused


def test_an_active_lease_keeps_its_worktree_out_of_the_pool(repo, clock):
    m = manager(repo, clock)
    first = m.acquire(["a"], ttl=TTL)
    second = m.acquire(["b"], ttl=TTL)
    assert second.id != first.id and not second.skipped
    clock.advance(TTL + 1)  # expired, but within the skew margin: a holder may still be writing
    assert m.acquire(["c"], ttl=TTL).id not in (first.id, second.id)
    assert m.prune() == []


# ---------------------------------------------------------------------------- crash, prune


def test_prune_quarantines_a_crashed_holders_dirty_worktree_and_loses_nothing(repo, clock):
    m = manager(repo, clock)
    crashed = m.acquire(["services/billing"], ttl=TTL)
    tidy = m.acquire(["services/tax"], ttl=TTL)
    wt = Path(crashed.path)
    (wt / "README").write_text("half done\n")
    (wt / "notes").mkdir()
    (wt / "notes" / "plan.txt").write_text("step 2\n")
    (wt / "cache.o").write_text("ignored\n")
    release_in(tidy, clock)
    clock.advance(TTL + 31)  # the holder crashed: never renewed, never released; expired beyond the skew
    rows = {e.worktree.id: e for e in m.list()}
    assert rows[crashed.id].lease_state == "expired" and not rows[crashed.id].inspection.clean
    assert rows[tidy.id].lease_state == "released" and rows[tidy.id].inspection.clean
    before = fingerprint(wt)

    actions = {a.id: a for a in m.prune()}
    assert actions[tidy.id].action == "pooled"
    q = actions[crashed.id]
    assert q.action == "quarantined" and q.ref.startswith(f"refs/gitlease/quarantine/{crashed.id}/")
    assert fingerprint(wt) == before  # kept as it was
    assert git(repo, "show", f"{q.ref}:README") == "half done\n"
    assert git(repo, "show", f"{q.ref}:notes/plan.txt") == "step 2\n"
    assert git(repo, "rev-parse", f"{q.ref}^1").strip() == crashed.base_oid
    assert os.path.realpath(wt) not in lock_reasons(repo)  # unlocked, out of the pool
    # reported by list, and never reused
    row = {e.worktree.id: e for e in m.list()}[crashed.id]
    assert row.state == "quarantined" and row.to_json()["quarantineRef"] == q.ref
    nxt = m.acquire(["x"], ttl=TTL)
    assert nxt.id == "wt-x-1" and nxt.reused and not os.path.exists(tidy.path)  # tidy, renamed after x
    assert [a.action for a in m.prune() if a.id == crashed.id] == ["kept"]
    # once its owner cleans it up, prune returns it to the pool
    git(wt, "checkout", "-q", "--", "README")
    shutil.rmtree(wt / "notes")
    (wt / "cache.o").unlink()
    assert [a.action for a in m.prune() if a.id == crashed.id] == ["pooled"]


def test_prune_remove_removes_clean_ones_only(repo, clock):
    m = manager(repo, clock)
    a = m.acquire(["a"], ttl=TTL)
    b = m.acquire(["b"], ttl=TTL)
    release_in(a, clock)
    release_in(b, clock)
    (Path(b.path) / "keep.txt").write_text("mine\n")
    actions = {x.id: x.action for x in m.prune(remove=True)}
    assert actions == {a.id: "removed", b.id: "quarantined"}
    assert not Path(a.path).exists() and (Path(b.path) / "keep.txt").read_text() == "mine\n"


# ---------------------------------------------------------------------------- concurrency


def test_two_agents_asking_at_once_get_different_worktrees(repo, clock):
    m = manager(repo, clock)
    pooled = m.acquire(["seed"], ttl=TTL)
    release_in(pooled, clock)
    barrier = threading.Barrier(2)
    results, errors = {}, []

    def agent(name, scope):
        try:
            mgr = manager(repo, clock, agent=name)
            barrier.wait()
            results[name] = mgr.acquire([scope], ttl=TTL)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(f"agent-{i}", f"s{i}")) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ids = {r.id for r in results.values()}
    assert ids == {"wt-s0-1", "wt-s1-1"} and not os.path.exists(pooled.path)  # the pooled one, renamed
    assert sum(r.reused for r in results.values()) == 1
    for r in results.values():
        assert list(held_in(r.path)) == [r.lease_id]


def test_list_waits_for_an_add_in_progress(repo, clock):
    """`git worktree list` next to a half-made worktree of a concurrent add can fail: list takes the pool
    lock shared, so it waits for an add (which holds it exclusive) and never sees one half made."""
    m = manager(repo, clock)
    m.acquire(["seed"], ttl=TTL)
    adding, listed, done = threading.Event(), threading.Event(), threading.Event()
    got = []

    def add_in_progress():
        with manager(repo, clock)._pool_lock():
            adding.set()
            done.wait(10)

    def lister():
        adding.wait(10)
        got.append(m.list())
        listed.set()

    threads = [threading.Thread(target=add_in_progress), threading.Thread(target=lister)]
    for t in threads:
        t.start()
    assert adding.wait(10)
    assert not listed.wait(0.3)  # blocked behind the add (an event wait with a timeout, not a sleep)
    done.set()
    for t in threads:
        t.join(10)
    assert listed.is_set() and len(got[0]) == 1


# ------------------------------------------------------------------------ clear messages


def test_a_base_that_does_not_exist_is_refused_before_any_lease(repo, clock):
    m = manager(repo, clock)
    with pytest.raises(UsageError, match="base 'origin/nope' does not exist"):
        m.acquire(["a"], ttl=TTL, base="origin/nope")
    assert m.svc.snapshot().leases == [] and m.worktrees() == []
    with pytest.raises(UsageError, match="already exists"):
        m.acquire(["a"], ttl=TTL, branch="side")
    assert m.svc.snapshot().leases == [] and not (Path(m.root()).exists() and any(Path(m.root()).iterdir()))


def test_default_base_prefers_origin(repo, clock, tmp_path):
    bare = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    git(repo, "remote", "add", "origin", str(bare))
    git(repo, "config", "lease.remote", "local")  # leases in this repository's own refs, on purpose
    git(repo, "fetch", "-q", "origin")
    (Path(repo) / "README").write_text("local only\n")
    git(repo, "commit", "-q", "-am", "local")
    att = manager(repo, clock).acquire(["a"], ttl=TTL)
    assert att.base == "origin/main" and att.base_oid == git(repo, "rev-parse", "origin/main").strip()


def test_a_worktree_deleted_by_hand(repo, clock):
    m = manager(repo, clock)
    att = m.acquire(["a"], ttl=TTL)
    shutil.rmtree(att.path)
    row = m.list()[0]
    assert row.state == "missing" and "is missing (deleted by hand?)" in row.inspection.dirt[0]
    acts = m.prune()
    assert acts[0].action == "kept" and f"git lease worktree remove {att.id}" in acts[0].reasons[-1]
    assert m.acquire(["b"], ttl=TTL).id != att.id
    wt, ref, handed = m.remove(att.id)
    assert handed == att.lease_id and att.lease_id in m.svc.held_here()  # removing did not release the lease
    assert att.id not in {w.id for w in m.worktrees()}
    assert git(repo, "branch", "--list", att.branch) == ""  # nothing was only on its branch
    m.svc.release(att.lease_id)


# --------------------------------------------------------------------------------- remove


def test_remove_refuses_uncommitted_work_unless_saved_and_never_releases(repo, clock):
    m = manager(repo, clock)
    att = m.acquire(["a"], ttl=TTL)
    wt = Path(att.path)
    (wt / "README").write_text("edited\n")
    (wt / "out.o").write_text("build output\n")
    before = fingerprint(wt)
    with pytest.raises(GitLeaseError, match="uncommitted work: 1 unstaged change; 1 ignored file"):
        m.remove(att.id)
    assert fingerprint(wt) == before and att.lease_id in lock_reasons(repo)[os.path.realpath(wt)]
    _, ref, handed = m.remove(att.id, save=True)
    assert not wt.exists()
    assert git(repo, "show", f"{ref}:README") == "edited\n"
    assert git(repo, "show", f"{ref}:out.o") == "build output\n"  # ignored files are saved too
    # removing a worktree does not release its lease: it is handed back, still on the store
    assert handed == att.lease_id and att.lease_id in m.svc.held_here()
    assert [v.lease_id for v in m.svc.snapshot().leases] == [att.lease_id]
    m.svc.release(att.lease_id)


def test_remove_clean_keeps_unpushed_commits_on_their_branch(repo, clock):
    m = manager(repo, clock)
    att = m.acquire(["a"], ttl=TTL)
    _unpushed(att.path, repo)
    tip = git(att.path, "rev-parse", "HEAD").strip()
    m.remove(att.id)
    assert git(repo, "rev-parse", att.branch).strip() == tip


# --------------------------------------------------------------------------- worktreeConfig


def test_bare_repository_stays_bare_and_its_worktrees_do_not(tmp_path, clock):
    src = tmp_path / "src"
    git(tmp_path, "init", "-q", str(src))
    git(src, "commit", "-q", "--allow-empty", "-m", "init")
    bare = tmp_path / "proj.git"
    git(tmp_path, "clone", "-q", "--bare", str(src), str(bare))
    git(bare, "config", "lease.remote", "local")  # leases in this repository's own refs, on purpose
    att = manager(bare, clock).acquire(["a"], ttl=TTL)
    assert Path(att.path).parent == tmp_path / "proj.worktrees"
    assert git(att.path, "rev-parse", "--is-bare-repository").strip() == "false"
    assert git(bare, "rev-parse", "--is-bare-repository").strip() == "true"
    assert git(att.path, "config", "lease.enforce").strip() == "strict"


# ------------------------------------------------------------------------------------- CLI


def test_cli_acquire_worktree_list_add_prune_remove(repo, tmp_path):
    res = cli(repo, "acquire", "--scope", "services/billing", "--worktree", "--task", "job_1", "--agent", "w1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    lease = lines[0].split(": ")[1]
    assert lines[1] == "workspace: wt-billing-1" and lines[2] == "ttl: 300s"
    path = tmp_path / "pool root with spaces" / "wt-billing-1"
    assert f"worktree: {path}" in lines and "reused: no" in lines
    assert lease in lock_reasons(repo)[os.path.realpath(path)] and "job_1" in lock_reasons(repo)[str(path)]

    res = cli(repo, "worktree", "list", "--json")
    row = json.loads(res.stdout)["result"]["worktrees"][0]
    assert row["workspaceId"] == "wt-billing-1" and row["leaseId"] == lease and row["leaseState"] == "active"
    assert row["clean"] and row["ageSeconds"] >= 0

    assert cli(repo, "release", lease).returncode == 1  # the lease lives in its worktree now
    assert cli(path, "release", lease).returncode == 0
    assert cli(repo, "worktree", "prune").stdout == "pooled: wt-billing-1\n"
    res = cli(repo, "worktree", "list")
    assert res.stdout.startswith("wt-billing-1  free  lease=- (none)  clean")

    res = cli(repo, "acquire", "--scope", "libs", "--json")
    lease2 = json.loads(res.stdout)["result"]["leaseId"]
    res = cli(repo, "worktree", "add", lease2, "--branch", "task/libs")
    assert res.returncode == 0, res.stderr
    assert "workspace: wt-libs-1" in res.stdout and "reused: yes" in res.stdout  # renamed after its new task
    path = path.parent / "wt-libs-1"

    (path / "wip.txt").write_text("wip\n")
    res = cli(repo, "worktree", "remove", "wt-libs-1", "--json")
    env = json.loads(res.stdout)
    assert res.returncode == 1 and "uncommitted work: 1 untracked file" in env["error"]["message"]
    res = cli(repo, "worktree", "remove", "wt-libs-1", "--save")
    assert res.returncode == 0, res.stderr
    assert "saved: refs/gitlease/quarantine/wt-libs-1/" in res.stdout
    assert f"lease still held, now by this worktree: {lease2}" in res.stdout
    assert cli(repo, "release", lease2).returncode == 0

    res = cli(repo, "acquire", "--scope", "x", "--base", "main")
    assert res.returncode == 2 and "--base and --branch need --worktree" in res.stderr
    res = cli(repo, "acquire", "--scope", "x", "--worktree", "--base", "nope", "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["error"]["kind"] == "usage"


def test_worktrees_not_made_by_gitlease_are_listed_but_never_touched(repo, clock, tmp_path):
    mine = tmp_path / "my own"
    git(repo, "worktree", "add", "-q", "-b", "mine", str(mine))
    (mine / "scratch").write_text("mine\n")
    m = manager(repo, clock)
    assert [(e.state, e.lease_state) for e in m.list()] == [("unmanaged", "none")]
    assert m.acquire(["a"], ttl=TTL).path != str(mine) and m.prune() == []
    with pytest.raises(UsageError, match="not attached by gitlease"):
        m.remove(str(mine))
    assert (mine / "scratch").read_text() == "mine\n"


def test_a_lease_on_a_remote_named_by_flag_is_renewable_inside_its_worktree(repo, clock, remote_file):
    r = Repo.discover(repo)
    m = WorktreeManager(LeaseService(r, resolve(r.config, env={}, remote=remote_file.url, agent="a"), clock=clock))
    att = m.acquire(["a"], ttl=TTL)
    assert git(att.path, "config", "--worktree", "lease.remote").strip() == remote_file.url
    inside = manager(att.path, clock).svc  # no --remote: the worktree's own config names the store
    assert inside.store.name == m.svc.store.name and inside.renew(att.lease_id).record.version == 2
    inside.release(att.lease_id)


def test_remove_save_refuses_a_nested_repository_it_could_not_keep(repo, clock, tmp_path):
    m = manager(repo, clock)
    att = m.acquire(["a"], ttl=TTL)
    nested = Path(att.path) / "vendor" / "lib"
    git(tmp_path, "init", "-q", str(nested))
    (nested / "only-here.txt").write_text("precious\n")
    with pytest.raises(GitLeaseError, match="contains another repository"):
        m.remove(att.id, save=True)
    assert (nested / "only-here.txt").read_text() == "precious\n"


def test_a_lease_acquired_inside_a_released_worktree_keeps_it_out_of_the_pool(repo, clock):
    m = manager(repo, clock)
    first = m.acquire(["a"], ttl=TTL)
    inside = manager(first.path, clock).svc
    extra = inside.acquire(["docs"], ttl=TTL)  # the agent took another scope from inside its worktree
    inside.release(first.lease_id)
    assert m.acquire(["b"], ttl=TTL).id != first.id and m.prune() == []
    inside.release(extra.lease_id)
    assert m.acquire(["c"], ttl=TTL).reused


def test_two_cli_processes_at_once_get_different_worktrees(repo):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    procs = [
        subprocess.Popen(
            ["git", "lease", "acquire", "--scope", scope, "--worktree", "--json"],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for scope in ("services/svc", "libs/svc")
    ]  # the same name: wt-svc-1 and wt-svc-2
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    docs = [json.loads(out)["result"] for out, _ in outs]
    paths = {d["worktree"]["path"] for d in docs}
    assert {d["workspaceId"] for d in docs} == {os.path.basename(p) for p in paths} == {"wt-svc-1", "wt-svc-2"}


def test_the_worktree_a_command_runs_in_is_not_handed_out(repo, clock):
    m = manager(repo, clock)
    first = m.acquire(["a"], ttl=TTL)
    release_in(first, clock)
    assert manager(first.path, clock).acquire(["b"], ttl=TTL).id != first.id


def test_an_expired_lease_whose_holder_process_lives_is_not_reclaimed(repo, clock):
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        m = manager(repo, clock)
        att = m.acquire(["a"], ttl=TTL, holder_pid=holder.pid)
        clock.advance(TTL + 31)  # expired beyond the skew margin, but its holder may still be writing
        assert [(a.action, a.reasons) for a in m.prune()] == [
            ("skipped", [f"lease holder process {holder.pid} is alive"])
        ]
        assert m.acquire(["b"], ttl=TTL).id != att.id
    finally:
        holder.communicate(b"")
    assert [a.action for a in m.prune() if a.id == att.id] == ["pooled"]
    assert held_in(att.path) == {}  # the dead lease's entry is forgotten on the way into the pool
    assert m.acquire(["c"], ttl=TTL).reused


def test_run_worktree_runs_the_command_inside_the_attached_worktree(repo):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    res = subprocess.run(
        [
            "git",
            "lease",
            "run",
            "--scope",
            "src",
            "--worktree",
            "--",
            "sh",
            "-c",
            "pwd; git config lease.enforce; git lease status --json",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    where, mode, status = res.stdout.split("\n", 2)
    assert os.path.basename(where).startswith("wt-src-") and mode == "strict"
    lease = json.loads(status)["result"]["leases"][0]
    assert lease["heldHere"] and lease["paths"] == ["src"]  # held (and renewed) from inside the worktree
    assert "lease released" in res.stderr and "the command runs there" in res.stderr
    assert (
        subprocess.run(
            ["git", "lease", "status", "--json"], cwd=repo, env=env, capture_output=True, text=True
        ).stdout.count("leaseId")
        == 0
    )


def test_find_prefers_a_worktrees_id_over_another_ones_git_admin_name(repo, clock):
    """git names a worktree's admin folder itself: one worktree's admin name can be another's id (the fleet
    soak saw the wrong worktree quarantined). ``find`` answers the id first."""
    m = manager(repo, clock)
    one = m.add(m.svc.acquire(["libs/a"], ttl=TTL).lease_id)
    two = m.add(m.svc.acquire(["libs/b"], ttl=TTL).lease_id)
    common = Path(git(repo, "rev-parse", "--git-common-dir").strip())
    if not common.is_absolute():
        common = Path(repo) / common

    def rename_admin(att, new: str) -> None:
        old = Path(git(att.path, "rev-parse", "--git-dir").strip())
        (common / "worktrees" / new).parent.mkdir(exist_ok=True)
        old.rename(common / "worktrees" / new)
        Path(att.path, ".git").write_text(f"gitdir: {common / 'worktrees' / new}\n")

    rename_admin(two, "zz-elsewhere")  # listed after the other (git lists admin folders in order)
    rename_admin(one, two.id)  # the first worktree's admin folder now bears the second one's id
    assert os.path.basename(m.find(two.id).git_dir) == "zz-elsewhere"
    assert m.find(two.id).path == two.path and m.find(one.id).path == one.path
