"""The planner (pure rules), scope suggestion on a real repository, and `git lease plan` against a real remote."""

import json
import os
import subprocess
import sys

import pytest
from conftest import cli, git
from hypothesis import given, settings
from hypothesis import strategies as st

from gitlease.core.errors import UsageError
from gitlease.core.record import Owner, new_record
from gitlease.core.scope import ROOT, sets_overlap
from gitlease.plan.planner import Task, blocking_leases, make_task, parse_tasks, plan, plan_queue, start_tasks
from gitlease.plan.suggest import RepoTree, parse_granularity, read_tree, suggest
from gitlease.service.views import LeaseView, Snapshot


def T(tid, *scope):
    return make_task(tid, scope=scope)


# ------------------------------------------------------------------------------ the rules


def test_start_blocked_and_what_blocks():
    leases = [("lease_a", ("services/billing",)), ("lease_b", ("libs",))]
    q = [
        T("t1", "services/billing/tax"),
        T("t2", "services/tax"),
        T("t3", "services"),
        T("t4", "libs/x", "docs"),
        T("t5", "docs/readme"),
        T("t6", "web"),
    ]
    p = plan(q, leases)
    assert p.start == ("t2", "t6")
    by = {b.id: b for b in p.blocked}
    assert by["t1"].leases == ("lease_a",) and by["t1"].tasks == ()
    assert by["t3"].by == ("lease_a", "t1", "t2")  # leases first, then earlier tasks in queue order
    assert by["t4"].by == ("lease_b",)
    assert by["t5"].by == ("t4",)  # t4 waits for lease_b; t5 may not take docs/ ahead of it
    assert [b.id for b in p.blocked] == ["t1", "t3", "t4", "t5"]
    assert p.to_json()["blocked"][1] == {
        "id": "t3",
        "by": ["lease_a", "t1", "t2"],
        "leases": ["lease_a"],
        "tasks": ["t1", "t2"],
    }


def test_a_later_task_never_overtakes_an_earlier_overlapping_one():
    # t1 wants the whole repository and is blocked by a lease: nothing behind it may start (no starvation),
    # even tasks the lease itself does not block.
    p = plan([T("t1", ROOT), T("t2", "a"), T("t3", "b")], [("L", ("x",))])
    assert p.start == () and [b.by for b in p.blocked] == [("L",), ("t1",), ("t1",)]
    # Without the blocked whole-repository task, the disjoint ones start side by side.
    assert plan([T("t2", "a"), T("t3", "b")], [("L", ("x",))]).start == ("t2", "t3")
    # Same paths twice in the queue: the first starts, the second waits for it.
    p = plan([T("t1", "a/b"), T("t2", "a/b/c"), T("t3", "a/bc")], [])
    assert p.start == ("t1", "t3") and p.blocked[0].by == ("t1",)


def test_limit_stops_the_scan_without_changing_the_decisions():
    q = [T(f"t{i}", f"d{i % 3}/f{i}") for i in range(9)] + [T("w", "d0")]
    full = plan(q, [("L", ("d1",))])
    part = plan(q, [("L", ("d1",))], limit=2)
    assert part.start == full.start[:2]
    assert all(b in full.blocked for b in part.blocked)
    assert (
        part.deferred
        and part.deferred[-1] == "w"
        and len(part.start) + len(part.blocked) + len(part.deferred) == len(q)
    )


SEG = st.sampled_from(["a", "ab", "b"])
SCOPE = st.one_of(st.just(ROOT), st.lists(SEG, min_size=1, max_size=3).map("/".join))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(SCOPE, min_size=1, max_size=2), max_size=6),
    st.lists(st.lists(SCOPE, min_size=1, max_size=2), min_size=1, max_size=12),
)
def test_plan_matches_its_definition(lease_scopes, task_scopes):
    leases = [(f"L{i}", tuple(s)) for i, s in enumerate(lease_scopes)]
    tasks = [T(f"t{i}", *s) for i, s in enumerate(task_scopes)]
    p = plan(tasks, leases)
    blocked = {b.id: b for b in p.blocked}
    for i, t in enumerate(tasks):
        want_l = tuple(lid for lid, ps in leases if sets_overlap(ps, t.scope))
        want_t = tuple(e.id for e in tasks[:i] if sets_overlap(e.scope, t.scope))
        if want_l or want_t:
            assert blocked[t.id].leases == want_l and blocked[t.id].tasks == want_t
        else:
            assert t.id in p.start
    started = [t for t in tasks if t.id in p.start]
    assert not any(sets_overlap(x.scope, y.scope) for i, x in enumerate(started) for y in started[i + 1 :])


