"""Reads and sweeps at scale, the I/O half (issue 22): one ``ls-remote`` a read; verdicts shared across
processes (trust.VerifiedCache) that never accept a forged, re-trusted or rolled-back version and survive a
damaged cache file; the replay memory written only when it changes; a sweep of many expired leases in a few
pushes, each lease's refs and audit entry together, a lease renewed meanwhile left alone. Real git throughout;
a "new process" is a fresh verification memo over the same clone (each agent of a fleet has its own)."""

from __future__ import annotations

import math
import os
import subprocess

import pytest
from helpers import Fleet
from test_identity import Signed, _current, _forge
from test_sweep import outcomes, plant

from gitlease.core.clock import FakeClock
from gitlease.core.refnames import id_ref
from gitlease.core.store import RefUpdate
from gitlease.identity import replay, sshsig, trust
from gitlease.ops.sweep import Sweeper
from gitlease.service.audit import read_log
from soak import serverlog


@pytest.fixture
def signed(tmp_path, remote_file):
    return Signed(tmp_path, remote_file.url)


def _ls_remotes(trace) -> int:
    return sum("built-in: git ls-remote" in line for line in trace.read_text().splitlines()) if trace.exists() else 0


@pytest.mark.parametrize("signed_store", [False, True])
def test_a_read_is_one_ls_remote(tmp_path, remote_file, monkeypatch, signed_store):
    fleet = Signed(tmp_path, remote_file.url) if signed_store else Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    got = a.acquire(["svc"], ttl=60)
    trace = tmp_path / "trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    c = fleet.agent("c")
    snap = c.status()
    assert _ls_remotes(trace) == 1  # the lease refs and HEAD's symref (the trust file's branch) in one call
    assert snap.find(got.lease_id).valid and snap.signed_store is signed_store
    if signed_store:
        assert snap.find(got.lease_id).verification == "verified" and "main" in snap.trust
    c.status()
    assert _ls_remotes(trace) == 2  # trust already read by this service: HEAD is not asked for again


def test_a_signed_read_looks_for_the_trust_files_commit_once(signed, tmp_path, monkeypatch):
    """The trust file's commit (the listing's HEAD) is fetched with the lease objects; reading the trust file
    then does not ask git again whether that commit is here."""
    got = signed.agent("a").acquire(["svc"], ttl=60)
    c = signed.agent("c")
    c.status()  # fetches everything
    trace = tmp_path / "trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    d = signed.agent("c")  # a new service on the same clone, as a new process
    assert d.status().find(got.lease_id).verification == "verified"
    checks = [ln for ln in trace.read_text().splitlines() if "built-in: git cat-file" in ln and "batch-check" in ln]
    assert len(checks) == 1, checks  # the lease objects and HEAD's commit, in one look


def test_a_snapshot_of_an_earlier_listing_is_judged_by_the_replay_memory_from_before_it(tmp_path, remote_file):
    """``snapshot(listing=...)`` (the pre-push hook's: HEAD wanted before the read) judges the listing against the
    replay memory as it was before that listing began: a newer version another read recorded meanwhile is not
    taken for a roll-back of the older one listed."""
    fleet = Fleet(tmp_path, remote_file.url)
    a, c = fleet.agent("a"), fleet.agent("c")
    got = a.acquire(["svc"], ttl=60)
    listing = c.listing()  # v1
    fleet.clock.advance(10)
    a.renew(got.lease_id)
    assert fleet.agent("c").status().find(got.lease_id).record.version == 2  # recorded in c's clone's memory
    view = c.snapshot(use_cache=False, paths=["svc/x"], listing=listing).find(got.lease_id)
    assert view.valid and view.record.version == 1, view.problems


