"""doctor's concurrency probe (gitlease/ops/race.py) is decisive: it fails a server that applies multi-ref
updates without one lock over the push (tests/racing_server.py: dulwich's receive-pack, threaded) every time,
passes C git every time, releases its pushers together, and states what its clean rounds rule out."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading

import pytest
from conftest import cli, git

from gitlease.core import gitcmd
from gitlease.core.store import RefUpdate, push_argv
from gitlease.ops import race

RACING = os.path.join(os.path.dirname(__file__), "racing_server.py")


@contextlib.contextmanager
def serving(argv: list[str], url: str):
    """A server process that says READY on stdout and stops when its stdin closes; yields ``url``."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        yield url
    finally:
        proc.stdin.close()
        proc.terminate()
        proc.wait(timeout=30)


def racing_server(folder, *args: str):
    """tests/racing_server.py serving a fresh bare repository (a context manager yielding its URL)."""
    pytest.importorskip("dulwich", reason="dulwich (the racing server) is not installed")
    from servers import free_port, make_bare

    bare = make_bare(folder / "race.git")
    port = free_port()
    return serving([sys.executable, RACING, str(port), str(bare), *args], f"git://127.0.0.1:{port}/store.git")


def doctor(repo, url, rounds: int, timeout: float = 300):
    res = cli(repo, "doctor", "--json", "--remote", url, "--rounds", str(rounds), timeout=timeout)
    doc = json.loads(res.stdout)
    checks = doc["result"]["checks"] if doc["ok"] else doc["error"]["details"]["checks"]
    return res, {c["name"]: c for c in checks}


def test_the_bound_a_clean_run_states():
    assert round(race.detectable_rate(30), 3) == 0.142
    assert round(race.detectable_rate(60), 4) == 0.0739
    assert (1 - race.detectable_rate(30)) ** 30 == pytest.approx(0.01)  # the definition: 1% to miss it
    result = race.RaceResult(rounds=30, planned=30, pushers=4)
    assert result.ok
    assert result.summary() == (
        "0 double grants in 30 rounds: a race rate above 14.2% would have shown with 99% confidence"
    )


def test_every_shape_makes_every_pair_of_pushers_overlap():
    seen = set()
    for rnd in range(len(race.SHAPES)):
        plan = race.plan_round("refs/leases/doctor/r/race", rnd, 4, lambda label: label)
        seen.add(plan.shape)
        scopes = [ups[1].ref[len(plan.scope_dir) + 1 :] for ups in plan.pushes]
        ids = [ups[0].ref for ups in plan.pushes]
        assert len(set(ids)) == 4
        for i, a in enumerate(scopes):
            for b in scopes[i + 1 :]:
                assert a == b or a.startswith(b + "/") or b.startswith(a + "/")
    assert seen == set(race.SHAPES)


def test_a_round_is_judged_by_what_each_pusher_was_told_and_what_is_there():
    from gitlease.core.store import Outcome

    plan = race.plan_round("refs/x/r0", 0, 4, lambda label: label)  # parent/child
    ok, lost = Outcome(ok=True), Outcome(ok=False)
    listed = {ups[0].ref: ups[0].new for ups in plan.pushes[:1]} | {plan.pushes[0][1].ref: "race-0-0"}
    assert race.judge_round(plan, [ok, lost, lost, lost], listed) == (None, 0)
    assert race.judge_round(plan, [ok, ok, lost, lost], listed)[0] == "2 of 4 pushers told they won"
    both = dict(listed) | {plan.pushes[1][0].ref: "race-0-1", plan.pushes[1][1].ref: "race-0-1"}
    problem, _ = race.judge_round(plan, [ok, lost, lost, lost], both)  # told once, yet both are there
    assert problem == "1 of 4 pushers told they won (both x and x/sub created)"
    assert race.judge_round(plan, [lost, ok, lost, lost], listed)[0].endswith("its refs are not there")
    remnant = dict(listed) | {plan.pushes[2][0].ref: "race-0-2"}  # a loser's id ref landed: cleaned up later
    assert race.judge_round(plan, [ok, lost, lost, lost], remnant) == (None, 1)


