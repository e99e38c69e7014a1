"""The fleet soak, short (soak/fleet.py; ``make fleet-soak`` runs the long one): two real ``git lease work``
processes on one queue with injected faults, judged by the independent checker; and the negative control (the
same agents without leases) that the checker must catch."""

from __future__ import annotations

import json

import pytest

from soak import fleet

# TTL 12: the heartbeat's push timeout is a sixth of the TTL, 2 s; at TTL 6 a renewal push outlasting 1 s on a
# loaded machine lost the lease and re-queued the task. A lease lost to load is still no anomaly (the checker);
# what the asserts count is what the faults do, not how fast the machine is. 600 s: a generous bound for both
# runners to finish at a load of 30 (about 30 s at rest).
TTL, TIMEOUT = 12, 600


def test_two_runners_with_faults_leave_nothing_the_checker_can_fault(tmp_path):
    res = fleet.run(12, 2, TTL, 7, keep=str(tmp_path / "run"), timeout=TIMEOUT)
    report = json.dumps({k: v for k, v in res.items() if k != "logs"}, indent=1)
    assert res["anomalies"] == [], report + "\n" + "\n".join(res["logs"].values())
    faults, counts = res["faults"], res["counts"]
    # the stray edit (committed with --no-verify) was refused at landing: the task failed, its work kept (the
    # checker found the agent's edit under the quarantine ref named in the outcome); nothing else failed
    assert faults["stray"] == ["t01"] and counts["landed"] + counts["failed"] == 12
    assert counts["outcomes"]["retrying"] == 0 and counts["outcomes"]["done"] == counts["landed"]
    # the verifier that fails once failed, and its task landed all the same: re-queued and landed on a later
    # attempt, or, when the runner was killed between the failure and the outcome it would have written, run
    # again from the start by the restarted runner (which of the two depends on the machine's speed; the
    # checker above finds the task on main exactly once either way)
    assert faults["verify_failed"] == ["t02"] and counts["state_of"]["t02"] == "done"
    # a runner was killed with -9 mid-task: the slow task was running there; its agent died with it (the watchdog
    # and kill-on-parent-death), its leases were swept and the task landed once (the checker: exactly once)
    assert faults["kill"]["task"] == "t05" and faults["dead_leases"] >= 1
    # a runner was killed with -9 while its landing push of t08 was held in the server's pre-receive: the
    # checker found t08 on main exactly once (the push it had started landed, or the task ran again)
    assert faults["midpush"]["task"] == "t08" and faults["restarts"] >= 1
    assert counts["ledger_entries"] >= 12 + 1  # every task, and the flaky verifier's task ran its agent twice
    # the killed task ran again once the dead lease was gone (swept by the restarted runner, or taken over by an
    # acquire once expired), and landed once (the checker); the killed runner's agent never finished its run:
    # it did not outlive its runner
    assert counts["state_of"]["t05"] == "done" and counts["runs"].get("t05", 1) == 1
    # the killed runner's task worktree was pruned by the restarted runner (quarantined: its agent's commit
    # kept); the checker allows no task worktree left outside the pool and the quarantine
    assert faults["pruned"] >= 1
    # both runners ended with exit 1 (one task failed), the restarted one included
    assert set(res["exit"].values()) == {1}


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["daemon", "http"])
def test_over_a_real_server_with_a_server_restart_the_checker_finds_nothing(tmp_path, transport):
    """The same run over a real ``git daemon`` or smart-HTTP server (receive-pack, the server hook in it), with
    the server killed and restarted mid-run on top of the other faults (about a minute each: ``make
    test-slow``)."""
    # TTL 12: the heartbeat's push timeout is a sixth of the TTL; at TTL 6 (1 s) a renewal push outlasting it on
    # a loaded machine used to lose the lease (docs/reliability.md)
    res = fleet.run(12, 2, TTL, 7, keep=str(tmp_path / "run"), transport=transport, timeout=TIMEOUT)
    report = json.dumps({k: v for k, v in res.items() if k != "logs"}, indent=1)
    assert res["anomalies"] == [], report + "\n" + "\n".join(res["logs"].values())
    faults = res["faults"]
    assert faults["server_restart"]["after_done"] >= 4 and faults["kill"]["task"] == "t05"
    assert faults["midpush"]["task"] == "t08"
    # every task landed or failed with its work kept (the checker); the stray edit's task failed. Over git
    # daemon on a loaded machine, a renewal push may outlast the heartbeat's timeout (a sixth of the TTL) and
    # land after the client gave up: the lease is then lost and the task re-queued, so other tasks may fail too
    counts = res["counts"]
    assert counts["landed"] + counts["failed"] == 12 and counts["landed"] >= 8


def test_the_same_agents_without_leases_fail_the_checker(tmp_path):
    res = fleet.run(12, 2, TTL, 7, control=True, keep=str(tmp_path / "control"), timeout=TIMEOUT)
    found = "\n".join(res["anomalies"])
    assert "at the same time" in found, found  # overlapping writes of one file, seen in the agents' ledgers
    # the stray edit lands unless its task lost a rebase conflict first (then the checker reports it not landed)
    assert "landed paths outside its scope: outside/notes.md" in found or "task t01 neither landed" in found, found


def test_the_checker_takes_a_ride_of_several_tasks_but_not_two_commits_of_one_task(tmp_path):
    """A landing train lands the commits of several tasks in one push: one update of main, one commit a task (the
    checker said "exactly one commit an update" before the train, and failed a run whose two workers' tasks
    were ready together: one run in many, more often under load). Two commits of one task in one update, or a
    move that is no fast-forward, are still anomalies."""
    import subprocess

    bare = tmp_path / "remote.git"
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    subprocess.run(["git", "config", "core.logAllRefUpdates", "always"], cwd=bare, check=True)

    def commit(path: str, subject: str) -> None:
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(subject + "\n")
        subprocess.run(["git", "add", path], cwd=work, check=True)
        subprocess.run(["git", "commit", "-q", "-m", subject], cwd=work, check=True)

    def push() -> None:
        subprocess.run(["git", "push", "-q", str(bare), "HEAD:main"], cwd=work, check=True)

    commit("seed", "seed")
    push()
    tasks = [{"id": f"t{k}", "paths": [f"p{k}"]} for k in range(3)]
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    commit("p0", "task t0")
    commit("p1", "task t1")
    push()  # a ride of two tasks
    assert fleet.check(bare, tasks, ledger, [])[0] == ["task t2 neither landed nor reported failed (None)"]
    commit("p2", "task t2")
    commit("p2", "task t2 again")
    push()  # two commits of one task in one update
    anomalies = fleet.check(bare, tasks, ledger, [])[0]
    assert any("by 2 commits, not one a task" in a for a in anomalies), anomalies