def test_a_listing_read_by_the_hooks_lean_path_is_judged_by_the_memory_opened_before_it(tmp_path, remote_file):
    """``listing(given=...)``: the pre-push hook's lean path listed the store (enforce/quickpush.py) with the
    replay memory's file opened before; the full check reads that listing and that memory as the file was then,
    however it was replaced since. Opened after another read recorded v2, the same v1 listing is a replay."""
    from gitlease.enforce import quickpush

    fleet = Fleet(tmp_path, remote_file.url)
    a, c = fleet.agent("a"), fleet.agent("c")
    got = a.acquire(["svc"], ttl=60)
    c.status()  # the memory knows v1

    def listed():
        argv = ["git", "ls-remote", "--symref", remote_file.url, "HEAD", "refs/leases/*"]
        return subprocess.run(argv, cwd=c.repo.cwd, capture_output=True, text=True, check=True).stdout

    before = quickpush._open_memory(c.repo.shared_dir(), c.store.name)
    text = listed()  # v1
    fleet.clock.advance(10)
    a.renew(got.lease_id)
    fleet.agent("c").status()  # v2, recorded in c's clone's memory (its file replaced)
    view = c.snapshot(use_cache=False, paths=["svc/x"], listing=c.listing((text, before))).find(got.lease_id)
    assert view.valid and view.record.version == 1, view.problems
    after = quickpush._open_memory(c.repo.shared_dir(), c.store.name)
    d = fleet.agent("c")
    view = d.snapshot(use_cache=False, paths=["svc/x"], listing=d.listing((text, after))).find(got.lease_id)
    assert not view.valid and any("replay" in p or "older" in p for p in view.problems), view.problems


def test_without_a_trust_file_to_read_head_is_not_asked_for(tmp_path, remote_file, monkeypatch):
    fleet = Fleet(tmp_path, remote_file.url)
    fleet.agent("a").acquire(["svc"], ttl=60)
    trace = tmp_path / "trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    c = fleet.agent("c", allowed_signers=str(tmp_path / "no-such-file"))
    c.status()
    lines = [ln for ln in trace.read_text().splitlines() if "built-in: git ls-remote" in ln]
    assert len(lines) == 1 and "HEAD" not in lines[0].split("ls-remote", 1)[1]


# ---------------------------------------------------------------------------------- verified cache


@pytest.fixture
def new_process(monkeypatch):
    """A fresh memo, as a new process starts with: only the verified cache on disk is shared."""

    def fresh():
        memo = trust.ChainMemo(persist=True)
        monkeypatch.setattr(trust, "MEMO", memo)
        return memo

    return fresh


@pytest.fixture
def verify_calls(monkeypatch):
    calls = []
    real = sshsig.verify
    monkeypatch.setattr(sshsig, "verify", lambda *args: calls.append(1) or real(*args))
    return calls


def _signed_lease(signed, renewals=3):
    a = signed.agent("a")
    got = a.acquire(["svc"], ttl=600)
    oids = [got.oid]
    for _ in range(renewals):
        signed.clock.advance(10)
        oids.append(a.renew(got.lease_id).oid)
    return a, got.lease_id, oids


def _cache_file(svc) -> str:
    return os.path.join(svc.repo.shared_dir(), "cache", "verified.sqlite3")


def test_a_new_process_verifies_only_versions_no_process_has_seen(signed, new_process, verify_calls):
    a, lease_id, oids = _signed_lease(signed)
    new_process()
    assert _current(signed.agent("c"), lease_id).valid and len(verify_calls) == 4
    new_process()
    view = _current(signed.agent("c"), lease_id)
    assert view.valid and view.verification == "verified" and len(verify_calls) == 4  # all from the cache
    signed.clock.advance(10)
    a.renew(lease_id)
    new_process()
    assert _current(signed.agent("c"), lease_id).valid and len(verify_calls) == 5  # only the new version
    new_process()
    _, history, _ = signed.agent("c").show(lease_id)
    assert [h.record.version for h in history] == [5, 4, 3, 2, 1] and len(verify_calls) == 5


def test_a_forged_version_under_a_cached_trust_file_is_rejected(signed, new_process):
    a, lease_id, oids = _signed_lease(signed)
    new_process()
    assert _current(signed.agent("c"), lease_id).valid  # every version cached
    b = signed.agent("b")
    v4 = b.status().find(lease_id).record
    forged = _forge(b, lease_id, oids[-1], v4.next_version(signed.clock.now(), ttl=3600))  # b's key, a's lease
    assert b.store.apply([RefUpdate(id_ref(lease_id), forged, oids[-1])]).ok
    for _ in range(2):  # and it is never cached as verified
        new_process()
        view = _current(signed.agent("c"), lease_id)
        assert not view.valid and any("not by the owner key" in p for p in view.problems), view.problems


