"""Task outcomes (gitlease/service/outcomes.py) are written like leases: signed by the runner's key, moved
only forward (a final outcome reopened only by ``--rerun``), deleted only by an audited prune, a ``done`` only
naming a commit on its branch; the server hook refuses anything else, and a runner ignores (and reports) an
outcome it cannot verify. A task id means one thing: a queue line whose id was done with other content is
refused. Every attempt is counted on the store, whatever fails, so every queue ends. A lease that can be
granted can be released and reclaimed through the server hook, however many paths it holds.

Each test here fails on a tree without the rule it names."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import cli, git
from test_identity import Signed

from gitlease.core.refnames import outcome_ref, quarantine_ref
from gitlease.core.store import RefUpdate
from gitlease.service.outcomes import Outcomes, prune
from testing.servers import make_bare


@pytest.fixture
def guarded(tmp_path):
    """A signed store behind the server hook: agents a, b, c trusted, eve not; the store's main has a commit."""
    bare = make_bare(tmp_path / "remote.git")
    assert cli(bare, "install-hooks", "--server").returncode == 0
    fleet = Signed(tmp_path, bare.as_uri())
    return fleet, bare


def refused(svc, update: RefUpdate) -> str:
    """The server's reasons for refusing ``update`` (asserting it was refused)."""
    out = svc.store.apply([update])
    assert not out.ok, "the server accepted it"
    return " ".join(out.server)


def test_an_outcome_without_a_trusted_signature_is_refused_by_the_server_hook(guarded):
    fleet, bare = guarded
    for who in (None, "eve"):  # no key at all; a key nobody trusts
        forger = fleet.agent("a", key=who)
        oid, _ = Outcomes(forger).make("t1", "done", 1, parent=None, reason="forged")
        why = refused(forger, RefUpdate(outcome_ref("t1"), oid, None))
        assert "not a gitlease task outcome" in why and ("unsigned" in why or "not trusted" in why), why
    assert Outcomes(fleet.agent("a")).write("t1", "retrying", 1, parent=None, reason="real") is not None


def test_a_push_of_many_done_outcomes_refuses_only_the_one_whose_commit_is_not_on_its_branch(guarded):
    """A landing train's push writes one outcome a task: the hook judges their landed commits in one walk, and
    when one is not on its branch it still names that outcome alone."""
    fleet, bare = guarded
    a = fleet.agent("a")
    book = Outcomes(a)
    on_main = git(bare, "rev-parse", "refs/heads/main").strip()
    landed = {"t1": on_main, "t2": "2" * 40, "t3": on_main}
    updates = {}
    for task, commit in landed.items():
        oid, _ = book.make(task, "done", 1, parent=None, landed=commit, branch="refs/heads/main")
        updates[task] = RefUpdate(outcome_ref(task), oid, None)
    out = a.store.apply(list(updates.values()))
    why = " ".join(out.server)
    assert not out.ok and f"{outcome_ref('t2')}: not a gitlease task outcome" in why, why
    assert "(2222222222" in why and outcome_ref("t1") not in why and outcome_ref("t3") not in why, why
    del updates["t2"]
    assert a.store.apply(list(updates.values())).ok  # every commit on main: one push, accepted


