"""The lease protocol against every store kind: local refs, file://, git daemon, smart HTTP."""

import pytest
from conftest import git, not_released_by_another, run_git

from gitlease.core import errors
from gitlease.core.refnames import id_ref, scope_ref
from gitlease.core.store import RefUpdate


def test_acquire_refuse_disjoint(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    got = a.acquire(["services/billing", "libs/tax"])
    for overlapping in (["services"], ["services/billing/api.py"], ["."], ["libs/tax"]):
        with pytest.raises(errors.HeldError) as err:
            b.acquire(overlapping)
        assert err.value.exit_code == 3
        assert got.lease_id in str(err.value) and "task=task-a" in str(err.value) and "agent=a" in str(err.value)
        assert "300s left" in str(err.value)
    assert b.acquire(["services/tax"]).lease_id
    assert b.acquire(["services/billing2"]).lease_id
    refs = a.store.list_refs()
    assert refs[scope_ref("services/billing")] == got.oid and refs[id_ref(got.lease_id)] == got.oid


def test_atomic_multi_path_leaves_nothing(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    a.acquire(["x/blocked"])
    before = a.store.list_refs()
    with pytest.raises(errors.HeldError):
        b.acquire(["free/one", "x/blocked/deeper", "zz"])
    assert a.store.list_refs() == before
    assert b.held_here() == {}


def test_renew_release_roundtrip(fleet):
    a = fleet.agent("a")
    got = a.acquire(["a"], ttl=60)
    fleet.clock.advance(30)
    r = a.renew(got.lease_id)
    assert r.record.version == 2 and r.record.expires == fleet.clock.now() + 60
    view, history, _ = a.show(got.lease_id)
    assert [h.record.version for h in history] == [2, 1]
    assert view.grant_oid == got.oid and view.current_oid == r.oid
    a.release(got.lease_id)
    assert a.store.list_refs() == {}
    assert a.held_here() == {}


def test_renew_after_expiry_refused(fleet):
    a = fleet.agent("a")
    got = a.acquire(["a"], ttl=60)
    fleet.clock.advance(61)
    with pytest.raises(errors.LeaseLost) as err:
        a.renew(got.lease_id)
    assert err.value.exit_code == 6 and "after expiry" in str(err.value)


def test_expired_blocker_cleared_only_beyond_skew(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    old = a.acquire(["svc"], ttl=60)
    fleet.clock.advance(60 + 29)  # expired, but within the 30 s skew margin
    with pytest.raises(errors.HeldError) as err:
        b.acquire(["svc/x"])
    assert "within the skew margin" in str(err.value)
    fleet.clock.advance(2)
    got = b.acquire(["svc/x"])
    assert got.cleared == (old.lease_id,)
    # the old holder finds out: renew is refused, and release changes nothing
    with pytest.raises(errors.LeaseLost):
        a.renew(old.lease_id)


def test_renew_after_retake_is_lost(fleet):
    """Someone cleared the expired lease and took the scope again: the old holder's renew fails, exit 6."""
    a, b = fleet.agent("a"), fleet.agent("b")
    old = a.acquire(["svc"], ttl=60)
    # the old holder's clock is behind; it still believes it holds the lease
    fleet.clock.advance(100)
    b.acquire(["svc"])
    fleet.clock._now -= 90  # a's view of time: 10 s after acquiring (same FakeClock object, moved back)
    with pytest.raises(errors.LeaseLost) as err:
        a.renew(old.lease_id)
    assert err.value.exit_code == 6 and "lost or replaced" in str(err.value)


def test_release_not_held_changes_nothing(fleet):
    a, b, got, before = not_released_by_another(fleet)
    with pytest.raises(errors.NotHeld):
        b.renew(got.lease_id)
    assert a.store.list_refs() == before


def test_release_of_replaced_lease_changes_nothing(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    old = a.acquire(["svc"], ttl=60)
    fleet.clock.advance(100)
    new = b.acquire(["svc"])
    before = a.store.list_refs()
    with pytest.raises(errors.LeaseLost):
        a.release(old.lease_id)
    assert a.store.list_refs() == before
    assert before[id_ref(new.lease_id)] == new.oid


def test_can_start(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    a.acquire(["services/billing"])
    paths, blockers, _ = b.can_start(["services/tax"])
    assert blockers == []
    paths, blockers, _ = b.can_start(["services"])
    assert len(blockers) == 1 and blockers[0].record.owner.agent_id == "a"


def _plant(svc, ref, body, name="lease.json"):
    """Write an arbitrary commit (not made by gitlease) into the store under ``ref``."""
    w = svc.objects
    oid = w.commit(w.tree({name: w.blob(body)}), (), "Mallory <m@x>", 1_800_000_000, "junk")
    assert svc.store.apply([RefUpdate(ref, oid, None)]).ok
    return oid


@pytest.mark.parametrize(
    "body,why",
    [(b"not json", "not JSON"), (b'{"schema":"nope/2"}', "unsupported schema"), (b"{" + b" " * 70000 + b"}", "limit")],
)
def test_malformed_record_fails_closed(fleet, body, why):
    a, b = fleet.agent("a"), fleet.agent("b")
    _plant(a, scope_ref("svc/core"), body)
    snap = b.status()
    bad = [v for v in snap.leases if not v.valid]
    assert len(bad) == 1 and why in " ".join(bad[0].problems)
    assert bad[0].paths == ("svc/core",)
    with pytest.raises(errors.HeldError) as err:
        b.acquire(["svc"])  # never cleared automatically, whatever its age
    assert "invalid" in str(err.value)
    fleet.clock.advance(10**7)
    with pytest.raises(errors.HeldError):
        b.acquire(["svc/core/x"])
    assert b.acquire(["svc/other"]).lease_id


def test_foreign_ref_under_scope_namespace(fleet):
    a = fleet.agent("a")
    _plant(a, "refs/leases/scope/bad%zz/x", b"{}")
    snap = a.status()
    assert any("not a gitlease scope ref" in " ".join(v.problems) for v in snap.leases)


def test_forged_id_ref_version_detected(fleet):
    """A new version written by someone else under the id ref is flagged and the owner's renew fails."""
    a, b = fleet.agent("a"), fleet.agent("b")
    got = a.acquire(["svc"])
    w = b.objects
    forged = w.commit(w.tree({"lease.json": w.blob(b"junk")}), (), "Mallory <m@x>", 1_800_000_000, "f")
    assert b.store.apply([RefUpdate(id_ref(got.lease_id), forged, got.oid)]).ok
    view = b.status().find(got.lease_id)
    assert view is not None and not view.valid
    with pytest.raises(errors.LeaseLost):
        a.renew(got.lease_id)
    with pytest.raises(errors.HeldError):
        b.acquire(["svc"])


def test_hanging_remote_times_out_and_assumes_nothing(tmp_path):
    """A server that accepts and never answers: the push times out (its process group is killed), the
    re-read times out too, and the acquire fails closed without recording anything as held."""
    from helpers import Fleet
    from servers import HangingServer

    with HangingServer() as hang:
        fleet = Fleet(tmp_path, hang.url)
        a = fleet.agent("a", timeout=2)
        with pytest.raises(errors.RemoteUnavailable) as err:
            a.acquire(["svc"])
        assert "unknown" in str(err.value) or "did not answer" in str(err.value)
        assert a.held_here() == {}
        with pytest.raises(errors.RemoteUnavailable):
            a.status()


def test_push_timed_out_after_landing_is_resolved_by_reading(tmp_path):
    """The server updates the refs, then hangs in post-receive: the client's push times out (ambiguous).
    gitlease re-reads, finds its own unique objects in place, and knows it holds the lease."""
    import os
    import stat

    from helpers import Fleet

    bare = tmp_path / "slow.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    hook = bare / "hooks" / "post-receive"
    hook.write_text("#!/bin/sh\nexec sleep 60\n")  # a server that hangs after landing (not a test sleep)
    hook.chmod(hook.stat().st_mode | stat.S_IEXEC)
    fleet = Fleet(tmp_path, bare.as_uri())
    a = fleet.agent("a", timeout=3)
    got = a.acquire(["svc"])
    assert got.lease_id in a.held_here()
    os.unlink(hook)
    assert a.store.list_refs()[id_ref(got.lease_id)] == got.oid
    a.release(got.lease_id)
    assert a.store.list_refs() == {}


class _ActingClock:
    """A FakeClock seam: ``act()`` runs on the ``on``-th sleep (another writer's doing while we wait); ``sleeps``
    counts the sleeps."""

    def __init__(self, clock, act, on) -> None:
        self._clock, self._act, self._on, self.sleeps = clock, act, on, 0

    def __getattr__(self, name):
        return getattr(self._clock, name)

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.sleeps == self._on:
            self._act()
        self._clock.sleep(seconds)


def _undoing_clock(clock, store, ref, oid, on):
    """The other writer deletes its remnant while we wait (on the given sleep), as ``_undo_partial`` does right
    after its push fails."""
    return _ActingClock(clock, lambda: _assert_ok(store.apply([RefUpdate(ref, None, oid)])), on)


def _assert_ok(out) -> None:
    assert out.ok, out


@pytest.mark.parametrize("undone", [True, False])
def test_a_refused_acquire_waits_out_another_writers_remnant_and_refuses_if_it_stays(tmp_path, remote_file, undone):
    """After a lost push, blockers that are all remnants of other writers' attempts (an id ref without scope
    refs) are looked at again a few times: gone, the scope is free (no refusal); still there, they block as
    before (fail closed). A real lease among the blockers refuses at once."""
    from gitlease.service import grants as leases_mod
    from testing.fleet import Fleet

    fleet = Fleet(tmp_path, remote_file.url)
    b, a = fleet.agent("b"), fleet.agent("a")
    rem = b.acquire(["svc/x"], ttl=600)
    assert b.store.apply([RefUpdate(scope_ref("svc/x"), None, rem.oid)]).ok  # only its id ref is left
    a.clock = _undoing_clock(fleet.clock, a.store, id_ref(rem.lease_id), rem.oid, on=2 if undone else 99)
    snap = a.snapshot(use_cache=False, paths=("svc",))
    assert [v.lease_id for v in snap.blocking(("svc",), a.clock.now(), 30)] == [rem.lease_id]
    got = a._wait_out_remnants(("svc",), snap, set())
    blockers = got.blocking(("svc",), a.clock.now(), 30)
    if undone:
        assert blockers == [] and a.clock.sleeps == 2
    else:
        assert [v.lease_id for v in blockers] == [rem.lease_id] and a.clock.sleeps == leases_mod.REMNANT_LOOKS
    real = b.acquire(["svc/y"], ttl=600)  # a real lease: no waiting at all
    a.clock = _undoing_clock(fleet.clock, a.store, "refs/none", "0" * 40, on=99)
    got = a._wait_out_remnants(("svc",), a.snapshot(use_cache=False, paths=("svc",)), set())
    assert real.lease_id in [v.lease_id for v in got.blocking(("svc",), a.clock.now(), 30)] and a.clock.sleeps == 0


@pytest.mark.parametrize("unlocked_on", [7, None])
def test_an_acquire_that_only_loses_races_goes_on_until_it_wins_or_its_patience_ends(
    tmp_path, remote_file, unlocked_on
):
    """Pushes refused only for another writer's ref lock (the race test's eight racers all losing to each other's
    locks) are not a refusal: the acquire tries again after jittered pauses, past ACQUIRE_ATTEMPTS, until it wins;
    with the lock never gone it gives up once LOST_RACE_PATIENCE has passed, naming git's reason, and leaves
    nothing behind."""
    from gitlease.service import grants
    from testing.fleet import Fleet

    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    lock = remote_file.path / (scope_ref("svc") + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    a.clock = _ActingClock(fleet.clock, lock.unlink, unlocked_on)  # the other writer's push ends
    start = a.clock.monotonic()
    if unlocked_on is not None:
        got = a.acquire(["svc"])
        assert a.clock.sleeps == unlocked_on > grants.ACQUIRE_ATTEMPTS
        assert a.store.list_refs()[scope_ref("svc")] == got.oid
        return
    with pytest.raises(errors.GitLeaseError) as err:
        a.acquire(["svc"])
    assert not isinstance(err.value, errors.HeldError) and err.value.exit_code != 3
    assert "could not acquire svc: atomic transaction failed" in str(err.value) and "cannot lock ref" in str(err.value)
    assert "lost every race for 15s" in str(err.value)
    waited = a.clock.monotonic() - start
    assert grants.LOST_RACE_PATIENCE <= waited <= grants.LOST_RACE_PATIENCE + grants.LOST_RACE_PAUSE_CAP
    assert a.store.list_refs() == {} and a.held_here() == {}


def test_a_refusal_that_is_no_race_is_not_retried_past_the_attempts():
    """What git says of a lost race (another push's lock, a ref moved, a directory/file clash) against a rule that
    would refuse the push again."""
    from gitlease.core.store import Outcome
    from gitlease.service.grants import lost_race

    def out(*statuses):
        return Outcome(ok=False, statuses={f"refs/leases/x{i}": s for i, s in enumerate(statuses)}, message="")

    assert lost_race(out("rejected:stale info", "rejected:atomic push failed"))
    assert lost_race(out("rejected:failed to update ref", "ok"))
    assert lost_race(
        out("rejected:cannot lock ref 'refs/leases/scope/a': 'refs/leases/scope/a/b' exists; cannot create")
    )
    assert not lost_race(out("rejected:pre-receive hook declined"))
    assert not lost_race(out("rejected:stale info", "rejected:deny updating a hidden ref"))
    assert not lost_race(out())  # no status at all: the server was not reached


@pytest.mark.parametrize("stale", ["svc", "."])
def test_a_stale_reflog_in_the_way_of_a_scope_is_healed_not_left_to_refuse_it_for_good(tmp_path, remote_file, stale):
    """A server keeping a reflog of every ref can be left, by two creates racing (``.../svc`` and
    ``.../svc/x``), with the reflog of a ref that was never created; git then refuses every create below it
    ("Not a directory") while no ref is there to see (the race test's r5, 7 runs of 90 under load). The acquire
    creates and deletes that ref, which takes the reflog with it, and wins; the store is left as it was."""
    from testing.fleet import Fleet

    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    name = "refs/leases/scope" + ("" if stale == "." else f"/{stale}")
    log = remote_file.path / "logs" / name
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    blob = git(a.repo.cwd, "hash-object", "-w", "--stdin", input="x\n").strip()
    plain = run_git(a.repo.cwd, "push", remote_file.url, f"{blob}:refs/leases/scope/svc/x/y", check=False)
    assert plain.returncode != 0 and "Not a directory" in plain.stderr  # git itself refuses the create, for good
    got = a.acquire(["svc/x"])
    assert a.store.list_refs() == {id_ref(got.lease_id): got.oid, scope_ref("svc/x"): got.oid}
    assert not log.is_file()
    a.release(got.lease_id)
    assert a.store.list_refs() == {}
