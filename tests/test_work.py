"""``git lease work`` (docs/work.md) with real git: a bare remote guarded by the server hook, clones, real
``git lease work`` processes and fake agents that edit exactly their task's files (unless told otherwise)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import read_terminal, wait_file

from gitlease.core.errors import GitLeaseError
from testing.gitutil import cli, git, seed_bare

FILES = ["src/a/x.py", "src/b/y.py", "src/c/z.py", "docs/guide.md", "docs/api.md", "lib/k.py"]

# The fake agent: reads the task on stdin, appends a line to each of its paths, commits. Behaviour by the
# task's own fields: "fail" (exit 1 on attempts up to N), "crash" (SIGKILL itself on attempt 1), "stray" (also
# edit that path, committed with --no-verify), "lose" (delete its lease's refs on the remote: the lease is
# lost, on attempt 1), "wait" (wait for that file to appear first), "hang" (never end), "forget" (take its
# lease out of its worktree's held.json, then exit 1: on attempt 1).
AGENT = r"""
import json, os, signal, subprocess, sys, time
task = json.load(sys.stdin)
with open(os.environ["GITLEASE_TASK_FILE"]) as fh:
    assert json.load(fh)["id"] == task["id"]
attempt = int(os.environ["GITLEASE_ATTEMPT"])
assert os.environ["GITLEASE_TASK"] == task["id"] and os.environ["GITLEASE_LEASE"].startswith("lease_")
log = task.get("log")
if log:
    with open(log, "a") as fh:
        fh.write(json.dumps({"task": task["id"], "attempt": attempt, "cwd": os.getcwd(), "argv": sys.argv[1:],
                             "scope": os.environ["GITLEASE_SCOPE"],
                             "refs": subprocess.run(["git", "ls-remote", "origin", "refs/leases/*"],
                                                    capture_output=True, text=True).stdout}) + "\n")
if task.get("progress"):  # report progress, then wait (bounded) for a renewal to carry it to the store
    got = subprocess.run(["git", "lease", "progress", task["progress"]], capture_output=True, text=True)
    seen = False
    for _ in range(900):
        oid = subprocess.run(["git", "-C", task["remote"], "rev-parse", "-q", "--verify",
                              "refs/leases/id/" + os.environ["GITLEASE_LEASE"]], capture_output=True, text=True)
        rec = subprocess.run(["git", "-C", task["remote"], "cat-file", "-p", oid.stdout.strip() + ":lease.json"],
                             capture_output=True, text=True).stdout
        if task["progress"] in rec:
            seen = True
            break
        time.sleep(0.1)
    with open(task["report"], "w") as fh:
        json.dump({"rc": got.returncode, "out": got.stdout + got.stderr, "seen": seen}, fh)
if task.get("wait"):
    while not os.path.exists(task["wait"]):
        time.sleep(0.05)
if task.get("hang"):
    time.sleep(3600)
if task.get("forget") and attempt == 1:
    git_dir = subprocess.run(["git", "rev-parse", "--git-dir"], capture_output=True, text=True).stdout.strip()
    held = os.path.join(git_dir, "gitlease", "held.json")
    with open(held) as fh:
        doc = json.load(fh)
    doc["leases"].pop(os.environ["GITLEASE_LEASE"])
    with open(held, "w") as fh:
        json.dump(doc, fh)
    sys.exit(1)
if attempt <= task.get("fail", 0):
    sys.exit(1)
if task.get("noop"):  # changes nothing: nothing to land, and its lease is released on its own
    sys.exit(0)
if task.get("crash") and attempt == 1:
    os.kill(os.getpid(), signal.SIGKILL)
if task.get("lose") and attempt == 1:
    remote = task["lose"]
    refs = subprocess.run(["git", "-C", remote, "for-each-ref", "--format=%(refname)", "refs/leases/"],
                          capture_output=True, text=True, check=True).stdout.split()
    for ref in refs:
        if not ref.startswith("refs/leases/outcome/"):
            subprocess.run(["git", "-C", remote, "update-ref", "-d", ref], check=True)
for p in task["paths"] + ([task["stray"]] if task.get("stray") else []):
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    with open(p, "a") as fh:
        fh.write(f"edited by {task['id']} attempt {attempt}\n")
subprocess.run(["git", "add", "-A"], check=True)
subprocess.run(["git", "commit", "-q", "--no-verify", "-m", f"task {task['id']}"], check=True)
"""


@pytest.fixture
def world(tmp_path):
    """A bare remote with the server hook, a seed commit holding FILES, and a factory of clones."""
    bare = seed_bare(tmp_path, FILES)
    res = cli(bare, "install-hooks", "--server")
    assert res.returncode == 0, res.stderr
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)

    class World:
        remote = bare
        root = tmp_path
        command = [sys.executable, str(agent)]

        def clone(self, name: str) -> Path:
            path = tmp_path / name
            git(tmp_path, "clone", "-q", str(bare), str(path))
            git(path, "config", "lease.remote", "origin")
            return path

        def queue(self, tasks, name="queue.jsonl") -> Path:
            q = tmp_path / name
            q.write_text("".join(json.dumps(t) + "\n" for t in tasks))
            return q

        def landed(self) -> list[str]:
            """Subjects of the commits on the remote's main, oldest first."""
            return git(bare, "log", "--reverse", "--format=%s", "main").split("\n")[1:-1]

        def lease_refs(self) -> list[str]:
            out = git(bare, "for-each-ref", "--format=%(refname)", "refs/leases/")
            return [r for r in out.split() if not r.startswith("refs/leases/outcome/")]

    return World()


def work(cwd, *args, timeout=120):
    return cli(cwd, "work", *args, timeout=timeout)


def status(cwd, queue) -> dict:
    res = cli(cwd, "work", "--status", str(queue), "--json")
    assert res.returncode == 0, res.stderr
    return {t["id"]: t for t in json.loads(res.stdout)["result"]["tasks"]}


def hold_lander(lander, tickets: int) -> None:
    """The lander's first turn waits (at most 120 s) until ``tickets`` tasks are in its lane (a seam)."""
    import threading

    real, full = lander._loop, threading.Event()

    def loop():
        if not full.is_set():
            with lander._cond:  # told of each task that enters the lane
                lander._cond.wait_for(lambda: len(lander._lane) >= tickets, timeout=120)
            full.set()
        real()

    lander._loop = loop


def land_elsewhere(other: Path, text: str = "bumped\n", message: str = "bump") -> None:
    """Another pusher moves the remote's main first: a commit of the clone ``other`` on top of it."""
    (other / "README.md").write_text(text)
    git(other, "add", "-A")
    git(other, "commit", "-q", "-m", message)
    git(other, "pull", "-q", "--rebase", "origin", "main")
    git(other, "push", "-q", "origin", "HEAD:main")