def test_a_changed_trust_file_is_a_new_key_space(signed, new_process, verify_calls):
    a, lease_id, oids = _signed_lease(signed, renewals=1)
    new_process()
    assert _current(signed.agent("c"), lease_id).valid
    signed.publish_trust(f'c namespaces="gitlease" {signed.keys["c"].public_key()}\n')  # a is no longer trusted
    new_process()
    view = _current(signed.agent("c"), lease_id)
    assert not view.valid and any("not trusted" in p for p in view.problems), view.problems


def test_a_rolled_back_id_ref_is_refused_with_every_version_cached(signed, new_process):
    a, lease_id, oids = _signed_lease(signed)
    c = signed.agent("c")
    new_process()
    assert _current(c, lease_id).valid  # v4 seen, v1..v4 cached
    assert a.store.apply([RefUpdate(id_ref(lease_id), oids[1], oids[-1])]).ok  # back to v2 (validly signed)
    new_process()
    view = _current(signed.agent("c"), lease_id)
    assert not view.valid and any("replay" in p for p in view.problems), view.problems


@pytest.mark.parametrize("damage", [b"not a database at all", b"SQLite format 3\x00" + b"\xff" * 200, b""])
def test_a_damaged_cache_file_is_ignored(signed, new_process, damage):
    a, lease_id, oids = _signed_lease(signed, renewals=1)
    c = signed.agent("c")
    path = _cache_file(c)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(damage)
    new_process()
    assert _current(c, lease_id).valid
    new_process()
    assert _current(signed.agent("c"), lease_id).valid


def test_the_cache_is_bounded(signed, new_process, monkeypatch):
    monkeypatch.setattr(trust.VerifiedCache, "LIMIT", 3)
    a, lease_id, oids = _signed_lease(signed, renewals=4)  # 5 versions of one lease: over the limit
    other = a.acquire(["web"], ttl=600).lease_id
    new_process()
    assert _current(signed.agent("c"), lease_id).valid
    import sqlite3

    db = sqlite3.connect(_cache_file(signed.agent("c")))
    leases = [r[0] for r in db.execute("SELECT DISTINCT lease FROM v")]
    db.close()
    assert len(leases) <= 1  # whole leases dropped, oldest first
    new_process()
    snap = signed.agent("c").status()
    assert snap.find(lease_id).valid and snap.find(other).valid  # a partial cache still reads right


# ---------------------------------------------------------------------------------- replay memory


def test_replay_memory_is_written_only_when_it_changes(tmp_path, remote_file):
    fleet = Fleet(tmp_path, remote_file.url)
    a, c = fleet.agent("a"), fleet.agent("c")
    got = a.acquire(["svc"], ttl=60)
    c.status()
    seen = replay.Seen(c.repo.shared_dir(), c.store.name)
    first = os.stat(seen.path).st_mtime_ns
    os.utime(seen.path, ns=(first - 10**9, first - 10**9))
    c.status()
    assert os.stat(seen.path).st_mtime_ns == first - 10**9  # nothing new: not rewritten
    assert seen.load() is replay.Seen(c.repo.shared_dir(), c.store.name).load()  # loaded once per process
    fleet.clock.advance(10)
    a.renew(got.lease_id)
    c.status()
    assert seen.load().get(got.lease_id)["v"] == 2  # a change is written (and read back)


# ---------------------------------------------------------------------------------- batched sweep


def _pushes(bare) -> int:
    """Committed transactions on the server that wrote an audit entry: one per reclaiming push."""
    return sum(any(ref.startswith("refs/leases-audit/") for _o, _n, ref in t.updates) for t in serverlog.read(bare))


