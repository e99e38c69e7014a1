"""The heartbeat's schedule on a fake clock (renew at the interval, lost at the stop deadline, never later),
timing validation, progress notes, acquire --wait, gitlease.hold, and the fenced renewal in the service."""

import random
import subprocess
import threading

import pytest
from conftest import git
from helpers import Fleet

import gitlease
from gitlease.core import errors
from gitlease.core.clock import FakeClock
from gitlease.core.progress import next_progress
from gitlease.core.record import Progress
from gitlease.core.refnames import id_ref
from gitlease.liveness.heartbeat import Confirmed, Heartbeat, Timing
from gitlease.liveness.wait import Backoff, acquire_wait

# ----------------------------------------------------------------------------- timing


def test_timing_refuses_combinations_that_do_not_fit_the_ttl():
    Timing.for_ttl(300, renew_every=120).check()  # the example: 120 + 30 + 10 + 1 < 300
    with pytest.raises(errors.UsageError) as err:
        Timing(ttl=300, renew_every=280, timeout=30, grace=10).check()
    assert err.value.exit_code == 2
    assert "renew every 280s + request timeout 30s + grace 10s + margin 1s = 321s" in str(err.value)
    assert "less than the TTL (300s)" in str(err.value)
    with pytest.raises(errors.UsageError):
        Timing(ttl=60, renew_every=0, timeout=5).check()
    for ttl in (5, 10, 60, 300, 86400):  # the defaults always fit
        t = Timing.for_ttl(ttl)
        assert t.renew_every + t.timeout + t.grace + t.margin < ttl


# ----------------------------------------------------------------------- the schedule


class FakeLease:
    """A lease on a fake clock: each attempt renews it for ``ttl`` from the moment it starts, unless a
    scripted failure says otherwise."""

    def __init__(self, clock, ttl, script=()):
        self.clock, self.ttl = clock, ttl
        self.script = list(script)  # per attempt: None (ok), an exception, or ("hang", exception)
        self.calls = []

    def attempt(self, budget, progress):
        start = self.clock.monotonic()
        self.calls.append((start, budget, progress))
        step = self.script.pop(0) if self.script else None
        if isinstance(step, tuple):  # hangs until its git calls time out (they share the budget)
            self.clock.advance(budget)
            raise step[1]
        if step is not None:
            raise step
        return self.clock.now() + self.ttl


def beat(clock, lease, timing, **kw):
    return Heartbeat(lease.attempt, timing, clock.now() + timing.ttl, clock=clock, **kw)


def test_renews_at_the_interval():
    clock = FakeClock()
    timing = Timing(ttl=60, renew_every=20, timeout=5, grace=5)
    lease = FakeLease(clock, 60)
    hb = beat(clock, lease, timing)
    renewed = []
    hb.on_renewed = lambda expiry: (renewed.append(expiry), len(renewed) == 5 and hb.stop())
    hb.run()
    assert [c[0] for c in lease.calls] == [20, 40, 60, 80, 100]
    assert all(budget == 5 for _, budget, _ in lease.calls)
    assert renewed == [80, 100, 120, 140, 160]  # each: its start + ttl, in the local monotonic clock
    assert not hb.lost.is_set()


def test_unreachable_remote_is_retried_and_lost_at_the_deadline_never_later():
    clock = FakeClock()
    timing = Timing(ttl=60, renew_every=20, timeout=5, grace=5)
    fail = errors.RemoteUnavailable("connection refused")
    lease = FakeLease(clock, 60, [None] + [fail] * 100)
    lost = []
    hb = beat(clock, lease, timing, on_lost=lost.append)
    hb.run()
    # renewed at 20 (expiry 80); from 40 on every attempt fails; deadline = 80 - grace 5 - margin 1 = 74
    assert hb.lost.is_set() and len(lost) == 1 and "connection refused" in lost[0]
    assert [c[0] for c in lease.calls][:3] == [20, 40, 40.5]
    assert hb.stopped_at <= 74 and hb.stopped_at >= 74 - 0.5 - 5  # the last pause is at most RETRY_CAP
    for start, budget, _ in lease.calls:
        assert start + budget <= 74  # every attempt ends by the deadline
    assert hb.stopped_at + timing.grace < 80  # SIGKILL lands before the expiry