def test_a_queue_lands_each_task_once_claim_and_scope_in_one_push(world):
    log = world.root / "agent.log"
    tasks = [
        {"id": "t1", "paths": ["src/a/x.py"], "prompt": "fix it", "log": str(log)},
        {"id": "t2", "paths": ["src/b/y.py"], "log": str(log)},
        {"id": "t3", "paths": ["src/a/x.py", "docs/guide.md"], "log": str(log)},  # waits for t1's scope
    ]
    a, q = world.clone("a"), world.queue(tasks)
    options = ("--workers", "2", "--land", "main", "--verify", "test -f src/a/x.py")
    res = work(a, str(q), *options, "--", *world.command, "{id}", "{path}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(world.landed()) == ["task t1", "task t2", "task t3"]
    assert world.landed().index("task t1") < world.landed().index("task t3")
    assert "done 3, failed 0" in res.stdout and "parallelism" in res.stdout
    assert world.lease_refs() == []  # every lease and claim released
    # t3 ran on a base holding t1's change (fetched after its grant)
    assert git(world.remote, "show", "main:src/a/x.py") == "x\nedited by t1 attempt 1\nedited by t3 attempt 1\n"
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    for r in runs:
        assert r["argv"] == [r["task"], r["cwd"]]  # {id} and {path} expanded
        refs = dict(line.split("\t")[::-1] for line in r["refs"].splitlines())
        claim = refs[f"refs/leases/task/{r['task']}"]
        # the claim points at the lease's grant, as its scope refs do: created in the acquire's one push (the
        # server hook refuses a task ref created any other way: test_a_claim_alone_is_refused_by_the_server)
        scope_refs = [o for ref, o in refs.items() if ref.startswith("refs/leases/scope")]
        assert scope_refs and claim in scope_refs
    st = status(a, q)
    assert {t: s["state"] for t, s in st.items()} == {"t1": "done", "t2": "done", "t3": "done"}
    assert st["t1"]["landed"] == git(world.remote, "log", "--format=%H", "--grep=task t1", "main").strip()


def test_a_claim_alone_is_refused_by_the_server(world):
    a = world.clone("a")
    head = git(a, "rev-parse", "HEAD").strip()
    res = subprocess.run(
        ["git", "push", "origin", f"{head}:refs/leases/task/t9"], cwd=a, capture_output=True, text=True
    )
    assert res.returncode != 0 and "created only with the lease of that task" in res.stderr
    res = subprocess.run(
        ["git", "push", "origin", f"{head}:refs/leases/outcome/t9"], cwd=a, capture_output=True, text=True
    )
    assert res.returncode != 0 and "not a gitlease task outcome" in res.stderr


def test_two_runners_on_two_clones_run_each_task_once(world):
    tasks = [{"id": f"t{i}", "paths": [f"pkg{i % 3}/m{i}.py"]} for i in range(8)]
    q = world.queue(tasks)
    a, b = world.clone("a"), world.clone("b")
    args = ["work", str(q), "--workers", "2", "--land", "main", "--granularity", "file", "--", *world.command]
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    procs = [
        subprocess.Popen(
            ["git", "lease", *args], cwd=c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for c in (a, b)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(world.landed()) == sorted(f"task t{i}" for i in range(8))  # each exactly once
    claimed = [line for out, _ in outs for line in out.splitlines() if ": claimed " in line]
    # no task run twice by any worker of either runner (a claim made just after the other runner had finished
    # the task is given back at once, unrun: "another runner finished it meanwhile")
    meanwhile = [line for out, _ in outs for line in out.splitlines() if "finished it meanwhile" in line]
    assert len(claimed) - len(meanwhile) == 8, outs
    ran = [line for out, _ in outs for line in out.splitlines() if ": running " in line]
    assert sorted(line.split(": running ")[1].split(":")[0] for line in ran) == sorted(f"t{i}" for i in range(8))
    assert world.lease_refs() == []
    assert all(s["state"] == "done" and s["attempts"] == 1 for s in status(b, q).values())


def test_failures_requeue_up_to_attempts_and_name_the_kept_work(world):
    tasks = [
        {"id": "flaky", "paths": ["src/a/x.py"], "fail": 1},  # fails once, then lands
        {"id": "crash", "paths": ["src/b/y.py"], "crash": True},  # SIGKILL on attempt 1, then lands
        {"id": "lost", "paths": ["src/c/z.py"], "lose": None},  # its lease is taken on attempt 1
        {"id": "bad", "paths": ["docs/guide.md"], "fail": 9},  # fails every time
        {"id": "unverified", "paths": ["lib/k.py"]},  # the verifier refuses it every time
    ]
    tasks[2]["lose"] = str(world.remote)
    a, q = world.clone("a"), world.queue(tasks)
    options = ("--land", "main", "--attempts", "2", "--backoff", "0", "--verify", 'test "$GITLEASE_TASK" != unverified')
    res = work(a, str(q), *options, "--", *world.command)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "git-lease: 2 tasks failed: bad unverified (git lease work --status " + str(q) + ")"
    ]
    assert sorted(world.landed()) == ["task crash", "task flaky", "task lost"]
    st = status(a, q)
    assert {t: (s["state"], s["attempts"]) for t, s in st.items()} == {
        "flaky": ("done", 2),
        "crash": ("done", 2),
        "lost": ("done", 2),
        "bad": ("failed", 2),
        "unverified": ("failed", 2),
    }
    assert "exited 1" in st["bad"]["reason"] and "verifier failed" in st["unverified"]["reason"]
    assert "exited 137" in res.stdout and "lease lost" in res.stdout
    # the failed attempt's work is kept, named in the outcome: parked on the store under
    # refs/leases-quarantine/<task>/<attempt> (and under the same name here), so any clone can fetch it
    ref = st["unverified"]["quarantine"]
    assert ref == "refs/leases-quarantine/unverified/2"
    assert "edited by unverified attempt 2" in git(a, "show", f"{ref}:lib/k.py")
    assert "edited by unverified attempt 2" in git(world.remote, "show", f"{ref}:lib/k.py")
    assert world.lease_refs() == []


def test_a_stray_edit_is_refused_at_landing_and_fails_the_task_with_its_work_kept(world):
    a = world.clone("a")
    q = world.queue(
        [{"id": "s1", "paths": ["src/a/x.py"], "stray": "lib/k.py"}, {"id": "ok", "paths": ["docs/api.md"]}]
    )
    res = work(a, str(q), "--land", "main", "--attempts", "3", "--backoff", "0", "--json", "--", *world.command)
    assert res.returncode == 1
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    envelope = lines[-1]
    assert envelope["ok"] is False and envelope["error"]["kind"] == "tasks-failed"
    assert envelope["error"]["details"]["summary"]["failed"] == ["s1"]
    events = [ev["event"] for ev in lines[:-1]]
    assert "failed" in events and "landed" in events
    failed = next(ev for ev in lines[:-1] if ev["event"] == "failed")
    assert failed["task"] == "s1" and "lib/k.py" in failed["message"]
    st = status(a, q)
    assert st["s1"]["state"] == "failed" and st["s1"]["attempts"] == 1  # refused at once, not retried
    assert "edited by s1" in git(a, "show", f"{st['s1']['quarantine']}:lib/k.py")  # the work is kept
    # parked on the store although lib/k.py is outside the task's scope: the server hook does not judge the
    # paths of parked work (nothing lands by it), and another clone fetches it by the outcome's name
    b = world.clone("b")
    git(b, "fetch", "-q", "origin", f"{st['s1']['quarantine']}:{st['s1']['quarantine']}")
    assert "edited by s1" in git(b, "show", f"{st['s1']['quarantine']}:lib/k.py")
    assert world.landed() == ["task ok"]
    assert "edited" not in git(world.remote, "show", "main:lib/k.py")


def test_a_non_fast_forward_landing_is_retried(world):
    from gitlease.work.runner import run_queue

    a, other = world.clone("a"), world.clone("other")

    def bump():  # someone else lands on main between the landing's fetch and its push
        (other / "README.md").write_text("more\n")
        git(other, "add", "-A")
        git(other, "commit", "-q", "-m", "bump")
        git(other, "push", "-q", "origin", "main")

    def hook(runner):
        real, fetches = runner._fetch_base, []

        def fetch():
            got = real()
            fetches.append(got)
            if len(fetches) == 2:  # 1: after the grant; 2: the landing's
                bump()
            return got

        runner._fetch_base = fetch

    summary = run_queue(
        str(a), [{"id": "n1", "paths": ["src/a/x.py"]}], command=world.command, land="main", runner_hook=hook
    )
    assert summary.done == ["n1"] and summary.land_retries == 1
    assert world.landed() == ["bump", "task n1"]


def test_without_land_each_task_gets_its_own_branch_and_a_restart_resumes(world):
    a = world.clone("a")
    q = world.queue([{"id": "r1", "paths": ["src/a/x.py"]}])
    assert work(a, str(q), "--", *world.command).returncode == 0
    assert git(world.remote, "log", "--format=%s", "-1", "work/r1").strip() == "task r1"
    q = world.queue([{"id": "r1", "paths": ["src/a/x.py"]}, {"id": "r2", "paths": ["src/b/y.py"]}])
    res = work(a, str(q), "--json", "--", *world.command)
    assert res.returncode == 0
    summary = json.loads(res.stdout.splitlines()[-1])["result"]
    assert summary["attempts"] == 1 and summary["done"] == ["r1", "r2"]  # r1 was not run again


def test_without_land_a_remote_with_no_default_branch_is_a_usage_error_before_any_claim(world):
    """Without --land tasks start from the remote's default branch: a remote whose HEAD names no branch is said
    once, exit 2, before any task is claimed (not three failed attempts of every task)."""
    a = world.clone("a")
    git(world.remote, "symbolic-ref", "HEAD", "refs/heads/nothing")
    q = world.queue([{"id": "r1", "paths": ["src/a/x.py"]}, {"id": "r2", "paths": ["src/b/y.py"]}])
    res = work(a, str(q), "--", *world.command)
    assert res.returncode == 2, (res.stdout, res.stderr)
    said = res.stderr.strip().splitlines()
    assert len(said) == 1 and "has no default branch to start tasks from; pass --land" in said[0], res.stderr
    assert "Traceback" not in res.stderr
    assert git(world.remote, "for-each-ref", "refs/leases/") == ""  # no claim, no outcome, no audit entry


def test_a_claim_released_after_the_planning_read_is_not_reported_as_an_unclear_claim(world, monkeypatch):
    """A planning step's read of the store may still list a claim this runner's own attempt released just after
    (two workers: one reads while the other's attempt ends). Settling it finds it gone: nothing to settle and
    nothing to say (it was said as an "error" event about an "unclear claim"). The seam: the worker's read
    right after r1's failed first attempt is the read taken while that attempt ran."""
    from gitlease.service.leases import LeaseService
    from gitlease.work.runner import run_queue

    a = world.clone("a")
    real_snapshot = LeaseService.snapshot
    stale: dict = {}

    def snapshot(self, *args, **kw):
        import threading

        if stale.get("armed") and threading.current_thread().name.startswith("gitlease-work-"):
            stale["armed"] = False
            stale["served"] = True
            return stale["snap"]
        return real_snapshot(self, *args, **kw)

    monkeypatch.setattr(LeaseService, "snapshot", snapshot)
    seen: dict = {}
    events: list = []

    def on_event(e):
        events.append(e)
        if e.kind == "running" and e.task == "r1" and "snap" not in stale:
            stale["snap"] = real_snapshot(seen["runner"].svc, use_cache=False)  # r1's claim listed
        if e.kind == "retry" and e.task == "r1":
            stale["armed"] = True  # its lease released: the next planning read is the one above

    summary = run_queue(
        str(a),
        [{"id": "r1", "paths": ["src/a/x.py"], "fail": 1}],
        command=world.command,
        land="main",
        runner_hook=lambda r: seen.setdefault("runner", r),
        on_event=on_event,
    )
    lines = [e.line() for e in events]
    assert summary.done == ["r1"] and stale.get("served"), lines
    assert any(ref.endswith("/r1") for v in stale["snap"].leases for ref in v.task_refs), "it lists r1's claim"
    assert [e for e in events if e.kind == "error"] == [], lines
    assert world.landed()[-1] == "task r1" and world.lease_refs() == []


def _start(cwd, *args):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    # the git-lease process itself (what ``git lease`` runs): the signal goes to the runner, as a terminal's
    # Ctrl-C does (git, its parent, passes it on and waits for it)
    return subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "git-lease"), "work", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(proc, text: str, timeout=60.0) -> list[str]:
    seen = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"never saw {text!r}: {seen}")


