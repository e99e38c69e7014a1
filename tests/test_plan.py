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
    # auto: small leaf folders and small workspace members are leased whole; manifests of large packages,
    # files next to subfolders and files in wide flat folders are leased alone (the package trap avoided).
    assert suggest(["crates/core/src/sync/mutex.rs"], "auto", tree) == ("crates/core/src/sync",)
    assert suggest(
        ["crates/core/Cargo.toml", "crates/core/src/lib.rs", "crates/core/big/f3.rs", "README.md", "py/pyproject.toml"],
        "auto",
        tree,
    ) == ("README.md", "crates/core/Cargo.toml", "crates/core/big/f3.rs", "crates/core/src/lib.rs", "py")
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
    assert out["scopes"]["t4"] == ["py", "web"] and out["acquired"] == []  # two small workspace members
    assert out["startByGranularity"] == {"auto": 2, "file": 2, "dir": 1, "package": 1}

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
    assert res.returncode == 0 and res.stdout.splitlines()[0] == "start: t4  py web"
    assert "could start now by granularity: auto 1, file 1, dir 1, package 1" in res.stdout
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


# ------------------------------------------------------------ auto on wide folders, queues and the traces


def test_auto_leases_a_wide_flat_folder_file_by_file():
    # requests' layout: one flat folder of 20 modules. Leasing it whole made it a global lock.
    flat = [f"src/requests/m{i}.py" for i in range(20)] + ["docs/user/a.rst", "docs/user/b.rst", "pyproject.toml"]
    tree = RepoTree.from_paths(flat)
    assert suggest(["src/requests/m3.py"], "auto", tree) == ("src/requests/m3.py",)
    assert suggest(["docs/user/a.rst"], "auto", tree) == ("docs/user",)  # a small leaf folder stays whole
    assert suggest(["pyproject.toml"], "auto", tree) == ("pyproject.toml",)  # the root package: never whole
    # A folder at the limit is leased whole, one entry more is not.
    from gitlease.plan.suggest import AUTO_MAX_DIR_ENTRIES

    at = RepoTree.from_paths([f"a/b/f{i}" for i in range(AUTO_MAX_DIR_ENTRIES)] + ["x"])
    over = RepoTree.from_paths([f"a/b/f{i}" for i in range(AUTO_MAX_DIR_ENTRIES + 1)] + ["x"])
    assert suggest(["a/b/f0"], "auto", at) == ("a/b",) and suggest(["a/b/f0"], "auto", over) == ("a/b/f0",)


def test_auto_leases_a_small_workspace_member_whole_and_a_large_one_by_file():
    files = ["Cargo.toml", "big/Cargo.toml", "small/Cargo.toml", "small/src/lib.rs", "small/src/mac.rs"]
    files += [f"big/src/m{i}.rs" for i in range(30)] + ["big/src/lib.rs", "big/src/sub/x.rs"]
    tree = RepoTree.from_paths(files)
    assert suggest(["small/Cargo.toml"], "auto", tree) == ("small",)
    assert suggest(["small/src/lib.rs"], "auto", tree) == ("small",)
    assert suggest(["big/Cargo.toml"], "auto", tree) == ("big/Cargo.toml",)  # the package trap avoided
    assert suggest(["big/src/lib.rs"], "auto", tree) == ("big/src/lib.rs",)
    assert suggest(["big/src/sub/x.rs"], "auto", tree) == ("big/src/sub",)


