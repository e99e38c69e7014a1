"""The stale-lease sweeper against real stores: each rule reclaims exactly what it should and nothing else,
a lease renewed between the read and the delete survives, concurrent sweepers reclaim each lease once, a
SIGKILLed holder's lease is reclaimed after expiry, a sweeper 20 s ahead respects the skew margin, and the CLI
(sweep-stale, sweep, log, release and sweep-stale with a forced lease, ci install)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import cli, git, in_threads
from helpers import Fleet

from gitlease.core import errors
from gitlease.core import record as records
from gitlease.core.clock import FakeClock
from gitlease.core.procs import process_start
from gitlease.core.record import Owner
from gitlease.core.refnames import id_ref, scope_ref
from gitlease.core.store import RefUpdate
from gitlease.ops.sweep import Sweeper
from gitlease.service.audit import read_log

HOST = os.uname().nodename


@pytest.fixture
def sfleet(tmp_path, store_url):
    return Fleet(tmp_path, store_url)


def plant(
    svc,
    paths,
    *,
    ttl=60,
    renew_every=None,
    task="job_4818",
    host=HOST,
    pid=0,
    pid_start=None,
    now=None,
    stop_after=None,
):
    """A lease with exactly the owner fields a test needs, created like acquire does (one atomic write).
    ``stop_after``: the holder's stop horizon (stopBy; the early rules wait for it plus the skew); 0 for a holder
    that promised to stop at once, where only the rule itself decides."""
    now = svc.clock.now() if now is None else now
    owner = Owner(task_id=task, agent_id="holder", host=host, pid=pid, pid_start=pid_start)
    rec = records.new_record(
        lease_id=records.new_lease_id(now),
        repo="r",
        paths=tuple(sorted(paths)),
        workspace_id="w",
        owner=owner,
        now=now,
        ttl=ttl,
        renew_every=renew_every,
        stop_after=stop_after,
    )
    oid = svc._write_version(rec, None, "acquire")
    ups = [RefUpdate(id_ref(rec.lease_id), oid, None)] + [RefUpdate(scope_ref(p), oid, None) for p in rec.paths]
    assert svc.store.apply(ups).ok
    return rec.lease_id


def outcomes(sweep):
    return {r.lease_id: r.outcome for r in sweep.results}


def lease_ids(svc):
    return {v.lease_id for v in svc.snapshot(use_cache=False).leases}


def dead_pid():
    """The pid of a process that has just exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ------------------------------------------------------------------------------ each rule


def test_expired_rule_only_beyond_skew(sfleet):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    old = a.acquire(["svc/a"], ttl=60)
    sfleet.clock.advance(20)
    young = a.acquire(["svc/b"], ttl=60)
    live = a.acquire(["svc/c"], ttl=600)
    sfleet.clock.advance(60 + 11)  # old: expired 31 s ago (beyond skew 30); young: 11 s ago (within)
    got = Sweeper(sw).sweep()
    assert outcomes(got) == {old.lease_id: "reclaimed"}
    assert [r.line() for r in got.results] == [f"reclaimed: {old.lease_id} owner=task-a expired=31s"]
    assert lease_ids(sw) == {young.lease_id, live.lease_id}
    entries = read_log(sw.store)
    assert len(entries) == 1 and entries[0].doc["leaseId"] == old.lease_id
    assert entries[0].doc["oid"] == old.oid and entries[0].doc["version"] == 1
    assert entries[0].doc["rule"] == "expired" and entries[0].doc["by"] == "sweeper"
    assert sfleet.agent("c").acquire(["svc/a"]).lease_id  # the scope is leasable again
    assert Sweeper(sw).sweep().results == []  # nothing else is stale yet