def test_ctrl_c_finishes_running_tasks_releases_and_exits_130_then_a_restart_resumes(world):
    a = world.clone("a")
    go = world.root / "go"
    q = world.queue(
        [
            {"id": "c1", "paths": ["src/a/x.py"], "wait": str(go)},
            {"id": "c2", "paths": ["src/b/y.py"]},
        ]
    )
    proc = _start(a, str(q), "--land", "main", "--", *world.command)
    _wait_for(proc, "running c1")
    proc.send_signal(signal.SIGINT)
    _wait_for(proc, "taking no more tasks")
    go.write_text("")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err and "every lease released" in err
    assert world.landed() == ["task c1"] and world.lease_refs() == []
    res = work(a, str(q), "--land", "main", "--", *world.command)
    assert res.returncode == 0 and world.landed() == ["task c1", "task c2"]


def test_a_second_ctrl_c_stops_the_command_and_quarantines_its_work(world):
    a = world.clone("a")
    q = world.queue([{"id": "h1", "paths": ["src/a/x.py"], "hang": True}])
    edited = world.root / "edited"  # the command's work is in its worktree (the runner's line comes before it)
    (world.root / "pre.sh").write_text(f"echo partial >> src/a/x.py && touch '{edited}'\n")
    proc = _start(
        a, str(q), "--land", "main", "--", "sh", "-c", f"sh {world.root / 'pre.sh'} && " + " ".join(world.command)
    )
    _wait_for(proc, "running h1")
    wait_file(edited, proc)
    proc.send_signal(signal.SIGINT)
    _wait_for(proc, "taking no more tasks")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert world.lease_refs() == [] and world.landed() == []
    st = status(a, q)["h1"]
    assert st["state"] == "retrying" and st["attempts"] == 0 and st["reason"] == "interrupted"
    assert git(a, "show", f"{st['quarantine']}:src/a/x.py") == "x\npartial\n"


def test_user_errors_are_one_line_with_their_exit_code(world):
    a = world.clone("a")
    q = world.queue([{"id": "u1", "paths": ["src/a/x.py"]}])
    res = work(a, str(q))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "git-lease: git lease work needs a command after --: git lease work QUEUE -- ./agent.sh"
    ]
    bad = world.root / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    res = work(a, str(bad), "--", "true")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "line 1" in res.stderr
    res = work(a, str(world.root / "missing.jsonl"), "--", "true")
    assert res.returncode == 2 and "cannot read queue" in res.stderr
    git(a, "config", "--unset", "lease.remote")
    git(a, "config", "lease.remote", "local")
    res = work(a, str(q), "--", "true")
    assert res.returncode == 2 and "needs the lease store on a remote" in res.stderr


def test_the_python_api_with_a_task_callback_and_an_injected_clock(world):
    import gitlease
    from gitlease.core.clock import FakeClock

    a = world.clone("a")
    queued = [{"id": "p1", "paths": ["src/a/x.py"], "fail": 1}]
    calls = []

    def tasks():
        calls.append(1)
        if len(calls) == 3:
            queued.append({"id": "p2", "paths": ["src/b/y.py"]})  # a task arriving while the runner works
        return list(queued)

    clock = FakeClock(time.time())
    events = []
    summary = gitlease.work(
        tasks, repo=str(a), command=world.command, land="main", backoff=200, clock=clock, on_event=events.append
    )
    assert summary.done == ["p1", "p2"] and summary.failed == []
    assert summary.retries == 1 and summary.tasks["p1"].attempts == 2
    assert sum(clock.sleeps) >= 200  # the retry waited out its backoff on the injected clock, not in real time
    assert [e.kind for e in events].count("landed") == 2
    assert sorted(world.landed()) == ["task p1", "task p2"]


def test_work_status_reads_leases_and_outcomes_from_one_listing(world):
    """``work --status`` (like each planning step of a runner) takes the outcomes from the listing the lease
    snapshot came from (Snapshot.listing): one ``ls-remote``, and it sees the landed task's outcome."""
    a = world.clone("a")
    q = world.queue([{"id": "p1", "paths": ["src/a/x.py"]}])
    assert work(a, str(q), "--land", "main", "--", *world.command).returncode == 0
    trace = world.root / "trace"
    res = cli(a, "work", "--status", str(q), "--json", env={"GIT_TRACE": str(trace)})
    assert res.returncode == 0, res.stderr
    assert [t["state"] for t in json.loads(res.stdout)["result"]["tasks"]] == ["done"]
    assert sum("built-in: git ls-remote" in ln for ln in trace.read_text().splitlines()) == 1