def test_a_sweep_reclaims_many_leases_in_few_pushes(tmp_path, remote_file):
    serverlog.install(remote_file.path)
    fleet = Fleet(tmp_path, remote_file.url)
    a, sw = fleet.agent("a"), fleet.agent("sweeper")
    held = a.acquire(["race/x"], ttl=3600, renew_every=60, stop_after=120)  # its holder renews during the sweep
    stale = {plant(a, [f"s/{i}", f"t/{i}"], ttl=60) for i in range(23)}
    fleet.clock.advance(100)
    live = plant(a, ["live"], ttl=3600)
    sw.clock = FakeClock(fleet.clock.now() + 100)
    before = _pushes(remote_file.path)
    renewed = []

    def holder_renews(view, verdict):
        if view.lease_id == held.lease_id:
            renewed.append(a.renew(held.lease_id))

    sweeper = Sweeper(sw, before_reclaim=holder_renews, batch=10)
    got = sweeper.sweep()
    assert outcomes(got) == {**{lid: "reclaimed" for lid in stale}, held.lease_id: "renewed"}
    refs = sw.store.list_refs()
    assert {r for r in refs if r.startswith("refs/leases/id/")} == {id_ref(held.lease_id), id_ref(live)}
    assert refs[id_ref(held.lease_id)] == renewed[0].oid
    log = read_log(sw.store)
    assert sorted(e.doc["leaseId"] for e in log) == sorted(stale)  # one entry per cleared lease, no other
    assert all(e.problem is None for e in log)
    n = len(stale) + 1
    pushes = _pushes(remote_file.path) - before
    assert pushes == len(stale) // 10 + 1 <= got.pushes <= math.ceil(n / 10) + 1  # the lost CAS: one retry


def test_one_lost_cas_never_fails_the_others_local(tmp_path):
    fleet = Fleet(tmp_path, None)
    a, sw = fleet.agent("a"), fleet.agent("sweeper")
    stale = [plant(a, [f"s/{i}"], ttl=60) for i in range(6)]
    fleet.clock.advance(100)
    gone = stale[2]

    def someone_else_clears(view, verdict):
        if view.lease_id == gone:
            assert a.reclaim(view, action="clear", rule="expired", reason="expired").ok

    got = Sweeper(sw, before_reclaim=someone_else_clears, batch=100).sweep()
    assert outcomes(got) == {**{lid: "reclaimed" for lid in stale if lid != gone}, gone: "gone"}
    assert got.pushes == 2 and sw.store.list_refs() == {}
    mine = [e.doc["leaseId"] for e in read_log(sw.store) if e.doc["by"] == "sweeper"]
    assert sorted(mine) == sorted(lid for lid in stale if lid != gone)


# ------------------------------------------------------------------ the record cache (service/recordcache.py)


class _Reads:
    """The commits whose record bytes a read takes from git (``Store.read``, called through: a spy, not a mock)."""

    def __init__(self, monkeypatch) -> None:
        from gitlease.core.store import Store

        self.oids: list[str] = []
        real = Store.read

        def read(store, oids, **kw):
            oids = set(oids)
            self.oids.extend(sorted(oids))
            return real(store, oids, **kw)

        monkeypatch.setattr(Store, "read", read)

    def take(self) -> int:
        n, self.oids = len(self.oids), []
        return n


# The record-cache tests below read with ``reuse=False``: a full read otherwise takes each lease whose refs have
# not moved from its finished view (service/viewcache.py, tested further down) and reads no record at all.


def _records_file(svc) -> str:
    from gitlease.service.recordcache import RecordCache

    return RecordCache(svc.repo.shared_dir()).path


def _summary(snap):
    return [(v.lease_id, v.paths, v.valid, v.record, v.current_oid, v.grant_oid, v.verification) for v in snap.leases]


@pytest.mark.parametrize("signed_store", [False, True])
def test_a_second_read_takes_each_record_from_the_record_cache(tmp_path, remote_file, monkeypatch, signed_store):
    fleet = Signed(tmp_path, remote_file.url) if signed_store else Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    one, two = a.acquire(["svc"], ttl=60), a.acquire(["docs"], ttl=60)
    a.renew(one.lease_id)
    reads = _Reads(monkeypatch)
    c = fleet.agent("c")
    first = c.status()
    assert reads.take() == 3  # the listed commits: each lease's current version, and the grant of the renewed one
    again = fleet.agent("c").status()  # a new service on the same clone: another process's read
    assert reads.take() == 0
    assert _summary(again) == _summary(first)
    assert again.find(one.lease_id).record.version == 2 and again.find(two.lease_id).valid
    a.renew(two.lease_id)  # a new version is a new commit: read from git, the others still from the cache
    third = fleet.agent("c").status()
    assert reads.take() == 1
    assert third.find(two.lease_id).record.version == 2 and third.find(two.lease_id).valid