def test_half_deleted_lease_is_reclaimed_once_expired(sfleet):
    """A server killed while deleting a lease's refs can leave only its id ref: invalid (it blocks its
    paths) but granting nothing; once expired beyond the skew, the sweep reclaims it like an expired lease."""
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    half = a.acquire(["crash/x"], ttl=60)
    keep = a.acquire(["crash/y"], ttl=60)
    assert sw.store.apply([RefUpdate(scope_ref("crash/x"), None, half.oid)]).ok  # what the crash left
    view = sw.snapshot(use_cache=False).find(half.lease_id)
    assert not view.valid and view.problems == ["lease has no scope refs (partially deleted)"]
    sfleet.clock.advance(60 + 30)  # expired, but within the skew margin
    assert Sweeper(sw).sweep().results == []
    sfleet.clock.advance(1)
    got = Sweeper(sw).sweep()
    assert outcomes(got) == {half.lease_id: "reclaimed", keep.lease_id: "reclaimed"}
    assert {r.rule for r in got.results if r.lease_id == half.lease_id} == {"half-deleted"}
    assert lease_ids(sw) == set()
    (entry,) = [e for e in read_log(sw.store) if e.doc["leaseId"] == half.lease_id]
    assert entry.doc["rule"] == "half-deleted" and entry.doc["by"] == "sweeper"
    assert sfleet.agent("c").acquire(["crash"]).lease_id  # the paths are leasable again


def test_missed_heartbeats_rule(sfleet):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    beat = a.acquire(["hb/beat"], ttl=3600, renew_every=60, stop_after=120)  # as hold() and run: stop after 2
    quiet = a.acquire(["hb/quiet"], ttl=3600)  # declares no interval: only its TTL counts
    renewing = a.acquire(["hb/renewing"], ttl=3600, renew_every=60, stop_after=120)
    sfleet.clock.advance(100)
    a.renew(renewing.lease_id)
    sfleet.clock.advance(2 * 60 + 30 - 100)  # beat: silent 150 s = two intervals + skew: not yet
    assert Sweeper(sw).sweep().results == []
    sfleet.clock.advance(1)
    got = Sweeper(sw).sweep()
    assert outcomes(got) == {beat.lease_id: "reclaimed"}
    assert got.results[0].line() == f"reclaimed: {beat.lease_id} owner=task-a missed-heartbeats=2 silent=151s"
    assert lease_ids(sw) == {quiet.lease_id, renewing.lease_id}


def test_dead_holder_rule_uses_pid_and_start_time(sfleet):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    me = os.getpid()
    gone = dead_pid()
    live = a.acquire(["p/live"], ttl=3600, holder_pid=me, stop_after=0)
    assert live.record.owner.pid_start == process_start(me)
    dead = a.acquire(["p/dead"], ttl=3600, holder_pid=gone, stop_after=0)  # start time unknown: cannot tell
    dead_known = plant(a, ["p/dead-known"], ttl=3600, pid=gone, pid_start=12345, stop_after=0)
    reused = plant(a, ["p/reused"], ttl=3600, pid=me, pid_start=process_start(me) - 1, stop_after=0)  # reused pid
    elsewhere = plant(a, ["p/elsewhere"], ttl=3600, pid=gone, pid_start=12345, host="other-host.example", stop_after=0)
    sfleet.clock.advance(30)
    assert Sweeper(sw).sweep().results == []  # stopBy + skew: not yet (a holder's command may still run)
    sfleet.clock.advance(1)
    got = Sweeper(sw).sweep()
    assert outcomes(got) == {dead_known: "reclaimed", reused: "reclaimed"}
    reasons = {r.lease_id: r.reason for r in got.results}
    assert reasons == {dead_known: f"holder-gone=pid:{gone}", reused: f"holder-gone=pid:{me}:reused"}
    assert lease_ids(sw) == {live.lease_id, dead.lease_id, elsewhere}


def test_stalled_progress_rule(sfleet):
    a = sfleet.agent("a")
    sw = sfleet.agent("sweeper", progress_timeout=600)
    off = sfleet.agent("sweeper-off")
    stalls = a.acquire(["pr/stalls"], ttl=300, stop_after=250)  # stopBy 250 s after each renewal
    silent = a.acquire(["pr/silent"], ttl=300, stop_after=250)  # never reports progress: the rule does not apply
    moving = a.acquire(["pr/moving"], ttl=300, stop_after=250)
    a.renew(stalls.lease_id, progress="step 1")
    a.renew(moving.lease_id, progress="step 1")
    for step in range(1, 4):  # renewed every 200 s (alive by TTL); only `moving` reports progress
        sfleet.clock.advance(200)
        a.renew(stalls.lease_id)
        a.renew(silent.lease_id)
        a.renew(moving.lease_id, progress=f"step {step + 1}")
    assert Sweeper(sw).sweep().results == []  # stalls: 600 s since its progress, within timeout + skew
    sfleet.clock.advance(31)
    assert Sweeper(sw).sweep().results == []  # stalled, but its holder's stop deadline (850 s) + skew is to come
    sfleet.clock.advance(250)
    assert Sweeper(off).sweep().results == []  # progressTimeout unset: the rule is off
    got = Sweeper(sw).sweep()
    assert outcomes(got) == {stalls.lease_id: "reclaimed"}
    assert got.results[0].reason == "stalled=881s"
    assert lease_ids(sw) == {silent.lease_id, moving.lease_id}