def _refuse_pushes(world, test: str, message: str, *, once: bool):
    """Put a wrapper before the remote's pre-receive hook that refuses a push (``message`` on stderr) when the
    shell ``test`` (lines ending in a condition, the push's lines in ``$input``) holds, once or every time.
    Returns the flag file whose presence arms the refusal (removed by a refusal ``once``)."""
    hooks = world.remote / "hooks"
    (hooks / "pre-receive").rename(hooks / "pre-receive.real")
    flag = world.root / "refuse"
    flag.write_text("")
    setup, _, cond = test.rpartition("\n")
    drop = f"rm -f '{flag}'; " if once else ""
    wrapper = hooks / "pre-receive"
    wrapper.write_text(
        "#!/bin/sh\n"
        "input=$(cat)\n"
        f"{setup}\n"
        f"if [ -f '{flag}' ] && {cond}; then\n"
        f"  {drop}echo '{message}' >&2; exit 1\n"
        "fi\n"
        f"printf '%s\\n' \"$input\" | exec '{hooks / 'pre-receive.real'}' \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return flag


@pytest.mark.parametrize("refused", ["once", "until swept"])
def test_a_worktree_whose_release_failed_goes_back_to_the_pool_once_the_release_goes_through(world, refused):
    """A release on its own (a task with nothing to land; a landed task's lease goes back in its landing push,
    which this refusal spares) is refused by the server (once, or every time): an ``error`` event names the
    server's reason, the release is not retried in a loop, the worktree its lease still binds is kept out of
    the pool and given back after the runner's final sweep has waited out the lease and reclaimed it (the
    injected clock's time); nothing is left bound to the runner (seen over smart HTTP with a server restart in
    the fleet soak)."""
    import gitlease
    from gitlease import open_service
    from gitlease.core.clock import FakeClock
    from gitlease.worktree.manager import WorktreeManager

    # a holder's release on its own: its audit entry says "release ..." (a sweep's says otherwise), no branch
    flag = _refuse_pushes(
        world,
        "audit=$(printf '%s\\n' \"$input\" | awk '$3 ~ /^refs\\/leases-audit\\// {print $2}')\n"
        "branch=$(printf '%s\\n' \"$input\" | awk '$3 ~ /^refs\\/heads\\// {print $3}')\n"
        '[ -n "$audit" ] && [ -z "$branch" ] && git log -1 --format=%s $audit | grep -q \'^release \'',
        "release refused",
        once=refused == "once",
    )
    a = world.clone("a")
    events = []
    summary = gitlease.work(
        [{"id": "r1", "paths": ["src/a/x.py"], "noop": True}, {"id": "r2", "paths": ["src/b/y.py"]}],
        repo=str(a),
        command=world.command,
        land="main",
        clock=FakeClock(time.time()),
        on_event=events.append,
    )
    assert summary.done == ["r1", "r2"], [e.line() for e in events]
    assert world.landed() == ["task r2"]  # its lease went back in its landing push, which was not refused
    assert flag.exists() == (refused != "once")  # one release was refused; or all were
    refusals = [e for e in events if e.kind == "error" and "refused" in e.detail.get("message", "")]
    assert refusals and "release refused" in refusals[0].detail["message"], [e.line() for e in events]
    assert len(refusals) <= 2  # one per lease whose release was refused: never retried in a loop
    assert world.lease_refs() == []
    states = [w.meta.state for w in WorktreeManager(open_service(str(a))).managed()]
    assert states and all(s == "free" for s in states), states


def test_a_claim_goes_with_its_lease_when_swept_also_left_alone(world):
    """The claim of a runner that died: swept with its expired lease (audited); one left without its lease (a
    half-deleted lease) is reclaimed on its own once that lease has expired. Time is the injected clock's."""
    from gitlease import open_service
    from gitlease.core.clock import FakeClock
    from gitlease.ops.sweep import Sweeper

    a = world.clone("a")
    clock = FakeClock(time.time())
    svc = open_service(str(a), clock=clock)
    got = svc.acquire(["src/a"], ttl=60, task="t7")
    other = svc.acquire(["src/b"], ttl=60, task="t8")
    assert "refs/leases/task/t7" in world.lease_refs() and "refs/leases/task/t8" in world.lease_refs()
    view = svc.snapshot(use_cache=False).find(got.lease_id)
    assert view.refs()["refs/leases/task/t7"] == view.grant_oid and view.valid
    for ref in [r for r in world.lease_refs() if r.startswith("refs/leases/scope/src/b")] + [
        f"refs/leases/id/{other.lease_id}"
    ]:
        git(world.remote, "update-ref", "-d", ref)  # t8's claim is left alone
    left = svc.snapshot(use_cache=False).find(other.lease_id)
    assert left.paths == () and list(left.refs()) == ["refs/leases/task/t8"] and not left.valid
    assert [p.view.lease_id for p in Sweeper(svc).plan()[0]] == []  # neither has expired
    clock.advance(60 + svc.settings.skew + 1)
    done = Sweeper(svc).sweep()  # one batch: both reclaims and their entries in one push
    assert sorted(r.outcome for r in done.results) == ["reclaimed", "reclaimed"], [r.detail for r in done.results]
    assert world.lease_refs() == []


def test_on_a_terminal_a_live_view_shows_each_worker_its_task_and_scope(world):
    """Under a pseudo-terminal: worker lines (state, task, scope), the counts line, events scrolling above
    them, the summary at the end. The view redraws on every notable event, so no timing is relied on."""
    import pty

    a = world.clone("a")
    q = world.queue([{"id": "v1", "paths": ["src/a/x.py"]}, {"id": "v2", "paths": ["src/b/y.py"]}])
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], COLUMNS="200")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [
            "git",
            "lease",
            "work",
            str(q),
            "--workers",
            "2",
            "--land",
            "main",
            "--granularity",
            "file",
            "--",
            *world.command,
        ],
        cwd=a,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        chunk = read_terminal(leader, 1)
        if chunk is None or (not chunk and proc.poll() is not None):  # closed, or nothing came and it is over
            break
        out += chunk
    os.close(leader)
    assert proc.wait(30) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    assert "\x1b[" in text  # redrawn in place
    assert any(
        "worker " in line and ("v1" in line and "src/a/x.py" in line or "v2" in line and "src/b/y.py" in line)
        for line in text.splitlines()
    ), text
    assert "done 1  running" in text or "done 2  running" in text, text
    assert "landed v1" in text and "landed v2" in text, text
    assert sorted(world.landed()) == ["task v1", "task v2"]