def test_auto_in_a_queue_leases_a_folder_whole_only_where_no_nearby_task_works():
    from gitlease.plan.suggest import AUTO_QUEUE_WINDOW

    tree = RepoTree.from_paths(["lib/sync/a.rs", "lib/sync/b.rs", "lib/sync/c.rs", "lib/net/tcp.rs", "lib/lib.rs"])

    def scopes_of(rows):
        lines = [json.dumps(r) for r in rows]
        return {t.id: t.scope for t in parse_tasks(lines, tree=tree)}

    # Two tasks on different files of one small folder: each leases its file, so they run side by side.
    got = scopes_of([{"id": "t1", "paths": ["lib/sync/a.rs"]}, {"id": "t2", "paths": ["lib/sync/b.rs"]}])
    assert got == {"t1": ("lib/sync/a.rs",), "t2": ("lib/sync/b.rs",)}
    # Tasks naming the same file wait for each other anyway: the folder stays whole for both.
    got = scopes_of([{"id": "t1", "paths": ["lib/sync/a.rs"]}, {"id": "t2", "paths": ["lib/sync/a.rs"]}])
    assert got == {"t1": ("lib/sync",), "t2": ("lib/sync",)}
    # An explicit scope inside the folder counts like a path; a task alone in its folder leases it whole.
    got = scopes_of(
        [{"id": "t1", "paths": ["lib/sync/a.rs", "lib/net/tcp.rs"]}, {"id": "t2", "scope": ["lib/sync/c.rs"]}]
    )
    assert got["t1"] == ("lib/net", "lib/sync/a.rs") and got["t2"] == ("lib/sync/c.rs",)
    # Tasks further apart in the queue than the window never run together: both lease the folder.
    filler = [{"id": f"f{i}", "paths": ["lib/lib.rs"]} for i in range(AUTO_QUEUE_WINDOW)]
    far = [{"id": "t1", "paths": ["lib/sync/a.rs"]}, *filler, {"id": "t2", "paths": ["lib/sync/b.rs"]}]
    near = [{"id": "t1", "paths": ["lib/sync/a.rs"]}, *filler[1:], {"id": "t2", "paths": ["lib/sync/b.rs"]}]
    assert scopes_of(far)["t1"] == ("lib/sync",) and scopes_of(far)["t2"] == ("lib/sync",)
    assert scopes_of(near)["t1"] == ("lib/sync/a.rs",) and scopes_of(near)["t2"] == ("lib/sync/b.rs",)
    # Other granularities ignore the queue.
    assert parse_tasks([json.dumps(r) for r in near], granularity="dir", tree=tree)[0].scope == ("lib/sync",)


DATA = os.path.join(os.path.dirname(__file__), "data")