def test_early_rules_wait_for_the_holders_stop_deadline_plus_skew(sfleet):
    """Issue 17: no early rule reclaims before the version's stopBy + lease.skew (its holder may still run until
    stopBy); a record from before stopBy existed is judged as if stopBy were its expiry."""
    import dataclasses

    from gitlease.ops.sweep import judge

    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    beat = a.acquire(["stop/beat"], ttl=600, renew_every=60, stop_after=300)  # may run on 300 s unheard
    dead = plant(a, ["stop/dead"], ttl=600, pid=dead_pid(), pid_start=12345, stop_after=200)
    sfleet.clock.advance(2 * 60 + 31)  # silent 151 s: two intervals + skew, so missed heartbeats would apply
    assert Sweeper(sw).sweep().results == []
    sfleet.clock.advance(200 + 30 - 151)  # the dead holder's stopBy + skew: not yet
    assert Sweeper(sw).sweep().results == []
    sfleet.clock.advance(1)
    assert outcomes(Sweeper(sw).sweep()) == {dead: "reclaimed"}
    sfleet.clock.advance(300 + 30 - 231)
    assert Sweeper(sw).sweep().results == []
    sfleet.clock.advance(1)
    got = Sweeper(sw).sweep()
    assert outcomes(got) == {beat.lease_id: "reclaimed"} and got.results[0].rule == "missed-heartbeats"
    assert lease_ids(sw) == set()
    old = a.acquire(["stop/old"], ttl=600, renew_every=60)
    v = sw.snapshot(use_cache=False).find(old.lease_id)
    v.record = dataclasses.replace(v.record, stop_by=None)  # as an older gitlease wrote it
    at = v.record.renewed + 600 + 30
    assert judge(v, at, sw.settings, host=HOST) is None  # missed heartbeats long ago, but no stopBy: its expiry
    assert judge(v, at + 1, sw.settings, host=HOST).rule == "expired"


@pytest.mark.parametrize("rule", ["expired", "missed-heartbeats", "dead-holder"])
def test_each_rule_can_be_turned_off_and_dry_run_changes_nothing(sfleet, rule):
    a = sfleet.agent("a")
    leases = {
        "expired": plant(a, ["off/expired"], ttl=60),
        "missed-heartbeats": plant(a, ["off/beat"], ttl=3600, renew_every=60, stop_after=120),
        "dead-holder": plant(a, ["off/dead"], ttl=3600, pid=dead_pid(), pid_start=12345, stop_after=0),
    }
    sfleet.clock.advance(200)
    flags = {
        "expired": "sweep_expired",
        "missed-heartbeats": "sweep_missed_heartbeats",
        "dead-holder": "sweep_dead_holder",
    }
    only = sfleet.agent("only", **{f: (r == rule) for r, f in flags.items()})
    before = only.store.list_refs()
    got = Sweeper(only).sweep(dry_run=True)
    assert outcomes(got) == {leases[rule]: "would-reclaim"}
    assert got.results[0].line().startswith(f"would reclaim: {leases[rule]} owner=job_4818 ")
    assert only.store.list_refs() == before and read_log(only.store) == []
    none = sfleet.agent("none", sweep_expired=False, sweep_missed_heartbeats=False, sweep_dead_holder=False)
    assert Sweeper(none).sweep().results == []
    assert outcomes(Sweeper(only).sweep()) == {leases[rule]: "reclaimed"}
    assert lease_ids(only) == set(leases.values()) - {leases[rule]}