def test_a_tasks_command_reports_progress_through_the_runners_heartbeat(world):
    """``git lease progress`` from a task's command goes to the runner's heartbeat (no second writer of the
    lease), which carries it to the store with the next renewal (TTL 30: a renewal every 10 s; a shorter TTL
    misses its deadlines on a loaded machine, which is what the lease protocol is for, not this test)."""
    a = world.clone("a")
    report = world.root / "progress.json"
    q = world.queue([{"id": "p", "paths": ["src/a/x.py"], "progress": "tests 4/10", "remote": str(world.remote),
                      "report": str(report)}])  # fmt: skip
    res = work(a, str(q), "--land", "main", "--ttl", "30", "--", *world.command, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(report.read_text())
    assert got["rc"] == 0 and "sent with the next renewal" in got["out"], got
    assert got["seen"], got
    assert world.landed() == ["task p"]


def test_a_runner_killed_with_9_leaves_its_worktree_to_a_restarted_runner_which_keeps_its_work(world):
    """kill -9 of a real runner process mid-task (its command killed too): the task's worktree stays bound to
    the dead lease, holding an uncommitted edit. A restarted runner on the same clone, once that lease has
    expired (the restarted runner's injected clock is past it: no sleep for the TTL), sweeps the lease,
    quarantines the worktree (the edit kept under a quarantine ref, never deleted), runs the task again and
    lands it; no task worktree is left outside the pool and the quarantine."""
    import gitlease
    from gitlease import open_service
    from gitlease.core.clock import FakeClock
    from gitlease.worktree.manager import WorktreeManager

    a = world.clone("a")
    go, pid_file = world.root / "go", world.root / "agent.pid"
    q = world.queue([{"id": "k1", "paths": ["src/a/x.py"], "wait": str(go)}])
    # an uncommitted edit first, then the agent (waiting for `go` before it edits and commits)
    script = f"echo partial >> src/a/x.py && echo $$ > {pid_file} && exec " + " ".join(world.command)
    proc = _start(a, str(q), "--land", "main", "--ttl", "60", "--", "sh", "-c", script)
    _wait_for(proc, "running k1")
    end = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < end:
        time.sleep(0.05)
    agent = int(pid_file.read_text())
    proc.kill()  # SIGKILL: no release, no give-back
    proc.wait()
    os.killpg(agent, signal.SIGKILL)  # its command (a session of its own) dies too
    end = time.monotonic() + 30
    while time.monotonic() < end:  # gone (or a zombie: no working directory any more)
        try:
            os.readlink(f"/proc/{agent}/cwd")
        except OSError:
            break
        time.sleep(0.05)
    left = [w for w in WorktreeManager(open_service(str(a))).managed() if w.meta.branch.startswith("work/")]
    assert [w.meta.state for w in left] == ["bound"]
    assert world.lease_refs() != []  # the dead runner's lease and claim are still on the remote

    go.write_text("")
    svc = open_service(str(a))
    clock = FakeClock(time.time() + 60 + svc.settings.skew + 5)  # past the dead lease's expiry and the skew
    events = []
    summary = gitlease.work(
        str(q), repo=str(a), command=["sh", "-c", script], land="main", clock=clock, on_event=events.append
    )
    assert summary.done == ["k1"], [e.line() for e in events]
    pruned = [e for e in events if e.kind == "pruned"]
    assert len(pruned) == 1 and pruned[0].task == "k1" and "quarantined" in pruned[0].line(), pruned
    refs = git(a, "for-each-ref", "--format=%(refname)", "refs/gitlease/quarantine/").split()
    assert len(refs) == 1 and refs[0] in pruned[0].line()
    assert git(a, "show", f"{refs[0]}:src/a/x.py") == "x\npartial\n"  # the killed run's edit, kept
    assert world.landed() == ["task k1"] and world.lease_refs() == []
    states = sorted(
        w.meta.state
        for w in WorktreeManager(open_service(str(a))).managed()
        if w.meta.branch.startswith("work/") or w.meta.state == "free"
    )
    assert states == ["free", "quarantined"]  # the re-run's worktree back in the pool; the killed one kept


def test_a_task_whose_last_attempt_died_with_its_runner_still_names_the_work_an_earlier_attempt_kept(world):
    """Attempt 1 is refused by the verifier (its work quarantined and named); attempt 2 dies with its runner
    (kill -9). The restarted runner finds the attempt never finished and, the attempts spent, fails the task:
    its outcome still names attempt 1's kept work (the fleet soak's checker found it named nothing)."""
    import gitlease
    from gitlease import open_service
    from gitlease.core.clock import FakeClock

    a, pid_file = world.clone("a"), world.root / "agent.pid"
    q = world.queue([{"id": "u1", "paths": ["src/a/x.py"]}])
    script = f'if [ "$GITLEASE_ATTEMPT" = 2 ]; then echo $$ > {pid_file}; exec sleep 3600; fi; exec ' + " ".join(
        world.command
    )
    options = ("--land", "main", "--attempts", "2", "--backoff", "0", "--ttl", "60")
    verify = ("--verify", 'test "$GITLEASE_ATTEMPT" != 1')
    proc = _start(a, str(q), *options, *verify, "--", "sh", "-c", script)
    _wait_for(proc, "running u1: worktree")
    end = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < end:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    svc = open_service(str(a))
    clock = FakeClock(time.time() + 60 + svc.settings.skew + 5)  # past the dead lease's expiry and the skew
    events = []
    summary = gitlease.work(
        str(q), repo=str(a), command=["sh", "-c", script], land="main", attempts=2, clock=clock, on_event=events.append
    )
    assert summary.failed == ["u1"], [e.line() for e in events]
    st = status(a, q)["u1"]
    assert st["state"] == "failed" and "never finished" in st["reason"], st
    assert st["quarantine"] == "refs/leases-quarantine/u1/1", st
    assert "edited by u1 attempt 1" in git(world.remote, "show", "refs/leases-quarantine/u1/1:src/a/x.py")


def test_a_landing_train_of_ready_tasks_lands_in_one_push(world):
    """Four tasks verified at the same moment land in ONE atomic push (the branch, four renewals, four outcomes),
    not four pushes racing each other. The lander is held (a seam: its loop waits) until all four are in its
    lane."""

    from gitlease.work.runner import run_queue

    a = world.clone("a")
    paths = ["src/a/x.py", "src/b/y.py", "src/c/z.py", "lib/k.py"]
    seen = {}

    def hook(runner):
        hold_lander(runner.lander, 4)
        seen["lander"] = runner.lander

    summary = run_queue(
        str(a), [{"id": f"t{i}", "paths": [p]} for i, p in enumerate(paths)], command=world.command, land="main",
        workers=4, runner_hook=hook,
    )  # fmt: skip
    assert summary.done == ["t0", "t1", "t2", "t3"] and summary.failed == []
    assert seen["lander"].rides == 1 and seen["lander"].landed == 4
    assert sorted(world.landed()) == ["task t0", "task t1", "task t2", "task t3"]
    assert summary.ran == 4 and summary.land_retries == 0  # each agent ran once


def test_a_worker_runs_its_next_task_while_its_last_one_lands(world):
    """One worker, two disjoint tasks. Once t0 is verified its worker runs t1's agent while t0 waits to land: the
    lander is held (a seam) until t1 is verified too, which never happens when a worker waits for its own
    landing. Meanwhile t0 keeps its lease (its commit is not on main yet), the live view lists both tasks as
    landing apart from the worker, and one ride then lands both."""
    import threading

    from gitlease.work.runner import run_queue

    a = world.clone("a")
    verified: dict[str, threading.Event] = {"t0": threading.Event(), "t1": threading.Event()}
    seen: dict = {}

    def on_event(ev):
        if ev.kind == "landing" and ev.task in verified:
            verified[ev.task].set()

    def hook(runner):
        lander = runner.lander
        real = lander._loop

        def loop():
            if "view" not in seen:
                seen["t1 verified first"] = verified["t1"].wait(120)
                with lander._cond:  # told of each task that enters the lane
                    lander._cond.wait_for(lambda: len(lander._lane) >= 2, timeout=120)
                seen["view"] = runner.view()
                seen["leases"] = [r for r in world.lease_refs() if r.startswith("refs/leases/task/")]
                seen["main"] = world.landed()
            real()

        lander._loop = loop
        seen["lander"] = lander

    summary = run_queue(
        str(a), [{"id": "t0", "paths": ["src/a/x.py"]}, {"id": "t1", "paths": ["src/b/y.py"]}],
        command=world.command, land="main", workers=1, runner_hook=hook, on_event=on_event,
    )  # fmt: skip
    assert seen["t1 verified first"], "the worker waited for t0 to land before running t1"
    view = seen["view"]
    assert [t["task"] for t in view["landing"]] == ["t0", "t1"], view
    assert [w["task"] for w in view["workers"]] == [None] and view["counts"]["running"] == 2, view
    assert seen["leases"] == ["refs/leases/task/t0", "refs/leases/task/t1"]  # both still held
    assert seen["main"] == []  # nothing landed yet
    assert summary.done == ["t0", "t1"] and summary.ran == 2
    assert seen["lander"].rides == 1 and sorted(world.landed()) == ["task t0", "task t1"]
    assert world.lease_refs() == []


def test_a_task_overlapping_one_that_is_landing_waits_for_its_commit(world):
    """One worker, two tasks on one file: the second is claimed only once the first's commit is on main (the
    first keeps its lease while it lands), so the second starts from it. The waiting worker is woken when the
    first ends: each of its waits is made 120 s long here (a seam), and every one ends on that change."""
    from gitlease.work.runner import run_queue

    a = world.clone("a")
    events, woken = [], []

    def hook(runner):
        real = runner._wait_change

        def wait(generation, seconds):
            real(generation, 120.0)
            woken.append(runner._generation != generation or runner.stop.is_set())

        runner._wait_change = wait

    summary = run_queue(
        str(a), [{"id": "t0", "paths": ["src/a/x.py"]}, {"id": "t1", "paths": ["src/a/x.py"]}],
        command=world.command, land="main", workers=1, on_event=events.append, runner_hook=hook,
    )  # fmt: skip
    assert summary.done == ["t0", "t1"]
    order = [(e.kind, e.task) for e in events if e.kind in ("claimed", "landed")]
    assert order == [("claimed", "t0"), ("landed", "t0"), ("claimed", "t1"), ("landed", "t1")], order
    assert world.landed() == ["task t0", "task t1"]
    text = git(world.remote, "show", "main:src/a/x.py")
    assert text.index("edited by t0") < text.index("edited by t1"), text
    assert all(woken), woken  # a wait that timed out: nobody told the worker its blocker ended


def test_a_bug_in_a_ride_leaves_no_lease_locked_and_the_queue_still_ends(world, monkeypatch):
    """A ride that raises after taking its riders' renew locks (a bug, injected: the audit entries raise once)
    leaves no lock taken: the rider's lease is given back, the failure is one line (``internal error``), the
    task runs again and the queue ends. A lock left taken once blocked that lease's release for good, and
    every worker retried the release forever."""
    import threading

    from gitlease.work.landing import Lander
    from gitlease.work.runner import run_queue

    a = world.clone("a")
    real = Lander._audit_entries
    calls = []

    def broken(riders):
        calls.append(len(riders))
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(riders)

    monkeypatch.setattr(Lander, "_audit_entries", staticmethod(broken))
    events: list = []
    got: dict = {}

    def run():
        got["summary"] = run_queue(
            str(a), [{"id": "t0", "paths": ["src/a/x.py"]}], command=world.command, land="main", backoff=0.1,
            on_event=events.append,
        )  # fmt: skip

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(180)
    assert not thread.is_alive(), "the runner never ended"
    assert got["summary"].done == ["t0"]
    said = [e.detail.get("message", "") for e in events if e.kind == "error"]
    assert any("internal error: RuntimeError: injected" in m for m in said), said
    assert world.landed() == ["task t0"] and world.lease_refs() == []


def test_after_a_refused_ride_each_rider_is_judged_on_its_own_commits_not_on_the_riders_it_was_rebased_onto(world):
    """Two disjoint tasks ride together; their push loses to another pusher after the second was rebased onto the
    first. The next ride checks and rebases each from its commit as verified: the second is not refused for the
    first's path (it once was: its rebased commit carried the first's change over the new base)."""

    from gitlease.work.runner import run_queue

    a, other = world.clone("a"), world.clone("other")
    seen: dict = {"pushes": 0}

    def hook(runner):
        lander = runner.lander
        hold_lander(lander, 2)
        real_push = lander._push

        def push(riders, tips):
            seen["pushes"] += 1
            if seen["pushes"] == 1:  # both aboard, one rebased onto the other: someone else lands first
                seen["first"] = [len(t.at.task.scope) for t in riders]
                land_elsewhere(other)
            return real_push(riders, tips)

        lander._push = push
        seen["lander"] = lander

    events = []
    summary = run_queue(
        str(a), [{"id": "r1", "paths": ["src/a/x.py"]}, {"id": "r2", "paths": ["src/b/y.py"]}],
        command=world.command, land="main", workers=2, runner_hook=hook, on_event=events.append, backoff=0.0,
    )  # fmt: skip
    lines = [e.line() for e in events]
    assert seen["first"] == [1, 1], lines  # the refused ride carried both
    assert summary.done == ["r1", "r2"] and summary.failed == [], lines
    assert summary.ran == 2 and summary.land_retries == 1, lines  # each agent ran once; one ride refused
    assert seen["lander"].rides == 2 and seen["lander"].landed == 2  # refused together, then landed together
    assert sorted(world.landed()[-2:]) == ["task r1", "task r2"]
    for t, path in (("r1", "src/a/x.py"), ("r2", "src/b/y.py")):  # each landed commit changes its own path only
        sha = git(world.remote, "log", "--format=%H", "-1", "--grep", f"^task {t}$", "main").strip()
        assert git(world.remote, "diff-tree", "--no-commit-id", "--name-only", "-r", sha).split() == [path]


def test_a_rider_whose_release_cannot_ride_leaves_the_train_before_any_other_is_rebased_onto_it(world, monkeypatch):
    """Three tasks ride together; the middle one's lease is busy renewing when the train takes the releases (its
    renew lock held, injected). It does not board: the push lands the other two, rebased one onto the other,
    and not its commit. Its verified work lands in a later push; each agent ran once. Once, a later rider was
    rebased onto it before its release was found busy: the push carried its commit without its release, the
    server hook refused the whole train, and two tasks failed (a store without the hook would have taken its
    commit with its lease unreleased)."""

    from gitlease.work import landing
    from gitlease.work.runner import run_queue

    wait = landing.LOCK_WAIT
    monkeypatch.setattr(landing, "LOCK_WAIT", 0.0)  # a busy lease leaves the ride at once (this ride only)
    a = world.clone("a")
    before = git(world.remote, "rev-parse", "main").strip()
    pushes: list = []
    held: dict = {}

    def hook(runner):
        lander = runner.lander
        hold_lander(lander, 3)
        real_check, real_push = lander._check, lander._push

        def check(train, base):
            out = real_check(train, base)
            for t in out:
                if t.at.task.id == "m2" and not pushes and "lock" not in held:  # its heartbeat "renewing" now
                    held["lock"] = t.at.held.svc._take_renew_lock(t.at.lease_id)
            return out

        def push(riders, tips):
            try:
                return real_push(riders, tips)
            finally:
                pushes.append(([t.at.task.id for t in riders], tips.get("refs/heads/main")))
                if "lock" in held:
                    held.pop("lock").close()
                    monkeypatch.setattr(landing, "LOCK_WAIT", wait)

        lander._check, lander._push = check, push

    events: list = []
    summary = run_queue(
        str(a), [{"id": f"m{i}", "paths": [p]} for i, p in enumerate(["src/a/x.py", "src/b/y.py", "src/c/z.py"], 1)],
        command=world.command, land="main", workers=3, runner_hook=hook, on_event=events.append, backoff=0.0,
    )  # fmt: skip
    lines = [e.line() for e in events]
    assert summary.done == ["m1", "m2", "m3"] and summary.failed == [], lines
    riders, tip = pushes[0]
    assert sorted(riders) == ["m1", "m3"], lines
    first = git(world.remote, "log", "--format=%s", f"{before}..{tip}").split("\n")[:-1]
    assert sorted(first) == ["task m1", "task m3"], lines  # the first push carried the riders' commits only
    assert sorted(world.landed()[-3:]) == ["task m1", "task m2", "task m3"] and world.landed().count("task m2") == 1
    assert [e.kind for e in events].count("running") == 3, lines  # each agent ran once
    assert world.lease_refs() == []


def test_a_runner_landing_alone_starts_its_next_ride_from_its_last_landing_until_another_pusher_moves_main(world):
    """Three tasks land one ride each. The first two rides fetch main (the second finds it where the first
    landed it: nobody else lands here); the third starts from what the second landed, with no fetch. Another
    pusher moves main just before the third ride's push: it is refused, the train fetches, lands, and the
    agent does not run again. No task fetches main again after its landing."""
    import threading

    from gitlease.work.runner import run_queue

    a, other = world.clone("a"), world.clone("other")
    gates = [world.root / "go2", world.root / "go3"]
    seen: dict = {"fetches": 0, "pushes": 0, "calls": 0}

    def hook(runner):
        lander, real_fetch = runner.lander, runner._fetch_base
        real_push = lander._push

        def fetch():
            seen["calls"] += 1
            if threading.current_thread().name == "gitlease-lander":
                seen["fetches"] += 1
            return real_fetch()

        def push(riders, tips):
            seen["pushes"] += 1
            if seen["pushes"] == 3:  # someone else lands first
                land_elsewhere(other)
            try:
                return real_push(riders, tips)
            finally:
                if seen["pushes"] <= len(gates):
                    gates[seen["pushes"] - 1].write_text("go\n")  # the next task's agent may end now

        runner._fetch_base, lander._push = fetch, push

    tasks = [
        {"id": "s1", "paths": ["src/a/x.py"]},
        {"id": "s2", "paths": ["src/b/y.py"], "wait": str(gates[0])},
        {"id": "s3", "paths": ["src/c/z.py"], "wait": str(gates[1])},
    ]
    events: list = []
    summary = run_queue(str(a), tasks, command=world.command, land="main", runner_hook=hook, on_event=events.append)
    lines = [e.line() for e in events]
    assert summary.done == ["s1", "s2", "s3"] and summary.failed == [], lines
    assert seen["pushes"] == 4 and summary.land_retries == 1, lines  # the third ride's push refused once
    assert seen["fetches"] == 3, lines  # rides 1 and 2, and the third's retry: not the third ride itself
    # and one for each attempt's worktree; none after a landing (the push moved origin/main itself), and each
    # worktree went back to the pool all the same, its commit found on origin/main
    assert seen["calls"] == 3 + 3 and "quarantined" not in [e.kind for e in events], lines
    assert [e.kind for e in events].count("running") == 3, lines
    assert world.landed()[-4:] == ["task s1", "task s2", "bump", "task s3"]


def _pipeline_world(world, *, bump: bool, land: str | None = "main"):
    """Two tasks, q1 and q2, on two workers; q2's agent ends only once q1's landing push is under way. The
    push waits (a seam on the store) until q2 has boarded the next ride, or 60 s; with ``bump``, another pusher
    then moves main first. ``land`` None: each task to its own branch. Returns (summary, events, seen)."""
    import threading

    from gitlease.work.runner import run_queue

    a, other = world.clone("a"), world.clone("other")
    gate = world.root / "go"
    seen: dict = {"fetches": 0, "landing pushes": 0}
    boarded = threading.Event()

    def hook(runner):
        lander, store = runner.lander, runner.svc.store
        real_fetch, real_apply, real_board = runner._fetch_base, store.apply, lander._board

        def fetch():
            if threading.current_thread().name == "gitlease-lander":
                seen["fetches"] += 1
            return real_fetch()

        def board(t, onto):
            if t.at.task.id == "q2" and seen["landing pushes"] == 1:
                seen["q2 boarded onto"] = onto
                boarded.set()
            return real_board(t, onto)

        def apply(updates, **kw):
            branch = ":refs/heads/main" if land else ":refs/heads/work/"
            if not any(branch in spec for spec in kw.get("extra_refspecs", ())):
                return real_apply(updates, **kw)
            seen["landing pushes"] += 1
            if seen["landing pushes"] == 1:
                gate.write_text("go\n")  # q2's agent ends, and q2 enters the lane while this push runs
                seen["during the push"] = boarded.wait(60)
                seen["first tip"] = kw["extra_refspecs"][0].split(":")[0]
                if bump:
                    land_elsewhere(other)
            return real_apply(updates, **kw)

        runner._fetch_base, store.apply, lander._board = fetch, apply, board

    tasks = [{"id": "q1", "paths": ["src/a/x.py"]}, {"id": "q2", "paths": ["src/b/y.py"], "wait": str(gate)}]
    events: list = []
    summary = run_queue(
        str(a), tasks, command=world.command, land=land, workers=2, runner_hook=hook, on_event=events.append
    )
    return summary, events, seen


def test_a_task_that_comes_while_a_landing_pushes_boards_the_next_ride_meanwhile(world):
    """q2 becomes ready while q1's landing push is under way: it is checked and rebased onto the commit that
    push lands while it runs, and its own push follows with no fetch and no check in between."""
    summary, events, seen = _pipeline_world(world, bump=False)
    lines = [e.line() for e in events]
    assert summary.done == ["q1", "q2"] and summary.failed == [] and summary.land_retries == 0, lines
    assert seen["during the push"], lines  # boarded while the first push ran
    assert seen["q2 boarded onto"] == seen["first tip"]  # onto what it landed
    assert seen["landing pushes"] == 2 and seen["fetches"] == 1, seen  # the second ride fetched nothing
    assert world.landed()[-2:] == ["task q1", "task q2"]
    assert [e.kind for e in events].count("running") == 2 and world.lease_refs() == []


def test_without_land_a_task_that_comes_while_a_ride_pushes_boards_the_next_one_meanwhile(world):
    """Without --land (each task to its own branch) q2, ready while q1's ride pushes, is checked over the newest
    base fetched while that push runs, and its own push follows with no fetch and no check in between."""
    summary, events, seen = _pipeline_world(world, bump=False, land=None)
    lines = [e.line() for e in events]
    assert summary.done == ["q1", "q2"] and summary.failed == [] and summary.land_retries == 0, lines
    assert seen["during the push"], lines  # boarded while the first push ran
    assert seen["landing pushes"] == 2 and seen["fetches"] == 1, seen  # the second ride fetched nothing
    for t in ("q1", "q2"):
        assert git(world.remote, "log", "--format=%s", "-1", f"work/{t}").strip() == f"task {t}"
    assert [e.kind for e in events].count("running") == 2 and world.lease_refs() == []


def test_the_riders_of_a_push_hear_it_landed_while_the_next_ride_is_still_boarding(world):
    """q2 boards the next ride while q1's landing push runs, and its boarding does not end until q1 has heard
    (its "landed" event) that its push landed: q1's outcome is told as soon as the push ends, not once the
    next ride is ready (a slow boarding, many rebases, used to hold every rider of the push before it)."""
    import threading

    from gitlease.work.runner import run_queue

    a = world.clone("a")
    gate = world.root / "go"
    q1_landed, q2_boarding = threading.Event(), threading.Event()
    seen: dict = {"landing pushes": 0}

    def hook(runner):
        lander, store = runner.lander, runner.svc.store
        real_apply, real_board = store.apply, lander._board

        def board(t, onto):
            if t.at.task.id == "q2" and seen["landing pushes"] == 1:
                q2_boarding.set()
                # set by q1's attempt thread the moment it says "landed"
                seen["q1 heard while q2 boarded"] = q1_landed.wait(60)
            return real_board(t, onto)

        def apply(updates, **kw):
            if any(spec.endswith(":refs/heads/main") for spec in kw.get("extra_refspecs", ())):
                seen["landing pushes"] += 1
                if seen["landing pushes"] == 1:
                    gate.write_text("go\n")  # q2's agent ends, and q2 enters the lane while this push runs
                    seen["q2 boarding during the push"] = q2_boarding.wait(60)
            return real_apply(updates, **kw)

        store.apply, lander._board = apply, board

    def on_event(e):
        events.append(e)
        if e.kind == "landed" and e.task == "q1":
            q1_landed.set()

    tasks = [{"id": "q1", "paths": ["src/a/x.py"]}, {"id": "q2", "paths": ["src/b/y.py"], "wait": str(gate)}]
    events: list = []
    summary = run_queue(
        str(a), tasks, command=world.command, land="main", workers=2, runner_hook=hook, on_event=on_event
    )
    lines = [e.line() for e in events]
    assert summary.done == ["q1", "q2"] and summary.failed == [] and summary.land_retries == 0, lines
    assert seen["q2 boarding during the push"] and seen["q1 heard while q2 boarded"], (seen, lines)
    assert seen["landing pushes"] == 2 and world.landed()[-2:] == ["task q1", "task q2"]
    assert world.lease_refs() == []


def test_a_ride_boarded_onto_a_push_that_did_not_land_is_undone_and_lands_afresh(world):
    """Another pusher moves main while q1's landing push waits, after q2 boarded onto the commit that push
    was to land: q1's push is refused, q2's boarding is undone (its renew lock let go, back in the lane), and
    both land after a fetch; each agent ran once, each landed commit changes its own path only."""
    summary, events, seen = _pipeline_world(world, bump=True)
    lines = [e.line() for e in events]
    assert summary.done == ["q1", "q2"] and summary.failed == [], lines
    assert seen["during the push"] and summary.land_retries == 1, lines
    assert "bump" in world.landed() and sorted(world.landed()[-2:]) == ["task q1", "task q2"], world.landed()
    for t, path in (("q1", "src/a/x.py"), ("q2", "src/b/y.py")):
        sha = git(world.remote, "log", "--format=%H", "-1", "--grep", f"^task {t}$", "main").strip()
        assert git(world.remote, "diff-tree", "--no-commit-id", "--name-only", "-r", sha).split() == [path]
    assert [e.kind for e in events].count("running") == 2 and world.lease_refs() == []


def test_a_landing_lost_to_another_pusher_backs_off_and_lands_without_running_the_agent_again(world):
    from gitlease.work.runner import run_queue

    a, other = world.clone("a"), world.clone("other")
    bumps = []

    def hook(runner):
        real = runner._fetch_base

        def fetch():
            got = real()
            if len(bumps) < 3 and runner.lander._thread is not None:  # the lander's fetch: someone lands first
                land_elsewhere(other, f"more {len(bumps)}\n", f"bump {len(bumps)}")
                bumps.append(1)
            return got

        runner._fetch_base = fetch

    events = []
    summary = run_queue(
        str(a), [{"id": "n1", "paths": ["src/a/x.py"]}], command=world.command, land="main", runner_hook=hook,
        on_event=events.append,
    )  # fmt: skip
    assert summary.done == ["n1"] and summary.land_retries == 3, [e.line() for e in events]
    assert [e.kind for e in events].count("running") == 1  # the agent ran once
    assert world.landed()[-1] == "task n1"


def test_a_landing_the_server_goes_away_for_is_retried_without_running_the_agent_again(tmp_path):
    """The server goes away during the landing push (stopped, and restarted right after): the train backs off
    and lands the same verified commit; the agent ran once."""
    from gitlease.work.runner import run_queue
    from testing.servers import GitDaemon

    daemon = GitDaemon(tmp_path / "served").start()
    try:
        bare = seed_bare(tmp_path, ["src/x.py"], bare=daemon.make_bare("r.git"))
        a = tmp_path / "a"
        git(tmp_path, "clone", "-q", daemon.url_for("r.git"), str(a))
        git(a, "config", "lease.remote", "origin")
        agent = tmp_path / "agent.py"
        agent.write_text(AGENT)

        def hook(runner):
            real, calls = runner.lander._push, []

            def push(riders, tips):
                calls.append(1)
                if len(calls) > 1:
                    return real(riders, tips)
                daemon.stop()  # down for the first landing push only
                try:
                    return real(riders, tips)
                finally:
                    daemon.restart()

            runner.lander._push = push

        events = []
        summary = run_queue(
            str(a), [{"id": "s1", "paths": ["src/x.py"]}], command=[sys.executable, str(agent)], land="main",
            runner_hook=hook, on_event=events.append, backoff=0.0,
        )  # fmt: skip
        lines = [e.line() for e in events]
        assert summary.done == ["s1"] and summary.land_retries >= 1, lines
        assert [e.kind for e in events].count("running") == 1, lines  # the agent ran once
        assert git(bare, "log", "--format=%s", "-1", "main").strip() == "task s1"
    finally:
        daemon.stop()


@pytest.mark.parametrize("refusals", ["once", "always"])
def test_a_landing_the_server_refuses_keeps_the_verified_work_and_lands_it_without_running_the_agent_again(
    world, refusals
):
    """The server's hook refuses the landing push: the verified commit is parked on the store, the outcome names
    it (ready), and the next attempt lands it as it was; the agent ran once. Refused every time, the task ends
    failed after its attempts (each counted), its verified work kept: never a loop."""
    flag = _refuse_pushes(
        world,
        "printf '%s\\n' \"$input\" | grep -q ' refs/heads/main$'",
        "landing refused for now",
        once=refusals == "once",
    )
    a = world.clone("a")
    q = world.queue([{"id": "p1", "paths": ["src/a/x.py"]}])
    res = work(a, str(q), "--land", "main", "--backoff", "0", "--attempts", "2", "--json", "--", *world.command)
    events = [json.loads(line) for line in res.stdout.splitlines()[:-1]]
    assert [e["event"] for e in events].count("running") == 1, events  # the agent ran once
    retry = [e for e in events if e["event"] == "retry"]
    assert retry and "landing refused for now" in retry[0]["message"] and "only the landing" in retry[0]["message"]
    st = status(a, q)["p1"]
    if refusals == "once":
        assert res.returncode == 0, res.stdout + res.stderr
        assert world.landed() == ["task p1"] and not flag.exists() and st["state"] == "done"
    else:
        assert res.returncode == 1, res.stdout + res.stderr
        assert world.landed() == [] and st["state"] == "failed" and st["attempts"] == 2
        assert "edited by p1" in git(a, "show", f"{st['quarantine']}:src/a/x.py")  # the verified work, kept


def test_a_hung_agent_is_stopped_by_the_task_timeout_and_the_queue_ends(world):
    a = world.clone("a")
    q = world.queue([{"id": "h1", "paths": ["src/a/x.py"], "hang": True}, {"id": "ok", "paths": ["lib/k.py"]}])
    res = work(a, str(q), "--land", "main", "--attempts", "1", "--task-timeout", "3s", "--json", "--", *world.command)
    assert res.returncode == 1, res.stdout + res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()[:-1]]
    failed = [e for e in events if e["event"] == "failed" and e["task"] == "h1"]
    assert failed and "--task-timeout (3s)" in failed[0]["message"], events
    assert world.landed() == ["task ok"] and world.lease_refs() == []