def _view(lid, paths, expires_in, invalid=False):
    now = 1_800_000_000
    if invalid:
        return LeaseView(lid, paths, record=None, problems=["scope refs point at an invalid record"])
    rec = new_record(
        lease_id=lid,
        repo="r",
        paths=paths,
        workspace_id="w",
        owner=Owner(task_id="t", agent_id="a", host="h", pid=0),
        now=now - 1000,
        ttl=1000 + expires_in,
    )
    return LeaseView(lid, paths, record=rec)


def test_blocking_leases_fail_closed_on_invalid_and_honour_the_skew_margin():
    now, skew = 1_800_000_000, 30
    active, grace, expired = "lease_" + "a" * 16, "lease_" + "g" * 16, "lease_" + "e" * 16
    snap = Snapshot(
        [
            _view(active, ("a",), 50),
            _view(grace, ("b",), -10),
            _view(expired, ("c",), -100),
            _view("?bad", ("d",), 0, invalid=True),
        ],
        now,
    )
    assert [lid for lid, _ in blocking_leases(snap, now, skew)] == [active, grace, "?bad"]
    p = plan([T("t1", "a"), T("t2", "b"), T("t3", "c"), T("t4", "d/x")], blocking_leases(snap, now, skew))
    assert p.start == ("t3",) and [b.by for b in p.blocked] == [(active,), (grace,), ("?bad",)]


def test_parse_tasks_and_its_errors():
    q = parse_tasks(
        ['{"id": "a", "scope": ["x/./y/", "x/y/z"]}', "", "# comment", '{"id": 7, "paths": ["src/m.rs", "src/n.rs"]}'],
        granularity="dir",
    )
    assert q == [Task("a", ("x/y",)), Task("7", ("src",), ("src/m.rs", "src/n.rs"), suggested=True)]
    bad = {
        "not json": "line 1: not JSON",
        '["a"]': "expected an object",
        '{"scope": ["a"]}': '"id"',
        '{"id": "a"}': "neither",
        '{"id": "a", "scope": "x"}': "list of strings",
        '{"id": "a", "scope": ["../up"]}': "'..'",
        '{"id": "a", "paths": []}': "no scope",
    }
    for line, words in bad.items():
        with pytest.raises(UsageError, match=words):
            parse_tasks([line])
    with pytest.raises(UsageError, match="line 2: task id 'a' appears twice"):
        parse_tasks(['{"id": "a", "scope": ["x"]}', '{"id": "a", "scope": ["y"]}'])
    with pytest.raises(UsageError, match="unknown granularity"):
        parse_granularity("depth:0")


# ------------------------------------------------------------------------ scope suggestion