def test_pushers_wait_at_the_gate_until_all_are_there(remote_daemon, make_repo, tmp_path):
    """Each git push reads the server's advertisement and waits in its pre-push hook: all four are at the gate
    at once before any is let go, and each push lands after it."""
    work = make_repo()
    head = git(work, "rev-parse", "HEAD").strip()
    gate = race.Gate(str(tmp_path))
    results = {}

    def push(i: int) -> None:
        argv = ["-c", f"core.hooksPath={gate.hooks_dir}"]
        argv += push_argv(remote_daemon.url, [RefUpdate(f"refs/leases/doctor/gate/p{i}", head, None)], run_hooks=True)
        results[i] = gitcmd.run(argv, cwd=str(work), env=gate.env(30), check=False, timeout=60).returncode

    threads = [threading.Thread(target=push, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        assert gate.open_when_all_wait(4, threads, 30) == 4
        gate.drain(threads)
    finally:
        for t in threads:
            t.join()
        gate.close()
    assert results == {0: 0, 1: 0, 2: 0, 3: 0}
    assert len(git(remote_daemon.path, "for-each-ref", "refs/leases/doctor/gate/").splitlines()) == 4


def test_doctor_fails_a_racing_server_in_its_first_rounds(tmp_path, make_repo):
    with racing_server(tmp_path) as url:
        res, checks = doctor(make_repo(), url, rounds=3)
    assert res.returncode == 1
    c = checks["concurrency"]
    assert c["status"] == "fail" and "pushers told they won" in c["message"], c
    assert c["gated"] and c["problems"] and c["rounds"] <= 3
    assert "4 pushers released together" in c["message"]


def test_doctor_passes_c_git_and_states_what_its_rounds_rule_out(remote_daemon, make_repo):
    res, checks = doctor(make_repo(), remote_daemon.url, rounds=6)
    assert res.returncode == 0, res.stderr
    c = checks["concurrency"]
    assert c["status"] == "pass" and c["rounds"] == 6 and c["gated"], c
    assert "0 double grants in 6 rounds: a race rate above 53.6% would have shown with 99% confidence" in c["message"]
    assert c["detectableRate"] == round(race.detectable_rate(6), 4) and c["probeVersion"] == race.PROBE_VERSION
    assert git(remote_daemon.path, "for-each-ref", "refs/leases/doctor/") == ""  # the verdict stays


def test_a_server_that_answers_one_connection_at_a_time_does_not_hang_the_probes(tmp_path, make_repo):
    """dulwich's stock server (not threaded): the compare-and-swap probe's second push waits for the first,
    which waits for it; the probe gives up on it after NESTED_PUSH seconds and says why, and the race runs
    without the gate (nobody could reach it)."""
    with racing_server(tmp_path, "0", "serial") as url:
        res, checks = doctor(make_repo(), url, rounds=3, timeout=120)
    cas = checks["compare-and-swap"]
    assert cas["status"] == "warn" and "one connection at a time" in cas["message"], cas
    assert checks["concurrency"]["status"] == "pass" and not checks["concurrency"]["gated"]
    assert "git's files backend" not in checks["concurrency"]["message"]  # dulwich is not git


@pytest.mark.slow
def test_twenty_of_twenty_the_probe_fails_the_racing_server_and_passes_c_git(tmp_path, make_repo, remote_daemon):
    """The issue's proof: 20 runs each, with the default rounds."""
    work = make_repo()
    verdicts = []
    for n in range(20):
        folder = tmp_path / f"r{n}"
        folder.mkdir()
        with racing_server(folder) as url:
            res, checks = doctor(work, url, rounds=race.ROUNDS)
        verdicts.append(checks["concurrency"]["status"])
    assert verdicts == ["fail"] * 20
    verdicts = []
    for _ in range(20):
        res, checks = doctor(work, remote_daemon.url, rounds=race.ROUNDS)
        verdicts.append(checks["concurrency"]["status"])
    assert verdicts == ["pass"] * 20


JGIT = os.path.join(os.path.dirname(__file__), "JGitDaemon.java")


def jgit_server(folder, storage: str):
    """tests/JGitDaemon.java serving a fresh bare repository (``storage``: refdirectory or reftable)."""
    from servers import free_port, make_bare

    make_bare(folder / "store.git")
    port = free_port()
    argv = ["java", "-cp", os.environ["GITLEASE_TEST_JGIT_CLASSPATH"], JGIT, str(port), str(folder)]
    return serving(argv + ([storage] if storage == "reftable" else []), f"git://127.0.0.1:{port}/store.git")


@pytest.mark.skipif(
    not os.environ.get("GITLEASE_TEST_JGIT_CLASSPATH"),
    reason="set GITLEASE_TEST_JGIT_CLASSPATH to JGit's, slf4j-api's and JavaEWAH's jars (docs/hosts.md)",
)
@pytest.mark.parametrize("storage,verdict", [("refdirectory", "fail"), ("reftable", "pass")])
def test_jgit_refdirectory_fails_and_reftable_passes(tmp_path, make_repo, storage, verdict):
    with jgit_server(tmp_path, storage) as url:
        res, checks = doctor(make_repo(), url, rounds=race.ROUNDS)
    assert checks["concurrency"]["status"] == verdict, checks["concurrency"]
    assert checks["concurrency"]["agent"].startswith("JGit/")