def test_a_refusal_by_a_gitlease_check_is_not_retried_and_its_reason_is_in_the_event(world):
    """The agent's commit is refused by the installed pre-commit hook (a stray path outside its lease): the
    attempt fails at once (retrying changes nothing), and the event says why, not only where the log is."""
    a = world.clone("a")
    assert cli(a, "install-hooks").returncode == 0
    stray = world.root / "stray.py"
    stray.write_text(
        "import json, subprocess, sys\n"
        "task = json.load(sys.stdin)\n"
        "open('lib/k.py', 'a').write('stray\\n')\n"
        "subprocess.run(['git', 'add', '-A'], check=True)\n"
        "sys.exit(subprocess.run(['git', 'commit', '-q', '-m', 'stray']).returncode and 12)\n"
    )
    q = world.queue([{"id": "r1", "paths": ["src/a/x.py"]}])
    res = work(a, str(q), "--land", "main", "--attempts", "3", "--backoff", "0", "--json", "--",
               sys.executable, str(stray))  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()[:-1]]
    assert [e["event"] for e in events].count("running") == 1, events  # not retried
    failed = [e for e in events if e["event"] == "failed"]
    assert failed and "gitlease: commit refused" in failed[0]["message"], events


def test_an_agent_command_whose_client_would_run_unfenced_is_refused_before_anything_runs(world):
    """git lease work will not start a coding agent that would run without gitlease's hooks (here a flag of the
    client's launcher that drops project hooks): exit 2, one line saying how to fix it, nothing claimed."""
    a = world.clone("a")
    q = world.queue([{"id": "u1", "paths": ["src/a/x.py"]}])
    res = work(a, str(q), "--land", "main", "--", "claude", "--bare", "-p", "do the task")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("git-lease: git lease work will not start an unfenced agent: claude --bare")
    assert len(res.stderr.strip().splitlines()) == 1 and world.lease_refs() == []