def _trace(name):
    with open(os.path.join(DATA, f"{name}-tail240.jsonl"), encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    return [r for r in rows if r["paths"]]


def _makespan(tasks, workers):
    """The queue worker's schedule with unit task times: at each event, plan against the scopes in flight and
    start what the plan allows on the free workers."""
    queue, running, now = list(tasks), [], 0
    while queue or running:
        free = workers - len(running)
        if free and queue:
            p = plan(queue, [(t.id, t.scope) for _, t in running], limit=free)
            started = set(p.start)
            running += [(now + 1, p.tasks[tid]) for tid in p.start]
            queue = [t for t in queue if t.id not in started]
        now = min(end for end, _ in running)
        running = [(end, t) for end, t in running if end > now]
    return now


@pytest.mark.parametrize("name", ["requests", "tokio"])
def test_auto_on_the_traces_waits_no_more_than_file_and_still_leases_folders(name):
    """The last commits of requests (a flat package) and tokio (a workspace) as queues, 5 workers."""
    rows = _trace(name)
    tree = RepoTree.from_paths(p for r in rows for p in r["paths"])
    lines = [json.dumps({"id": r["id"], "paths": r["paths"]}) for r in rows]
    for n in (30, len(rows)):
        by = {g: parse_tasks(lines[-n:], granularity=g, tree=tree) for g in ("auto", "file", "dir", "package")}
        span = {g: _makespan(ts, 5) for g, ts in by.items()}
        one = _makespan(by["file"], 1)
        assert span["auto"] <= span["file"] * 1.05, (n, span)
        assert one / span["auto"] > 1.5, (n, span)  # a real speed-up, not a global lock
        assert span["dir"] > span["auto"] and span["package"] > span["auto"], (n, span)
    # auto still leases whole folders where no nearby task works (files a task adds or forgets are covered)
    whole = [t for t in by["auto"] if t.scope != tuple(sorted(set(t.paths)))]
    assert len(whole) >= len(rows) // 20, len(whole)
    if name == "requests":
        assert "src/requests/models.py" in tree.files
        assert all("src/requests" not in t.scope for t in by["auto"])  # the flat package is never one lock


# ------------------------------------------------------------------- tasks no lease can hold


def _covered(paths, scope):
    return all(any(s == ROOT or p == s or p.startswith(s + "/") for s in scope) for p in paths)


def test_a_task_no_lease_can_hold_is_flagged_and_leases_the_finest_coarser_scope_that_fits():
    """Real histories have commits of 858 and 5,013 files (a vendored tree, a formatting pass): over the
    1,024-path or the 64 kB record limit, a lease on their files is refused, so the task could never start.
    The planner flags it and leases the coarser scope that fits: still covering every path."""
    from gitlease.plan.suggest import lease_problem

    many = [f"vendor/lib{k % 40}/src/m{k % 7}/file_{k}.rs" for k in range(5013)]
    wide = [f"tokio/src/runtime/scheduler/multi_thread_alt/worker_{k}/implementation_detail_{k}.rs" for k in range(858)]
    for paths, gran in ((many, "file"), (wide, "file"), (many, "auto")):
        task = make_task("big", paths=paths, granularity=gran, tree=RepoTree.from_paths(many + wide))
        assert task.oversized and task.asked == len(set(paths)), task.oversized
        assert ("over the limit of 1024 paths" in task.oversized) == (paths is many)
        assert lease_problem(task.scope) is None and _covered(paths, task.scope)
        assert task.scope != (ROOT,) and len(task.scope) > 1  # coarser, not the whole repository
        assert task.to_json()["oversized"] == {"paths": len(set(paths)), "problem": task.oversized, "proposed": []}
    named = make_task("named", scope=wide)  # a scope named in the queue: kept as named, one that fits proposed
    assert named.oversized and named.scope == tuple(sorted(wide)) and lease_problem(named.scope) is not None
    assert lease_problem(named.proposed) is None and _covered(wide, named.proposed)
    assert named.to_json()["oversized"]["proposed"] == list(named.proposed)
    small = make_task("small", paths=wide[:10], granularity="file")
    assert small.oversized is None and small.scope == tuple(sorted(wide[:10]))
    p = plan([T("a", "vendor/lib1/src/m3/x.rs"), make_task("big", paths=many, granularity="file")], [])
    assert p.start == ("a",) and [b.id for b in p.blocked] == ["big"]  # the coarser scope overlaps a's
    assert [o["id"] for o in p.to_json()["oversized"]] == ["big"]


def test_cli_plan_flags_an_oversized_task_and_acquires_its_coarser_scope(workspace_repo, remote_file, tmp_path):
    git(workspace_repo, "config", "lease.remote", remote_file.url)
    many = [f"vendor/lib{k % 40}/src/file_{k}.rs" for k in range(1500)]
    tasks = _tasks_file(tmp_path / "q.jsonl", [{"id": "huge", "paths": many}])
    res = cli(workspace_repo, "plan", str(tasks), "--acquire", "1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("start: huge  vendor/lib0/src vendor/lib1/src vendor/lib10/src "), lines[0]
    assert (
        "oversized: huge  1500 paths: 1500 paths, over the limit of 1024 paths per lease; leasing the coarser "
        "40-path scope instead"
    ) in lines
    assert any(ln.startswith("lease acquired: lease_") and ln.endswith(" for huge") for ln in lines), lines


def test_the_plan_bench_replays_a_history_with_oversized_commits(tmp_path):
    """bench/plan.py on a history whose commits include one of 1,500 files: the replay leases the coarser scope
    the planner proposes and runs every task (it used to stop at the first acquire, refused as too large)."""
    from gitlease.core.clock import FakeClock

    bench = _bench_module("plan")
    huge = tuple(f"vendor/lib{k % 40}/src/file_{k}.rs" for k in range(1500))
    commits = [
        bench.Commit("c1", ("src/a.rs",), 3),
        bench.Commit("c2", huge, 5),
        bench.Commit("c3", ("vendor/lib3/src/file_3.rs", "src/b.rs"), 2),
        bench.Commit("c4", ("docs/x.md",), 1),
    ]
    every = sorted({p for c in commits for p in c.paths})
    worktrees = bench.make_repo(tmp_path / "repo", every, 2)
    tree = read_tree(str(tmp_path / "repo"))
    for gran in ("file", "auto"):
        tasks = bench.scoped_tasks(commits, gran, tree)
        assert [t.id for t in tasks if t.oversized] == ["c2"]
        clock = FakeClock()
        r = bench.replay(commits, tasks, bench.open_agents(worktrees, 2, None, clock), gran, gran, clock)
        assert r.acquires == r.releases == 4 and r.collisions == 0
    assert "1 task(s) change more files than one lease can hold (up to 1,500 paths" in bench.oversized_note(
        commits, tree
    )