@pytest.fixture
def workspace_repo(make_repo):
    """A real repository with package roots of every kind and a workspace manifest at the root."""
    repo = make_repo("ws")
    files = [
        "Cargo.toml",
        "README.md",
        "crates/core/Cargo.toml",
        "crates/core/src/lib.rs",
        "crates/core/src/sync/mutex.rs",
        "crates/core/src/sync/rwlock.rs",
        "crates/core/tests/a.rs",
        "py/pyproject.toml",
        "py/pkg/mod.py",
        "web/package.json",
        "web/src/app.js",
        "go/go.mod",
        "go/cmd/tool/main.go",
        "docs/guide/intro.md",
    ]
    files += [f"crates/core/big/f{i}.rs" for i in range(25)]
    for f in files:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_text("x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    (repo / "untracked").mkdir()
    (repo / "untracked" / "Cargo.toml").write_text("not committed\n")  # on disk only: never a package root
    return repo


def test_suggestion_at_each_granularity_on_a_real_tree(workspace_repo):
    tree = read_tree(str(workspace_repo))
    assert tree.packages == {".", "crates/core", "py", "web", "go"}
    paths = ["crates/core/src/sync/mutex.rs", "crates/core/Cargo.toml", "py/pkg/mod.py", "README.md"]
    assert suggest(paths, "file", tree) == tuple(sorted(paths))
    assert suggest(paths, "dir", tree) == (".",)  # README.md's folder is the whole repository
    assert suggest(paths[:3], "dir", tree) == ("crates/core", "py/pkg")
    assert suggest(["go/cmd/tool/main.go", "web/src/app.js", "py/pkg/mod.py"], "package", tree) == ("go", "py", "web")
    assert suggest(["crates/core/src/lib.rs", "crates/core/Cargo.toml"], "package", tree) == ("crates/core",)
    assert suggest(["docs/guide/intro.md"], "package", tree) == (".",)  # the root workspace's package
    assert suggest(["crates/core/src/sync/mutex.rs", "docs/guide/intro.md"], "depth:2", tree) == (
        "crates/core",
        "docs/guide",
    )
    # auto: small leaf folders are leased whole; manifests, files next to subfolders and files in large
    # flat folders are leased alone (the package trap avoided).
    assert suggest(["crates/core/src/sync/mutex.rs"], "auto", tree) == ("crates/core/src/sync",)
    assert suggest(
        ["crates/core/Cargo.toml", "crates/core/src/lib.rs", "crates/core/big/f3.rs", "README.md", "py/pyproject.toml"],
        "auto",
        tree,
    ) == ("README.md", "crates/core/Cargo.toml", "crates/core/big/f3.rs", "crates/core/src/lib.rs", "py/pyproject.toml")
    assert suggest(["crates/core/tests/a.rs", "crates/core/tests/new.rs"], None, tree) == ("crates/core/tests",)
    assert suggest(["new/dir/file.rs"], "auto", tree) == ("new/dir/file.rs",)
    assert suggest(["crates/core/src"], "dir", tree) == ("crates/core/src",)  # a folder stays itself


def test_read_tree_of_a_repository_without_commits(tmp_path):
    git(tmp_path, "init", "-q", "empty")
    (tmp_path / "empty" / "go.mod").write_text("module x\n")
    tree = read_tree(str(tmp_path / "empty"))
    assert tree.files == frozenset() and tree.packages == frozenset()
    assert suggest(["a/b.go"], "package", tree) == ("a/b.go",)


def test_tree_from_paths_counts_folders():
    tree = RepoTree.from_paths(["a/b/c.rs", "a/d.rs", "e.rs"])
    assert tree.dirs == {".": [1, 1], "a": [1, 1], "a/b": [1, 0]}


# ------------------------------------------------------------------- with a real lease store


def _tasks_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_plan_and_acquire_against_a_remote_with_active_leases(workspace_repo, make_repo, remote_file, tmp_path):
    other = make_repo("other")
    for r in (workspace_repo, other):
        git(r, "config", "lease.remote", remote_file.url)
    res = cli(other, "acquire", "--scope", "crates/core/src", "--agent", "holder", "--json")
    assert res.returncode == 0, res.stderr
    held = json.loads(res.stdout)["result"]["leaseId"]
    tasks = _tasks_file(
        tmp_path / "q.jsonl",
        [
            {"id": "t1", "paths": ["crates/core/src/sync/mutex.rs"]},
            {"id": "t2", "paths": ["crates/core/Cargo.toml"]},
            {"id": "t3", "scope": ["crates"]},
            {"id": "t4", "paths": ["web/src/app.js", "py/pkg/mod.py"]},
            {"id": "t5", "paths": ["crates/core/tests/a.rs"]},
        ],
    )
    res = cli(workspace_repo, "plan", str(tasks), "--json")
    assert res.returncode == 0, res.stderr
    env = json.loads(res.stdout)
    assert env["ok"] and env["command"] == "plan"
    out = env["result"]
    assert out["start"] == ["t2", "t4"] and out["granularity"] == "auto" and out["leases"] == 1
    assert [(b["id"], b["by"]) for b in out["blocked"]] == [("t1", [held]), ("t3", [held, "t1", "t2"]), ("t5", ["t3"])]
    assert out["scopes"]["t4"] == ["py/pkg", "web/src"] and out["acquired"] == []

    res = cli(workspace_repo, "plan", str(tasks), "--granularity", "package")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:2] == ["start: t4  py web", f"blocked: t1  crates/core  by {held}"]

    envp = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    res = subprocess.run(
        ["git", "lease", "plan", "-", "--acquire", "1", "--json"],
        cwd=workspace_repo,
        input=tasks.read_text(),
        capture_output=True,
        text=True,
        env=envp,
        timeout=60,
    )  # stdin
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["result"]["acquired"]
    assert len(got) == 1 and got[0]["id"] == "t2" and got[0]["ok"] and got[0]["leaseId"].startswith("lease_")

    res = cli(other, "status", "--json")
    leases = {tuple(x["paths"]): x for x in json.loads(res.stdout)["result"]["leases"]}
    assert leases[("crates/core/Cargo.toml",)]["owner"]["taskId"] == "t2"
    res = cli(workspace_repo, "plan", str(tasks))  # t2 now runs under its lease; t4 is still free
    assert res.returncode == 0 and res.stdout.splitlines()[0] == "start: t4  py/pkg web/src"
    assert "blocked: t2  crates/core/Cargo.toml  by " + got[0]["leaseId"] in res.stdout