def test_the_doctors_verdict_is_said_once_by_the_runner(world):
    a = world.clone("a")
    q = world.queue([{"id": "v1", "paths": ["src/a/x.py"]}])
    res = work(a, str(q), "--land", "main", "--json", "--", *world.command)
    assert res.returncode == 0, res.stdout + res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()[:-1]]
    said = [e for e in events if e["event"] == "warning"]
    assert len(said) == 1 and "git lease doctor" in said[0]["message"], events


def test_a_claim_whose_push_landed_unseen_is_settled_at_the_next_read(world):
    """The runner's claim push landed after the client gave up on it (the store went away): a lease claiming
    the task, owned by this very process, that no attempt of the runner holds. The next planning step settles
    it (adopted, released) instead of leaving the task blocked until the lease expires."""
    from gitlease import open_service
    from gitlease.work.runner import run_queue

    a = world.clone("a")
    ghost = open_service(str(a), task="g1").acquire(["src/a"], ttl=600, holder_pid=os.getpid(), task="g1")
    open_service(str(a)).forget(ghost.lease_id)  # the client never heard of it
    events = []
    summary = run_queue(str(a), [{"id": "g1", "paths": ["src/a/x.py"]}], command=world.command, land="main",
                        on_event=events.append)  # fmt: skip
    lines = [e.line() for e in events]
    assert summary.done == ["g1"], lines
    assert any(f"an unclear claim of this runner ({ghost.lease_id}) settled" in line for line in lines), lines


