"""The store's verified record decides what a writer may land; the worktree's own ``held.json`` is a cache that
may only narrow it. An agent (any shell command it runs) that adds a path to its ``held.json`` gains nothing:
``git lease push``, the pre-push hook, MCP ``lease_push`` and the landing of ``git lease work`` all refuse a
commit into another agent's live lease, and say why. And a holder stops at its lease's stop deadline
(``stopBy``), not at its expiry: the commit hook and the edit guard refuse from then on.

Every test here fails on a tree where those decisions read ``held.json``'s paths or its expiry."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from conftest import cli, git
from test_guard import edit
from test_hooks import acquire, run

from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.errors import ScopeViolation
from gitlease.core.repo import Repo
from gitlease.service.leases import LeaseService
from testing.gitutil import seed_bare
from testing.servers import make_bare

FORGED = "only the local held.json lists it"


def clone(base, bare, name):
    path = base / name
    git(base, "clone", "-q", str(bare), str(path))
    git(path, "config", "lease.remote", "origin")
    git(path, "config", "lease.agent", name)
    return path


def forge(repo, extra: str, *, record: bool = False) -> None:
    """What a tampering agent does: add ``extra`` to every lease in this worktree's held.json (and, with
    ``record``, to the record bytes the next renewal is built from)."""
    gdir = git(repo, "rev-parse", "--absolute-git-dir").strip()
    path = os.path.join(gdir, "gitlease", "held.json")
    with open(path) as fh:
        doc = json.load(fh)
    for h in doc["leases"].values():
        h["paths"] = sorted(set(h["paths"]) | {extra})
        if record:
            rec = json.loads(h["record"])
            rec["scope"]["paths"] = sorted(set(rec["scope"]["paths"]) | {extra})
            h["record"] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    with open(path, "w") as fh:
        json.dump(doc, fh)


@pytest.fixture
def two(tmp_path):
    """A bare remote (no server hook: only the client decides), A holding ``svc`` and B holding ``docs``, and
    A's commit into ``docs`` and the free ``lib`` made with --no-verify on main."""
    bare = make_bare(tmp_path / "remote.git")
    seed = tmp_path / "seed"
    git(tmp_path, "init", "-q", "-b", "main", str(seed))
    git(seed, "commit", "-q", "--allow-empty", "-m", "init")
    git(seed, "push", "-q", str(bare), "main")
    a, b = clone(tmp_path, bare, "a"), clone(tmp_path, bare, "b")
    lease_a = acquire(a, "svc", agent="a", task="ta")
    acquire(b, "docs", agent="b", task="tb")
    (a / "docs").mkdir()
    (a / "docs" / "guide.md").write_text("A writes into B's lease\n")
    (a / "lib").mkdir()
    (a / "lib" / "k.py").write_text("and into a free path\n")
    git(a, "add", "docs", "lib")
    git(a, "commit", "-q", "--no-verify", "-m", "into docs")
    before = git(bare, "rev-parse", "main").strip()
    return bare, a, lease_a, before


def test_a_forged_held_json_does_not_widen_git_lease_push(two):
    bare, a, lease_a, before = two
    forge(a, "docs")
    forge(a, "lib")
    res = cli(a, "push", "origin", "main")
    assert res.returncode == 4, res.stderr
    assert "  docs/guide.md: scope docs, held by lease_" in res.stderr  # B's live lease is named
    assert f"  lib/k.py: scope lib, this push's lease {lease_a} does not hold it on the lease store" in res.stderr
    assert FORGED in res.stderr
    assert git(bare, "rev-parse", "main").strip() == before  # nothing landed


def test_a_forged_record_in_held_json_does_not_widen_the_push_after_a_renewal(two):
    """The record bytes a renewal is built from widened too: the renewed version names ``docs`` but no scope ref
    of A's lease holds it, so the push is still refused."""
    bare, a, lease_a, before = two
    forge(a, "docs", record=True)
    cli(a, "renew", lease_a)  # whatever it does, it cannot grant docs
    res = cli(a, "push", "origin", "main")
    assert res.returncode in (4, 6), res.stderr
    assert git(bare, "rev-parse", "main").strip() == before


def test_a_forged_held_json_does_not_widen_the_pre_push_hook(two):
    bare, a, lease_a, before = two
    assert cli(a, "install-hooks").returncode == 0
    forge(a, "docs")
    forge(a, "lib")
    res = run(a, "push", "-q", "origin", "main")
    assert res.returncode != 0 and FORGED in res.stderr, res.stderr
    assert git(bare, "rev-parse", "main").strip() == before