def test_outcomes_only_move_forward_and_are_deleted_only_by_a_recorded_prune(guarded):
    fleet, bare = guarded
    a = fleet.agent("a")
    book = Outcomes(a)
    done = book.write("t1", "done", 1, parent=None, reason="nothing to land")
    assert done is not None
    # rewound without a rerun: refused; deleted outright: refused (the exactly-once back door)
    back, _ = book.make("t1", "retrying", 1, parent=done.oid, reason="again")
    assert "only git lease work --rerun ID reopens it" in refused(a, RefUpdate(outcome_ref("t1"), back, done.oid))
    why = refused(a, RefUpdate(outcome_ref("t1"), None, done.oid))
    assert "deleted only by a recorded prune" in why, why
    # reopened by a rerun (its attempts start again): accepted
    again = book.write("t1", "retrying", 0, parent=done.oid, reason="reopened", rerun=True)
    assert again is not None
    # a done naming a commit that is not on its branch: refused
    missing = "1" * 40
    fake, _ = book.make("t1", "done", 1, parent=again.oid, landed=missing, branch="refs/heads/main")
    assert "is not on refs/heads/main" in refused(a, RefUpdate(outcome_ref("t1"), fake, again.oid))
    # parked work: never overwritten, deleted only by a prune
    work = a.repo.cwd
    git(work, "commit", "-q", "--allow-empty", "-m", "work")
    head = git(work, "rev-parse", "HEAD").strip()
    parked = quarantine_ref("t1", 1)
    assert a.store.apply([RefUpdate(parked, head, None)]).ok
    git(work, "commit", "-q", "--allow-empty", "-m", "other")
    other = git(work, "rev-parse", "HEAD").strip()
    assert "never overwritten" in refused(a, RefUpdate(parked, other, head))
    assert "deleted only by a recorded prune" in refused(a, RefUpdate(parked, None, head))
    # the prune: the final outcome and its parked work, one audit entry, accepted
    final = book.write("t1", "failed", 1, parent=again.oid, reason="given up", quarantine=parked)
    assert final is not None
    got = prune(a, 0.5, now=a.clock.now() + 60)
    assert got.tasks == ["t1"] and got.refs == 2 and got.audit
    left = git(bare, "for-each-ref", "--format=%(refname)", "refs/leases/outcome/", "refs/leases-quarantine/")
    assert left == ""


def _runner(fleet, bare, name="a"):
    """A clone of ``bare`` set up as agent ``name``'s runner (its key signs leases and outcomes)."""
    repo = fleet.base / f"runner-{name}"
    git(fleet.base, "clone", "-q", bare.as_uri(), str(repo))
    git(repo, "config", "lease.remote", "origin")
    git(repo, "config", "lease.agent", name)
    git(repo, "config", "lease.signingKey", fleet.keys[name].path)
    return repo


AGENT = r"""
import json, os, subprocess, sys
task = json.load(sys.stdin)
for p in task["paths"]:
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    with open(p, "a") as fh:
        fh.write("edited by " + task["id"] + "\n")
subprocess.run(["git", "add", "-A"], check=True)
subprocess.run(["git", "commit", "-q", "--no-verify", "-m", "task " + task["id"]], check=True)
"""


def _work(repo: Path, tasks, *args, timeout=180):
    agent = repo.parent / "agent.py"
    agent.write_text(AGENT)
    q = repo.parent / "queue.jsonl"
    q.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    res = cli(repo, "work", str(q), "--land", "main", "--json", *args, "--", sys.executable, str(agent),
              timeout=timeout)  # fmt: skip
    events = [json.loads(line) for line in res.stdout.splitlines()[:-1]]
    return res, events


def test_a_runner_ignores_an_outcome_it_cannot_verify_and_says_so(tmp_path):
    """A forged ``done`` written straight into the store (no server hook to refuse it) does not make a runner
    skip the task: the outcome is ignored, reported, and the task runs and lands."""
    bare = make_bare(tmp_path / "remote.git")
    fleet = Signed(tmp_path, bare.as_uri())
    forger = fleet.agent("a", key=None)
    oid, _ = Outcomes(forger).make("t1", "done", 1, parent=None, reason="forged")
    assert forger.store.apply([RefUpdate(outcome_ref("t1"), oid, None)]).ok
    repo = _runner(fleet, bare)
    res, events = _work(repo, [{"id": "t1", "paths": ["src/x.py"]}])
    assert res.returncode == 0, res.stdout + res.stderr
    said = [e for e in events if e["event"] == "error" and "outcome of t1 ignored" in e.get("message", "")]
    assert said and "unsigned" in said[0]["message"], events
    assert any(e["event"] == "landed" and e["task"] == "t1" for e in events), events