def test_invalid_lease_is_never_reclaimed_by_a_rule(sfleet):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    w = a.objects
    junk = w.commit(w.tree({"lease.json": w.blob(b"not json")}), (), "M <m@x>", 1_000_000_000, "junk")
    assert a.store.apply([RefUpdate(scope_ref("junk"), junk, None)]).ok
    sfleet.clock.advance(10**7)
    assert Sweeper(sw).sweep().results == []
    bad = [v for v in sw.snapshot(use_cache=False).leases if not v.valid]
    got = Sweeper(sw).force(bad[0].lease_id)  # only a forced (admin) reclaim clears it
    assert got.outcome == "reclaimed" and got.reason == "forced=invalid" and sw.store.list_refs() == {}


# -------------------------------------------------------------------------------- races


def test_renewed_between_read_and_delete_survives(sfleet):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    lease = a.acquire(["race/x"], ttl=3600, renew_every=60, stop_after=120)
    other = plant(a, ["race/y"], ttl=60)
    sfleet.clock.advance(100)  # the holder renews before its stop deadline (120 s) ...
    sw.clock = FakeClock(sfleet.clock.now() + 100)  # ... while a sweeper whose clock runs ahead finds both stale
    renewed = []

    def holder_renews(view, verdict):
        if view.lease_id == lease.lease_id:
            renewed.append(a.renew(lease.lease_id))

    got = Sweeper(sw, before_reclaim=holder_renews).sweep()
    assert outcomes(got) == {lease.lease_id: "renewed", other: "reclaimed"}
    line = next(r.line() for r in got.results if r.lease_id == lease.lease_id)
    assert line.startswith(f"skipped: {lease.lease_id} owner=task-a missed-heartbeats=3") and "stays" in line
    assert sw.store.list_refs()[id_ref(lease.lease_id)] == renewed[0].oid
    assert [e.doc["leaseId"] for e in read_log(sw.store)] == [other]  # no record of what did not happen
    a.renew(lease.lease_id)  # the holder carries on


@pytest.mark.parametrize("kind", ["file", "daemon"])
def test_two_sweepers_at_once_each_lease_once(tmp_path, request, kind):
    fleet = Fleet(tmp_path, request.getfixturevalue(f"remote_{kind}").url)
    a = fleet.agent("a")
    stale = {plant(a, [f"two/{i}"], ttl=60) for i in range(3)}
    fleet.clock.advance(100)
    barrier = threading.Barrier(2, timeout=30)
    sweepers = [
        Sweeper(fleet.agent(f"sweeper{i}"), before_reclaim=lambda v, r: barrier.wait(), rotate=False) for i in range(2)
    ]  # the same order: both go for each lease at the same moment
    results = in_threads(lambda s: s.sweep(), sweepers, timeout=60)
    won = [r.lease_id for sweep in results for r in sweep.results if r.outcome == "reclaimed"]
    lost = [r.outcome for sweep in results for r in sweep.results if r.outcome != "reclaimed"]
    assert sorted(won) == sorted(stale) and set(lost) <= {"gone"} and len(lost) == 3
    entries = read_log(a.store)
    assert sorted(e.doc["leaseId"] for e in entries) == sorted(stale)
    assert all(e.problem is None for e in entries)