def test_a_forged_held_json_does_not_widen_the_mcp_push(two):
    from gitlease.mcp.session import Session

    bare, a, lease_a, before = two
    forge(a, "docs")
    forge(a, "lib")
    session = Session(str(a))
    try:
        with pytest.raises(ScopeViolation) as info:
            session.push("main", lease_a)
        assert FORGED in info.value.message or FORGED in json.dumps(info.value.details)
    finally:
        session.close()
    assert git(bare, "rev-parse", "main").strip() == before


# The fake agent of test_work, plus: forge held.json (add FORGE to its paths), then write into STRAY.
FORGING_AGENT = r"""
import json, os, subprocess, sys
task = json.load(sys.stdin)
gdir = subprocess.run(["git", "rev-parse", "--absolute-git-dir"], capture_output=True, text=True).stdout.strip()
path = os.path.join(gdir, "gitlease", "held.json")
doc = json.load(open(path))
for h in doc["leases"].values():
    h["paths"] = sorted(set(h["paths"]) | {task["forge"]})
json.dump(doc, open(path, "w"))
for p in task["paths"] + [task["stray"]]:
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    with open(p, "a") as fh:
        fh.write("edited by " + task["id"] + "\n")
subprocess.run(["git", "add", "-A"], check=True)
subprocess.run(["git", "commit", "-q", "--no-verify", "-m", "task " + task["id"]], check=True)
"""


def test_a_task_that_forges_held_json_is_refused_at_landing(tmp_path):
    bare = seed_bare(tmp_path, ["src/x.py", "docs/guide.md"])
    runner, other = clone(tmp_path, bare, "runner"), clone(tmp_path, bare, "other")
    acquire(other, "docs", agent="other", task="theirs")  # B's live lease
    agent = tmp_path / "agent.py"
    agent.write_text(FORGING_AGENT)
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "t1", "paths": ["src/x.py"], "forge": "docs", "stray": "docs/guide.md"}) + "\n")
    before = git(bare, "rev-parse", "main").strip()
    res = cli(runner, "work", str(q), "--land", "main", "--attempts", "2", "--backoff", "0", "--json", "--",
              sys.executable, str(agent), timeout=180)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()[:-1]]
    failed = [ev for ev in events if ev["event"] == "failed"]
    assert failed and "docs/guide.md (held by lease_" in failed[0]["message"], events
    assert "attempt 1" in failed[0]["message"]  # a refusal at landing is final: not retried
    assert git(bare, "rev-parse", "main").strip() == before  # nothing landed in B's lease
    # its release went through although held.json lists a path the lease never held (taken from the store)
    assert git(bare, "for-each-ref", "--format=%(refname)", "refs/leases/id/").count("\n") == 1  # B's only


# ------------------------------------------------------------------------ the stop deadline


@pytest.fixture
def stopped(make_repo):
    """A lease whose holder promised to stop 60 s after its grant (``stopBy``), granted 100 s ago with a TTL of
    300 s: past its stop deadline, 200 s before its expiry (an MCP session's or a runner's lease, whose stop
    deadline lets sweepers reclaim it early)."""
    repo = make_repo("work")
    r = Repo.discover(repo)
    svc = LeaseService(r, resolve(r.config, env={}, agent="a", task="t"), clock=FakeClock(time.time() - 100))
    got = svc.acquire(["services"], ttl=300, stop_after=60)
    assert got.record.stop_deadline < time.time() < got.record.expires
    return repo, got


def test_the_commit_hook_stops_at_the_stop_deadline_not_the_expiry(stopped):
    repo, got = stopped
    assert cli(repo, "install-hooks").returncode == 0
    (repo / "services").mkdir()
    (repo / "services" / "x.py").write_text("x\n")
    git(repo, "add", "services")
    res = run(repo, "commit", "-q", "-m", "after the stop deadline")
    assert res.returncode == 1
    assert f"passed its stop deadline {got.record.stop_by}" in res.stderr, res.stderr


def test_the_edit_guard_stops_at_the_stop_deadline_not_the_expiry(stopped):
    repo, got = stopped
    res = edit(repo, "services/x.py")
    assert res.returncode == 2, res.stderr
    assert got.lease_id in res.stderr