def test_hanging_renewals_are_cut_at_the_deadline():
    clock = FakeClock()
    timing = Timing(ttl=30, renew_every=10, timeout=8, grace=3)
    hang = ("hang", errors.RemoteUnavailable("git push did not answer within 2.67s"))
    lease = FakeLease(clock, 30, [hang] * 100)
    hb = beat(clock, lease, timing)
    hb.run()
    deadline = 30 - 3 - 1
    assert hb.lost.is_set() and hb.stopped_at <= deadline
    assert [round(c[1], 2) for c in lease.calls][0] == 8
    for start, budget, _ in lease.calls:
        assert start + budget <= deadline + 1e-9
    assert "no renewal confirmed before the stop deadline" in hb.reason


def test_refused_renewal_is_lost_at_once():
    clock = FakeClock()
    timing = Timing(ttl=60, renew_every=20, timeout=5, grace=5)
    lease = FakeLease(clock, 60, [errors.LeaseLost("lease lost or replaced: x")])
    lost = []
    hb = beat(clock, lease, timing, on_lost=lost.append)
    hb.run()
    assert lost == ["lease lost or replaced: x"] and hb.stopped_at == 20 and len(lease.calls) == 1


def test_progress_is_sent_with_the_next_renewal_once():
    clock = FakeClock()
    lease = FakeLease(clock, 60)
    hb = beat(clock, lease, Timing(ttl=60, renew_every=20, timeout=5, grace=5))
    hb.report("tests 40/120")
    hb.on_renewed = lambda expiry: len(lease.calls) == 2 and hb.stop()
    hb.run()
    assert [c[2] for c in lease.calls] == ["tests 40/120", None]


def test_stop_wakes_a_real_wait_at_once():
    timing = Timing(ttl=3600, renew_every=1000, timeout=30, grace=10)
    hb = Heartbeat(lambda budget, note: pytest.fail("must not renew"), timing, 4e9)
    t = threading.Thread(target=hb.run)
    t.start()
    hb.stop()
    t.join(5)
    assert not t.is_alive() and not hb.lost.is_set()


# ---------------------------------------------------------------------------- progress


def test_progress_counter_comes_from_the_note_and_at_moves_only_on_progress():
    p1 = next_progress("tests 40/120", None, 1_800_000_000)
    assert (p1.note, p1.counter, p1.at) == ("tests 40/120", 40, "2027-01-15T08:00:00Z")
    assert next_progress("tests 40/120", p1, 1_800_000_100) is p1  # stuck at 40: not progress
    p2 = next_progress("tests 41/120", p1, 1_800_000_100)
    assert p2.counter == 41 and p2.at != p1.at
    q1 = next_progress("compiling", None, 0)
    q2 = next_progress("linking", q1, 10)
    assert (q1.counter, q2.counter) == (1, 2) and next_progress("linking", q2, 20) is q2
    assert next_progress("a\nb\x00c", None, 0).note == "a b c"


def test_renew_progress_recorded_in_the_record(tmp_path):
    fleet = Fleet(tmp_path, None)
    a = fleet.agent("a")
    got = a.acquire(["svc"])
    r = a.renew(got.lease_id, progress="tests 40/120")
    assert r.record.progress == Progress("tests 40/120", 40, r.record.renewed_at)
    fleet.clock.advance(10)
    r2 = a.renew(got.lease_id)  # a plain heartbeat keeps the progress and its time
    assert r2.record.progress == r.record.progress
    r3 = a.renew(got.lease_id, progress="tests 40/120")
    assert r3.record.progress.at == r.record.progress.at


# ------------------------------------------------------------------------------ --wait


class HookClock(FakeClock):
    """A fake clock whose sleeps run a hook (another agent acting meanwhile)."""

    def __init__(self, hook=None):
        super().__init__()
        self.hook = hook

    def sleep(self, seconds):
        super().sleep(seconds)
        if self.hook:
            self.hook(len(self.sleeps))


def test_wait_wakes_when_the_holder_releases(tmp_path):
    clock = HookClock()
    fleet = Fleet(tmp_path, None, clock)
    a, b = fleet.agent("a"), fleet.agent("b")
    held = a.acquire(["svc/billing"])
    clock.hook = lambda n: n == 3 and a.release(held.lease_id)
    waits = []
    got = acquire_wait(b, ["svc"], wait=600, rng=random.Random(1), on_wait=lambda r, s: waits.append(s))
    assert got.record.paths == ("svc",) and len(clock.sleeps) == 3 and len(waits) == 3
    assert sum(clock.sleeps) < 10  # woke on the first poll after the release, not at the deadline
    steps = [min(15, 0.5 * 2**i) for i in range(3)]
    assert all(s / 2 <= d <= s for d, s in zip(clock.sleeps, steps))  # jittered exponential backoff