def test_two_processes_sharing_one_writer_id_retry_without_loss(sfleet):
    """Same writer id, different leases, both appending on the same audit head: the loser re-reads and
    appends after the winner; nothing lost, sequence 1, 2."""
    a = sfleet.agent("a")
    l1, l2 = plant(a, ["w/1"], ttl=60), plant(a, ["w/2"], ttl=60)
    sfleet.clock.advance(100)
    s1, s2 = sfleet.agent("sweeper"), sfleet.agent("sweeper")
    views = {v.lease_id: v for v in s1.snapshot(use_cache=False).leases}
    for s in (s1, s2):
        s.audit._head = s.audit.read_head()  # both start from the same (empty) head
    barrier = threading.Barrier(2, timeout=30)
    got = {}

    def go(s, lid):
        barrier.wait()
        got[lid] = s.reclaim(views[lid], action="reclaim", rule="expired", reason="expired=40s")

    threads = [threading.Thread(target=go, args=(s1, l1)), threading.Thread(target=go, args=(s2, l2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got[l1].ok and got[l2].ok
    entries = read_log(a.store)
    assert sorted(e.doc["seq"] for e in entries) == [1, 2] and {e.doc["leaseId"] for e in entries} == {l1, l2}
    assert all(e.problem is None for e in entries) and a.store.list_refs() == {}


def _holder(fleet, q, go):
    os.setpgrp()  # so a test crash cannot leave it behind the parent's group
    svc = fleet.agent("holder")
    got = svc.acquire(["killed/scope"], ttl=60)
    q.put(got.lease_id)
    go.wait(60)
    fleet.clock.advance(10)
    svc.renew(got.lease_id)  # the pre-receive hook holds this push until the holder is dead
    q.put("renewed")


def _blocking(fn, timeout=30):
    out, t = [], threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert out, "timed out"
    return out[0]


@pytest.mark.parametrize("landed", [False, True], ids=["renew-lost", "renew-landed"])
def test_holder_sigkilled_mid_renew_is_reclaimed_after_expiry(tmp_path, remote_file, landed):
    hooks = remote_file.path / "hooks"
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    for name in ("entered", "release", "done"):
        os.mkfifo(ctl / name)
    (hooks / "pre-receive").write_text(
        "#!/bin/sh\ncat >/dev/null\n"
        f'if [ -e "{ctl}/arm" ]; then rm -f "{ctl}/arm"; echo in > "{ctl}/entered"; '
        f'read x < "{ctl}/release"; exit "$x"; fi\nexit 0\n'
    )
    (hooks / "post-receive").write_text(
        f'#!/bin/sh\ncat >/dev/null\nif [ -e "{ctl}/watch" ]; then rm -f "{ctl}/watch"; echo done > "{ctl}/done"; fi\n'
    )
    for h in ("pre-receive", "post-receive"):
        (hooks / h).chmod(0o755)
    fleet = Fleet(tmp_path, remote_file.url)
    ctx = mp.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_holder, args=(fleet, q, go))
    proc.start()
    released = False
    try:
        lease = q.get(timeout=60)
        (ctl / "arm").write_text("")
        if landed:
            (ctl / "watch").write_text("")
        go.set()
        assert _blocking(lambda: open(ctl / "entered").read()) == "in\n"  # the renew push is in flight
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        _blocking(lambda: open(ctl / "release", "w").write("0\n" if landed else "1\n"))
        released = True
        if landed:
            assert _blocking(lambda: open(ctl / "done").read()) == "done\n"
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        if not released:  # never leave the orphaned push and its hook blocked
            try:
                fd = os.open(ctl / "release", os.O_WRONLY | os.O_NONBLOCK)
                os.write(fd, b"1\n")
                os.close(fd)
            except OSError:
                pass
    sw = fleet.agent("sweeper")
    view = sw.snapshot(use_cache=False).find(lease)
    assert view is not None and view.record.version == (2 if landed else 1)
    fleet.clock.advance(view.record.expires - fleet.clock.now() + 30)
    assert Sweeper(sw).sweep().results == []  # within the skew margin: still blocks
    fleet.clock.advance(1)
    got = Sweeper(sw).sweep()
    assert outcomes(got) == {lease: "reclaimed"}
    assert fleet.agent("next").acquire(["killed/scope"]).lease_id


def test_sweeper_20s_ahead_respects_the_skew_margin(sfleet):
    holder_clock = sfleet.clock
    a = sfleet.agent("a")
    sw = sfleet.agent("sweeper")
    ahead = FakeClock(holder_clock.now() + 20)
    sw.clock = ahead
    exp = a.acquire(["skew/ttl"], ttl=60)
    beat = a.acquire(["skew/beat"], ttl=3600, renew_every=60, stop_after=120)

    def at(holder_seconds):  # move both clocks to holder t0 + seconds (the sweeper stays 20 s ahead)
        step = holder_seconds - (holder_clock.now() - t0)
        holder_clock.advance(step)
        ahead.advance(step)

    t0 = holder_clock.now()
    at(55)  # live by the holder's clock (5 s left); the sweeper sees it 15 s past expiry
    assert Sweeper(sw).sweep(dry_run=True).results == []
    at(70)  # 10 s past expiry for the holder: the sweeper sees 30 s, not beyond the margin
    assert Sweeper(sw).sweep().results == []
    at(130)  # beat: silent 130 s for the holder; the sweeper sees 150 s = two intervals + skew: not beyond
    assert outcomes(Sweeper(sw).sweep()) == {exp.lease_id: "reclaimed"}
    assert lease_ids(sw) == {beat.lease_id}
    at(131)
    assert outcomes(Sweeper(sw).sweep()) == {beat.lease_id: "reclaimed"}


def test_forced_reclaim_needs_admin(sfleet, monkeypatch):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    live = a.acquire(["f/live"], ttl=600)
    before = sw.store.list_refs()

    def refuse(action):
        raise errors.Forbidden(f"{action} needs a gitlease-admin key")

    monkeypatch.setattr(sw, "require_admin", refuse)
    with pytest.raises(errors.Forbidden):
        Sweeper(sw).force(live.lease_id)
    assert sw.store.list_refs() == before and read_log(sw.store) == []
    monkeypatch.undo()
    got = Sweeper(sw).force(live.lease_id, action="force-release")
    assert got.outcome == "reclaimed" and got.reason == "forced=active"
    (entry,) = read_log(sw.store)
    assert entry.doc["action"] == "force-release" and entry.doc["by"] == "unsigned:sweeper"
    with pytest.raises(errors.LeaseLost):
        a.renew(live.lease_id)  # the holder learns it lost the lease


# ---------------------------------------------------------------------------------- CLI


def _past_clock():
    return FakeClock(time.time() - 1000)


def test_cli_sweep_log_and_forced_release(make_repo, tmp_path):
    bare = tmp_path / "store.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    repo = make_repo("ops")
    git(repo, "config", "lease.remote", bare.as_uri())
    (tmp_path / "agents").mkdir()
    fleet = Fleet(tmp_path / "agents", bare.as_uri(), clock=_past_clock())
    holder = fleet.agent("holder")
    stale = plant(holder, ["cli/stale"], ttl=60)  # expired about 940 s ago by the real clock
    live = plant(holder, ["cli/live"], ttl=3600)
    live2 = plant(holder, ["cli/live2"], ttl=3600)
    env = {"GITLEASE_AGENT": "ops-sweeper"}

    res = cli(repo, "sweep-stale", "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    assert re.fullmatch(rf"would reclaim: {stale} owner=job_4818 expired=9\d\ds\n", res.stdout), res.stdout
    res = cli(repo, "sweep", env=env)
    assert res.returncode == 0, res.stderr
    assert re.fullmatch(rf"reclaimed: {stale} owner=job_4818 expired=9\d\ds\n", res.stdout), res.stdout
    res = cli(repo, "sweep-stale", "--json", env=env)
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["ok"] and doc["result"]["results"] == []
    assert doc["result"]["auditRef"] == "refs/leases-audit/ops-sweeper"

    res = cli(repo, "release", "--force", live, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == f"lease released: {live}"
    res = cli(repo, "sweep-stale", "--force", live2, "--json", env=env)
    doc = json.loads(res.stdout)
    assert doc["ok"] and doc["result"]["results"][0]["reason"] == "forced=active"
    res = cli(repo, "release", "--force", live2, "--json", env=env)
    assert res.returncode == 1 and json.loads(res.stdout)["error"]["kind"] == "error"  # no such lease any more

    res = cli(repo, "log", env=env)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert re.search(rf"Z  reclaim +{stale}  v1  by=ops-sweeper  expired=9\d\ds owner=job_4818 ", text), text
    assert re.search(rf"Z  force-release {live}  v1  by=unsigned:ops-sweeper  forced=active .*\[unsigned\]", text)
    assert re.search(rf"Z  acquire +{stale}  v1  by=holder  task=job_4818", text)  # kept by the audit entry
    res = cli(repo, "log", "--lease", live2, "--json", env=env)
    events = json.loads(res.stdout)["result"]["events"]
    assert [e["event"] for e in events] == ["acquire", "reclaim"] and events[1]["detail"].startswith("forced=")
    res = cli(repo, "show", live, env=env)
    assert res.returncode == 1 and re.fullmatch(
        rf"git-lease: lease {live} is gone from store {re.escape(bare.as_uri())}: force-released by "
        rf"unsigned:ops-sweeper at 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ \(rule forced\); "
        rf"see 'git lease log --lease {live}'\n",
        res.stderr,
    ), res.stderr
    res = cli(repo, "show", "lease_01nosuchlease000000000", env=env)
    assert res.returncode == 1 and "no trace of it in the audit log (a typo?)" in res.stderr
    res = cli(repo, "log", "--since", "1m", "--json", env=env)
    assert {e["event"] for e in json.loads(res.stdout)["result"]["events"]} == {"reclaim", "force-release"}
    assert cli(repo, "log", "--since", "yesterday").returncode == 2


# --------------------------------------------------------------------------- CI install


def _yaml(path):
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(path.read_text())


def _check_schema(builtin, path):
    exe = os.path.join(os.path.dirname(sys.executable), "check-jsonschema")
    res = subprocess.run([exe, "--builtin-schema", builtin, str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ci_install_github_validates_against_the_workflow_schema(make_repo):
    repo = make_repo("gh")
    res = cli(repo, "ci", "install", "github", "--install", "gitlease>=0.1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "wrote: .github/workflows/gitlease-sweep.yml"
    wf = repo / ".github/workflows/gitlease-sweep.yml"
    _check_schema("vendor.github-workflows", wf)
    broken = wf.parent / "broken.yml"  # the check can fail: a wrong permission level is refused
    broken.write_text(wf.read_text().replace("contents: write", "contents: writ"))
    with pytest.raises(AssertionError):
        _check_schema("vendor.github-workflows", broken)
    broken.unlink()
    doc = _yaml(wf)
    assert doc[True if True in doc else "on"]["schedule"] == [{"cron": "*/5 * * * *"}]
    assert "workflow_dispatch" in doc[True if True in doc else "on"]
    assert doc["permissions"] == {"contents": "write"}
    assert doc["concurrency"] == {"group": "gitlease-sweep", "cancel-in-progress": False}
    steps = doc["jobs"]["sweep"]["steps"]
    assert any("git lease sweep-stale" in s.get("run", "") for s in steps)
    res = cli(repo, "ci", "install", "github", "--install", "gitlease==0.2")
    assert res.returncode == 1  # a different install spec: refuses to clobber
    res = cli(repo, "ci", "install", "github", "--install", "gitlease>=0.1")
    assert res.returncode == 0 and "up to date" in res.stdout
    assert cli(repo, "ci", "install", "github", "--install", "gitlease==0.2", "--overwrite").returncode == 0


def test_ci_install_gitlab_validates_against_the_gitlab_schema(make_repo):
    repo = make_repo("gl")
    res = cli(repo, "ci", "install", "gitlab", "--install", "gitlease>=0.1")
    assert res.returncode == 0, res.stderr
    job = repo / ".gitlab/gitlease-sweep.yml"
    _check_schema("vendor.gitlab-ci", job)
    _check_schema("vendor.gitlab-ci", repo / ".gitlab-ci.yml")
    assert _yaml(repo / ".gitlab-ci.yml") == {"include": [{"local": ".gitlab/gitlease-sweep.yml"}]}
    spec = _yaml(job)["gitlease-sweep"]
    assert spec["resource_group"] == "gitlease-sweep" and "schedule" in spec["rules"][0]["if"]
    other = make_repo("gl2")
    (other / ".gitlab-ci.yml").write_text("test:\n  script: [make test]\n")
    res = cli(other, "ci", "install", "gitlab", "--install", "gitlease>=0.1")
    assert res.returncode == 0 and "add to .gitlab-ci.yml" in res.stdout
    assert (other / ".gitlab-ci.yml").read_text() == "test:\n  script: [make test]\n"  # theirs, untouched
    assert cli(other, "ci", "install", "jenkins").returncode == 2


def test_sweep_keys_from_git_config(make_repo):
    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo

    def sweep_settings():
        s = resolve(Repo.discover(repo).config, env={})
        return s.sweep_expired, s.sweep_missed_heartbeats, s.sweep_dead_holder, s.progress_timeout

    repo = make_repo("cfg")
    assert sweep_settings() == (True, True, True, None)
    for key, value in (
        ("lease.sweep.expired", "false"),
        ("lease.sweep.missedHeartbeats", "no"),
        ("lease.sweep.deadHolder", "off"),
        ("lease.progressTimeout", "10m"),
    ):
        git(repo, "config", key, value)
    assert sweep_settings() == (False, False, False, 600)
    git(repo, "config", "lease.sweep.expired", "maybe")
    with pytest.raises(errors.ConfigError):
        resolve(Repo.discover(repo).config, env={})
    res = cli(repo, "sweep", "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["error"]["kind"] == "config"