def test_a_damaged_record_cache_is_removed_and_reads_go_on(tmp_path, remote_file):
    fleet = Fleet(tmp_path, remote_file.url)
    got = fleet.agent("a").acquire(["svc"], ttl=60)
    c = fleet.agent("c")
    first = c.status()
    path = _records_file(c)
    with open(path, "r+b") as fh:  # not a database any more
        fh.write(b"garbage" * 200)
    snap = fleet.agent("c").snapshot(reuse=False)
    assert _summary(snap) == _summary(first) and snap.find(got.lease_id).valid


def test_a_cache_row_that_does_not_decode_is_read_from_git_again(tmp_path, remote_file, monkeypatch):
    import sqlite3

    fleet = Fleet(tmp_path, remote_file.url)
    got = fleet.agent("a").acquire(["svc"], ttl=60)
    c = fleet.agent("c")
    first = c.status()
    path = _records_file(c)
    with sqlite3.connect(path) as db:
        (n,) = db.execute("SELECT count(*) FROM r").fetchone()
        db.execute("UPDATE r SET data = ?", (b"\x00not marshal",))
    assert n == 1
    reads = _Reads(monkeypatch)
    snap = fleet.agent("c").snapshot(reuse=False)
    assert reads.take() == 1 and _summary(snap) == _summary(first) and snap.find(got.lease_id).valid
    fleet.agent("c").snapshot(reuse=False)
    assert reads.take() == 0  # the row was written again


def test_a_record_cache_of_another_format_is_emptied(tmp_path, remote_file, monkeypatch):
    import sqlite3

    from gitlease.service import recordcache

    fleet = Fleet(tmp_path, remote_file.url)
    fleet.agent("a").acquire(["svc"], ttl=60)
    c = fleet.agent("c")
    c.status()
    monkeypatch.setattr(recordcache, "FORMAT", recordcache.FORMAT + 1)
    reads = _Reads(monkeypatch)
    fleet.agent("c").snapshot(reuse=False)
    assert reads.take() == 1  # the old rows were not used
    with sqlite3.connect(_records_file(c)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (recordcache.FORMAT,)
        assert db.execute("SELECT count(*) FROM r").fetchone() == (1,)


def test_the_record_cache_drops_commits_no_longer_listed_once_it_is_too_large(tmp_path, remote_file, monkeypatch):
    import sqlite3

    from gitlease.service import recordcache

    monkeypatch.setattr(recordcache, "FLOOR", 0)
    monkeypatch.setattr(recordcache, "SLACK", 1)
    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    keep = a.acquire(["keep"], ttl=60)
    gone = [a.acquire([f"t{k}"], ttl=60) for k in range(3)]
    c = fleet.agent("c")
    c.status()
    with sqlite3.connect(_records_file(c)) as db:
        assert db.execute("SELECT count(*) FROM r").fetchone() == (4,)
    for g in gone:
        a.release(g.lease_id)
    a.renew(keep.lease_id)  # one new commit: 5 rows, 2 listed (its grant and this version)
    snap = fleet.agent("c").snapshot(reuse=False)
    assert [v.lease_id for v in snap.leases] == [keep.lease_id] and snap.leases[0].record.version == 2
    with sqlite3.connect(_records_file(c)) as db:
        kept = {r for (r,) in db.execute("SELECT oid FROM r")}
    assert kept == {snap.leases[0].current_oid, snap.leases[0].grant_oid}  # the listed commits only


def test_the_record_cache_never_keeps_a_commit_it_could_not_read(tmp_path, remote_file):
    """A missing record may mean "not fetched yet" (a ref deleted between listing and fetching): such a commit is
    asked of git again on the next read, never remembered as holding no record; a record that was read but does
    not parse is kept (parsing the same bytes answers the same)."""
    from gitlease.core.store import Blob
    from gitlease.service.recordcache import RecordCache
    from gitlease.service.views import parse_blob

    kept = RecordCache(str(tmp_path))
    missing, bad = "1" * 40, "2" * 40
    unread = Blob(None, None, "not a lease commit (no lease.json)")
    broken = Blob(b"{not json", None)
    kept.save({missing: (unread, parse_blob(unread)), bad: (broken, parse_blob(broken))}, [missing, bad])
    assert kept.index() == {bad: None}
    got = kept.load([missing, bad])
    assert set(got) == {bad} and got[bad][1][0] is None and "not JSON" in got[bad][1][1]
    kept.close()