def test_cli_plan_usage_errors(workspace_repo, tmp_path):
    res = cli(workspace_repo, "plan", str(tmp_path / "missing.jsonl"), "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["error"]["kind"] == "usage"
    bad = _tasks_file(tmp_path / "bad.jsonl", [{"id": "a", "scope": ["/abs"]}])
    res = cli(workspace_repo, "plan", str(bad))
    assert res.returncode == 2 and "line 1" in res.stderr and "Traceback" not in res.stderr
    ok = _tasks_file(tmp_path / "ok.jsonl", [{"id": "a", "scope": ["x"]}])
    res = cli(workspace_repo, "plan", str(ok), "--granularity", "bogus")
    assert res.returncode == 2 and "unknown granularity" in res.stderr


def test_start_tasks_reports_a_scope_taken_between_plan_and_acquire(tmp_path, remote_file):
    from helpers import Fleet

    fleet = Fleet(tmp_path, remote_file.url)
    worker, rival = fleet.agent("worker"), fleet.agent("rival")
    q = [T("t1", "a"), T("t2", "b"), T("t3", "c"), T("t4", "a/x")]
    the_plan, snap = plan_queue(worker, q)
    assert the_plan.start == ("t1", "t2", "t3") and snap.leases == []
    grabbed = rival.acquire(["b/deep"])  # after the plan was read
    results = start_tasks(worker, the_plan, 2)
    assert [(r.id, r.ok, r.kind) for r in results] == [("t1", True, None), ("t2", False, "held"), ("t3", True, None)]
    assert results[1].blockers == (grabbed.lease_id,) and grabbed.lease_id in results[1].error
    view = {v.lease_id: v for v in worker.snapshot().leases}
    assert view[results[0].lease_id].record.owner.task_id == "t1" and view[results[2].lease_id].paths == ("c",)
    worker.release(results[0].lease_id)  # the worker's worktree holds them: it can release them
    again, _ = plan_queue(worker, q)
    assert again.start == ("t1",) and {b.id: b.by for b in again.blocked}["t2"] == (grabbed.lease_id,)


# ------------------------------------------------------------------------ the benchmark's report file


def _bench_module(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_bench_sections_survive_each_others_rewrites(tmp_path):
    run, plan_bench = _bench_module("run"), _bench_module("plan")
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\nold figures\n")
    plan_bench.write_section(doc, "<!-- plan:begin -->\nplan v1\n<!-- plan:end -->\n", plan_bench.BEGIN, plan_bench.END)
    text = doc.read_text()
    assert text.startswith("# Performance\nold figures\n") and "plan v1" in text
    text += "\n<!-- hooks:begin -->\nhooks\n<!-- hooks:end -->\n"
    doc.write_text(text)
    rewritten = run.keep_marked_sections("# Performance\nnew figures\n", doc)
    assert "old figures" not in rewritten and "new figures" in rewritten
    assert "plan v1" in rewritten and "<!-- hooks:begin -->\nhooks\n<!-- hooks:end -->" in rewritten
    doc.write_text(rewritten)
    plan_bench.write_section(doc, "<!-- plan:begin -->\nplan v2\n<!-- plan:end -->\n", plan_bench.BEGIN, plan_bench.END)
    text = doc.read_text()
    assert "plan v1" not in text and text.count("plan v2") == 1 and "new figures" in text and "hooks\n" in text