def test_wait_gives_up_at_the_deadline(tmp_path):
    clock = FakeClock()
    fleet = Fleet(tmp_path, None, clock)
    a, b = fleet.agent("a"), fleet.agent("b")
    held = a.acquire(["svc"], ttl=3600)
    start = clock.monotonic()
    with pytest.raises(errors.HeldError) as err:
        acquire_wait(b, ["svc/x"], wait=60, backoff=Backoff(first=1, cap=8), rng=random.Random(2))
    assert (
        err.value.exit_code == 3 and held.lease_id in str(err.value) and "gave up after waiting 60s" in str(err.value)
    )
    assert clock.monotonic() - start == pytest.approx(60)  # the last pause is cut at the deadline
    assert max(clock.sleeps) <= 8


def test_wait_zero_tries_once(tmp_path):
    fleet = Fleet(tmp_path, None)
    a, b = fleet.agent("a"), fleet.agent("b")
    a.acquire(["svc"])
    with pytest.raises(errors.HeldError):
        acquire_wait(b, ["svc"], wait=0)
    assert fleet.clock.sleeps == []


# ------------------------------------------------------------------------------- hold()


class GatedClock(FakeClock):
    """Each sleep waits for the test to let it pass (step), then advances fake time."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Semaphore(0)
        self.parked = threading.Condition()
        self.n_parked = 0

    def sleep(self, seconds):
        with self.parked:
            self.n_parked += 1
            self.parked.notify_all()
        assert self.gate.acquire(timeout=30), "the test never stepped the clock"
        super().sleep(seconds)

    def wait_parked(self, n):
        with self.parked:
            assert self.parked.wait_for(lambda: self.n_parked >= n, timeout=30)

    def step(self):
        self.gate.release()


def test_hold_renews_in_the_background_and_releases(tmp_path):
    clock = GatedClock()
    fleet = Fleet(tmp_path, None, clock)
    a = fleet.agent("a")
    with gitlease.hold(scope=["svc"], ttl=60, renew_every=20, service=a) as lease:
        clock.wait_parked(1)
        lease.progress("step 1/3")
        clock.step()
        clock.wait_parked(2)  # renewed once, waiting for the next interval
        view = a.snapshot().find(lease.lease_id)
        assert view.record.version == 2 and view.record.progress.counter == 1
        lease.check()
        assert not lease.lost.is_set()
        lease.heartbeat.stop()
        clock.step()  # the parked heartbeat wakes, sees the stop, and ends
    assert a.store.list_refs() == {} and a.held_here() == {}


def test_hold_reports_loss_and_check_raises(tmp_path):
    clock = GatedClock()
    fleet = Fleet(tmp_path, None, clock)
    a = fleet.agent("a")
    b = fleet.agent("b")
    b.clock = FakeClock(clock.now() + 60 + 31)  # the other agent sees A's lease expired beyond the skew
    reasons = []
    with pytest.raises(errors.LeaseLost):
        with gitlease.hold(scope=["svc"], ttl=60, renew_every=20, service=a, on_lost=reasons.append) as lease:
            clock.wait_parked(1)
            taken = b.acquire(["svc"])  # clears A's lease and takes the scope
            clock.step()  # A's heartbeat renews: refused
            assert lease.lost.wait(30)
            assert "lease lost or replaced" in lease.reason
            lease.check()
    assert len(reasons) == 1 and "lease lost or replaced" in reasons[0]
    assert b.store.list_refs()[id_ref(taken.lease_id)] == taken.oid  # A's exit released nothing of B's


def test_hold_with_wait_zero_refuses_at_once(tmp_path):
    fleet = Fleet(tmp_path, None)
    a, b = fleet.agent("a"), fleet.agent("b")
    a.acquire(["svc"])
    with pytest.raises(errors.HeldError):
        with gitlease.hold(scope=["svc"], ttl=60, wait=0, service=b):
            pytest.fail("must not enter the block")
    assert fleet.clock.sleeps == []


# ------------------------------------------------------------------- fenced renewal


@pytest.fixture
def pushers(tmp_path, remote_file):
    """Agent A's clone with a branch to push, agent B, on one file:// remote that is also the lease store."""
    fleet = Fleet(tmp_path, "origin")
    work = fleet.path("a")
    git(work, "remote", "add", "origin", remote_file.url)
    git(work, "commit", "-q", "--allow-empty", "-m", "base")
    git(work, "push", "-q", "origin", "HEAD:refs/heads/main")
    git(work, "checkout", "-q", "-b", "feature")
    git(work, "commit", "-q", "--allow-empty", "-m", "A's work")
    git(fleet.path("b"), "remote", "add", "origin", remote_file.url)
    return fleet, work, remote_file