def test_a_claim_left_on_the_store_by_an_ended_attempt_is_settled_at_the_next_read(world):
    """An attempt ended and its release did not take the claim off the store (here its worktree's held.json
    lost the lease, so the release finds nothing to give back; in a 10-worker run, a worktree that git failed
    to add): the claim is this process's and no attempt is on it, so the next planning step releases it, and
    the task's next attempt runs at once instead of waiting for the lease to expire (600 s here)."""
    import threading

    from gitlease.work.runner import run_queue

    a = world.clone("a")
    events: list = []
    stopper: list = []

    def hook(runner):  # bounded: a claim left until it expires would hold the task past this
        t = threading.Timer(90, lambda: (runner.request_stop(), runner.request_stop()))
        t.daemon = True
        stopper.append(t)
        t.start()

    try:
        summary = run_queue(str(a), [{"id": "f1", "paths": ["src/a/x.py"], "forget": True}], command=world.command,
                            land="main", ttl=600, backoff=0, on_event=events.append, runner_hook=hook)  # fmt: skip
    finally:
        stopper[0].cancel()
    lines = [e.line() for e in events]
    assert summary.done == ["f1"], lines
    assert any("an unclear claim of this runner" in line and "settled" in line for line in lines), lines
    assert world.lease_refs() == []


def test_an_attempt_that_fails_right_after_its_worktree_is_added_releases_its_own_claim(world, monkeypatch):
    """The step after `git worktree add` fails (in a 10-worker run: git listing the worktrees while another
    was half made): the lease has moved into the new worktree's held state, and the attempt releases it from
    there itself; nothing is left for the runner to settle and the next attempt runs at once."""
    from gitlease.work.runner import run_queue
    from gitlease.worktree.manager import WorktreeManager

    real = WorktreeManager.mark_busy
    calls: list[str] = []

    def once(self, workspace, command):
        calls.append(workspace)
        if len(calls) == 1:
            raise GitLeaseError("git worktree failed: failed to read .git/worktrees/x/commondir: Success")
        return real(self, workspace, command)

    monkeypatch.setattr(WorktreeManager, "mark_busy", once)
    a = world.clone("a")
    events: list = []
    summary = run_queue(str(a), [{"id": "m1", "paths": ["src/a/x.py"]}], command=world.command, land="main",
                        ttl=600, backoff=0, on_event=events.append)  # fmt: skip
    lines = [e.line() for e in events]
    assert summary.done == ["m1"], lines
    assert any("retry m1: git worktree failed" in line for line in lines), lines
    assert not any("unclear claim" in line for line in lines), lines
    assert world.lease_refs() == []