def test_an_outcome_the_store_could_not_serve_is_unknown_not_unreadable_and_is_read_once_it_can(guarded):
    """A runner that lists an outcome while the store goes away cannot fetch its object. That is "cannot read
    the store" (RemoteUnavailable: the worker tries again), and nothing is remembered of it: once the store is
    back the same outcome is read. It used to be remembered as "no outcome.json" for good: the task looked
    unstarted, and the fleet soak's runner claimed it again and again, each claim refused, forever."""
    from gitlease.core.errors import RemoteUnavailable

    fleet, bare = guarded
    done = Outcomes(fleet.agent("a")).write("t1", "done", 1, parent=None, reason="nothing to land")
    assert done is not None
    book = Outcomes(fleet.agent("b"))  # another clone: the outcome's objects are not there yet
    listing = {outcome_ref("t1"): done.oid}
    away = bare.with_name("away.git")
    bare.rename(away)  # the server is down
    try:
        with pytest.raises(RemoteUnavailable, match="could not be fetched"):
            book.read(listing)
    finally:
        away.rename(bare)
    got = book.read(listing)
    assert got["t1"].state == "done" and book.ignored == {}


def test_a_task_id_means_one_thing_and_rerun_reopens_a_done_task(guarded):
    fleet, bare = guarded
    repo = _runner(fleet, bare)
    res, events = _work(repo, [{"id": "t1", "paths": ["src/x.py"], "prompt": "first"}])
    assert res.returncode == 0, res.stdout + res.stderr
    # the same line again: done, skipped (a resume), nothing runs
    res, events = _work(repo, [{"id": "t1", "paths": ["src/x.py"], "prompt": "first"}])
    assert res.returncode == 0 and not any(e["event"] == "claimed" for e in events), events
    # the same id with other content: refused, naming the earlier outcome, nothing runs
    res, events = _work(repo, [{"id": "t1", "paths": ["src/x.py"], "prompt": "second"}])
    assert res.returncode == 1, res.stdout + res.stderr
    refusal = [e for e in events if e["event"] == "refused" and e["task"] == "t1"]
    assert refusal and "git lease work --rerun t1" in refusal[0]["message"], events
    assert not any(e["event"] == "claimed" for e in events)
    # --rerun: reopened (recorded), run and landed again
    res, events = _work(repo, [{"id": "t1", "paths": ["src/x.py"], "prompt": "second"}], "--rerun", "t1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert [e["event"] for e in events if e["task"] == "t1"].count("landed") == 1
    log = git(bare, "log", "--format=%s", "main").split("\n")
    assert log.count("task t1") == 2


# ------------------------------------------------------------------------------ every task ends


def test_a_stray_claim_ref_is_counted_and_the_queue_ends(guarded):
    fleet, bare = guarded
    repo = _runner(fleet, bare)
    head = git(fleet.main, "rev-parse", "HEAD").strip()
    git(bare, "update-ref", "refs/leases/task/t1", head)  # a claim ref no lease owns, left by hand
    res, events = _work(repo, [{"id": "t1", "paths": ["src/x.py"]}, {"id": "t2", "paths": ["src/y.py"]}],
                        "--attempts", "2", "--backoff", "0")  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    failed = [e for e in events if e["event"] == "failed" and e["task"] == "t1"]
    assert failed and "the claim was refused" in failed[0]["message"], events
    assert any(e["event"] == "landed" and e["task"] == "t2" for e in events), events


def test_an_agent_that_deletes_its_worktrees_git_file_is_counted_and_the_queue_ends(guarded):
    fleet, bare = guarded
    repo = _runner(fleet, bare)
    breaker = repo.parent / "breaker.py"
    breaker.write_text("import os, json, sys\njson.load(sys.stdin)\nos.remove('.git')\n")
    q = repo.parent / "q.jsonl"
    q.write_text(json.dumps({"id": "b1", "paths": ["src/x.py"]}) + "\n")
    res = cli(repo, "work", str(q), "--land", "main", "--json", "--attempts", "2", "--backoff", "0", "--",
              sys.executable, str(breaker), timeout=180)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()[:-1]]
    assert [e["event"] for e in events].count("failed") == 1, events
    assert json.loads(res.stdout.splitlines()[-1])["error"]["details"]["summary"]["failed"] == ["b1"]