def remote_ref(remote, ref):
    return git(remote.path, "for-each-ref", "--format=%(objectname)", ref).strip() or None


def test_fenced_push_lands_branch_and_renewal_together(pushers):
    fleet, work, remote = pushers
    a = fleet.agent("a")
    got = a.acquire(["svc"])
    r = a.push_fenced(got.lease_id, "origin", ["refs/heads/feature:refs/heads/feature"])
    assert r.record.version == 2
    assert remote_ref(remote, "refs/heads/feature") == git(work, "rev-parse", "feature").strip()
    assert remote_ref(remote, id_ref(got.lease_id)) == r.oid


def test_fenced_push_after_takeover_lands_nothing(pushers):
    fleet, work, remote = pushers
    a, b = fleet.agent("a"), fleet.agent("b")
    got = a.acquire(["svc"], ttl=60)
    b.clock = FakeClock(fleet.clock.now() + 60 + 31)
    b.acquire(["svc"])
    with pytest.raises(errors.LeaseLost) as err:
        a.push_fenced(got.lease_id, "origin", ["refs/heads/feature:refs/heads/feature"])
    assert err.value.exit_code == 6
    assert remote_ref(remote, "refs/heads/feature") is None
    head = git(work, "rev-parse", "feature").strip()
    assert subprocess.run(["git", "cat-file", "-e", head], cwd=remote.path).returncode != 0  # not even sent


def test_fenced_push_refused_by_the_branch_keeps_the_lease(pushers):
    fleet, work, remote = pushers
    a = fleet.agent("a")
    got = a.acquire(["svc"])
    git(work, "push", "-q", "origin", "main:refs/heads/other")
    git(work, "checkout", "-q", "--orphan", "unrelated")
    git(work, "commit", "-q", "--allow-empty", "-m", "unrelated")
    with pytest.raises(errors.PushRejected) as err:
        a.push_fenced(got.lease_id, "origin", ["refs/heads/unrelated:refs/heads/other"])
    assert "non-fast-forward" in str(err.value) and "still held" in str(err.value)
    assert a.renew(got.lease_id).record.version == 2  # the lease is intact and still ours


def test_fenced_push_needs_the_lease_store_on_the_pushed_remote(pushers, tmp_path):
    fleet, work, remote = pushers
    a = fleet.agent("a")
    got = a.acquire(["svc"])
    other = tmp_path / "other.git"
    git(tmp_path, "init", "-q", "--bare", str(other))
    git(work, "remote", "add", "elsewhere", other.as_uri())
    with pytest.raises(errors.UsageError, match="leases are on 'origin' and the branch goes to 'elsewhere'"):
        a.push_fenced(got.lease_id, "elsewhere", ["refs/heads/feature:refs/heads/feature"])
    a.push_fenced(got.lease_id, remote.url, ["refs/heads/feature:refs/heads/feature"])  # same URL: fine
    with pytest.raises(errors.UsageError, match="without '\\+'"):
        a.push_fenced(got.lease_id, "origin", ["+refs/heads/feature:refs/heads/feature"])
    (tmp_path / "l").mkdir()
    local = Fleet(tmp_path / "l", None)
    la = local.agent("x")
    lg = la.acquire(["svc"])
    with pytest.raises(errors.UsageError, match="this repository's own refs"):
        la.push_fenced(lg.lease_id, "origin", ["refs/heads/main:refs/heads/main"])


# ----------------------------------------------------------------- the stop deadline and progress (issue 17)


def test_stop_after_is_two_intervals_with_room_for_one_whole_attempt():
    assert Timing.for_ttl(300).stop_after == 200  # the defaults: renew every 100 s, stop 200 s after a renewal
    assert Timing.for_ttl(60, renew_every=20).stop_after == 40
    assert Timing.for_ttl(6, renew_every=1, grace=1).stop_after == 5  # 1 + timeout 1 + grace 1 + 2 x margin
    assert Timing.for_ttl(60, renew_every=55 - 15, timeout=5, grace=5).stop_after == 60  # never past the TTL
    for ttl in (5, 10, 60, 300, 86400):
        t = Timing.for_ttl(ttl)
        # after an interval, a whole attempt still fits before the stop deadline (stopBy has 1 s resolution)
        assert t.stop_after - 1 - t.grace - t.margin / 2 >= t.renew_every + t.timeout or t.stop_after == int(ttl)


class StopLease(FakeLease):
    """Each confirmed renewal is recorded with a stop deadline ``stop_after`` after it (Confirmed)."""

    def __init__(self, clock, ttl, stop_after, script=()):
        super().__init__(clock, ttl, script)
        self.stop_after = stop_after

    def attempt(self, budget, progress):
        expires = super().attempt(budget, progress)
        return Confirmed(expires, expires - self.ttl + self.stop_after)


def test_a_holder_stops_by_its_recorded_stop_deadline_not_its_expiry():
    """The early reclaim rules wait for stopBy + skew: the holder's worker must be told to stop at stopBy - grace
    - margin/2, well before the expiry, when it cannot renew."""
    clock = FakeClock()
    timing = Timing(ttl=60, renew_every=10, timeout=5, grace=5)
    fail = errors.RemoteUnavailable("connection refused")
    lease = StopLease(clock, 60, 25, [None] + [fail] * 100)
    hb = Heartbeat(lease.attempt, timing, clock.now() + 60, clock=clock, stop_by=clock.now() + 25)
    hb.run()
    # renewed at 10: stopBy 35, so the worker is told to stop by 35 - 5 - 0.5 = 29.5 (its expiry is 70)
    assert hb.lost.is_set() and 29.5 - 5 <= hb.stopped_at <= 29.5 and hb.hard_stop == 35
    for start, budget, _ in lease.calls:
        assert start + budget <= 29.5 + 1e-9


def test_silence_after_progress_loses_the_lease_before_the_stalled_rule():
    """lease.progressTimeout for hold() and run: a holder that reported progress once and then none (the same
    note again is no progress) is lost ``grace + margin/2`` before the timeout runs out."""
    clock = FakeClock()
    timing = Timing(ttl=60, renew_every=20, timeout=5, grace=5)
    lease = FakeLease(clock, 60)
    hb = beat(clock, lease, timing, progress_timeout=100)

    def on_renewed(expiry):  # the worker reports at 20 and 40 (progress), then repeats itself
        n = len(lease.calls)
        hb.report({1: "tests 1/9", 2: "tests 2/9"}.get(n, "tests 2/9"))

    hb.on_renewed = on_renewed
    hb.run()
    assert hb.lost.is_set() and "no progress reported for 100s" in hb.reason
    assert hb.stopped_at == 40 + 100 - 5 - 0.5  # progress last made at 40
    assert [c[2] for c in lease.calls][:3] == [None, "tests 1/9", "tests 2/9"]  # each sent with the next renewal


def test_hold_stops_a_silent_body_with_progress_timeout(tmp_path):
    clock = GatedClock()
    fleet = Fleet(tmp_path, None, clock)
    a = fleet.agent("a", progress_timeout=30)
    with pytest.raises(errors.LeaseLost) as err:
        with gitlease.hold(scope=["svc"], ttl=60, renew_every=20, service=a) as lease:
            lease.progress("step 1/3")  # at 0; then silent: lost at 30 - grace 6 - 0.5
            clock.wait_parked(1)
            clock.step()  # the renewal at 20 (it records the note)
            clock.wait_parked(2)
            clock.step()  # woken at the progress deadline
            assert lease.lost.wait(30)
            assert lease.heartbeat.stopped_at == 23.5
            assert a.snapshot().find(lease.lease_id).record.progress.note == "step 1/3"
    assert "no progress reported for 30s" in str(err.value)


def test_a_lease_forgotten_here_between_the_check_and_the_scope_check_is_lost_not_held_by_itself(pushers):
    """The runner's heartbeat forgets a lease it finds lost while the landing is under way: the landing's scope
    check then answers "lease lost" (exit 6: the task is re-queued), never a refusal of every path as "held by"
    the pushing lease itself (exit 4: the task failed for good, as for a stray edit). Seen in the fleet soak
    over git daemon under load."""
    from gitlease.enforce.push import check_landing

    fleet, work, remote = pushers
    a = fleet.agent("a")
    got = a.acquire(["svc"])
    a.forget(got.lease_id)  # what the heartbeat does on a lost lease
    with pytest.raises(errors.LeaseLost) as err:
        check_landing(a, got.lease_id, ["svc/x.py"])
    assert err.value.exit_code == 6 and "no longer held by this worktree" in err.value.message