@pytest.mark.parametrize(
    ("task", "said"),
    [
        ({"id": "a\nb", "paths": ["x"]}, "control character"),
        ({"id": "t1", "paths": [f"d{i}/f" for i in range(1100)], "scope": [f"d{i}" for i in range(1100)]}, "1100"),
    ],
)
def test_a_queue_line_no_lease_can_carry_is_refused_at_load_with_its_line(guarded, task, said):
    fleet, bare = guarded
    repo = _runner(fleet, bare)
    q = repo.parent / "q.jsonl"
    q.write_text(json.dumps({"id": "ok", "paths": ["y"]}) + "\n" + json.dumps(task) + "\n")
    res = cli(repo, "work", str(q), "--", "true")
    assert res.returncode == 2 and "line 2" in res.stderr and said in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_task_landing_beyond_its_own_scope_is_refused_unless_allowed(guarded):
    """An agent that extends its lease to a free path mid-task and commits there: refused at landing (the
    task's own scope bounds it), landed with --allow-extend."""
    fleet, bare = guarded
    repo = _runner(fleet, bare)
    grower = repo.parent / "grower.py"
    grower.write_text(
        "import json, os, subprocess, sys\n"
        "task = json.load(sys.stdin)\n"
        "subprocess.run(['git', 'lease', 'extend', os.environ['GITLEASE_LEASE'], '--scope', 'docs'], check=True)\n"
        "os.makedirs('docs', exist_ok=True)\n"
        "open('docs/more.md', 'a').write('grown\\n')\n"
        "os.makedirs('src', exist_ok=True)\n"
        "open(task['paths'][0], 'a').write('x\\n')\n"
        "subprocess.run(['git', 'add', '-A'], check=True)\n"
        "subprocess.run(['git', 'commit', '-q', '--no-verify', '-m', 'task ' + task['id']], check=True)\n"
    )
    for flag, expect in (([], 1), (["--allow-extend"], 0)):
        q = repo.parent / "q.jsonl"
        q.write_text(json.dumps({"id": f"g{len(flag)}", "paths": ["src/x.py"]}) + "\n")
        res = cli(repo, "work", str(q), "--land", "main", "--json", "--attempts", "1", *flag, "--",
                  sys.executable, str(grower), timeout=180)  # fmt: skip
        assert res.returncode == expect, res.stdout + res.stderr
        if expect:
            assert "outside the task's own scope" in res.stdout, res.stdout
    assert git(bare, "log", "--format=%s", "main").count("task g") == 1


# ------------------------------------------------------------------------------ releases of big leases


def test_a_lease_with_many_long_paths_is_released_and_reclaimed_through_the_server_hook(guarded):
    """The release's audit entry lists every ref and path of the lease: over the old 64 KiB entry limit for this
    lease (the fleet trial's 403-path lease could be taken but never released). One limit for writer and server
    now, checked before the lease is granted."""
    fleet, bare = guarded
    a = fleet.agent("a")
    paths = [f"pkg/{'long-folder-name-' * 5}{i:04d}/module.py" for i in range(400)]
    got = a.acquire(paths, ttl=60)
    a.release(got.lease_id)
    assert git(bare, "for-each-ref", "refs/leases/id/") == ""
    got = a.acquire(paths, ttl=60)
    a.forget(got.lease_id)  # its holder is gone: it expires, and b clears it on the way to its own acquire
    fleet.clock.advance(60 + 31)
    b = fleet.agent("b")
    mine = b.acquire(paths[:1], ttl=60)
    assert got.lease_id in mine.cleared
    log = git(bare, "for-each-ref", "--format=%(refname)", "refs/leases-audit/").split()
    assert log, "the reclaim was recorded"
    assert os.path.getsize(bare) >= 0
