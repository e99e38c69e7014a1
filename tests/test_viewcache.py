"""Each lease's finished view kept between reads (service/viewcache.py): a read takes a lease whose refs have
not moved from the view an earlier read finished, and answers exactly as a read that checks everything again
(``snapshot(reuse=False)``), faults included. Real git stores; the fake clock only."""

from __future__ import annotations

import json
import sqlite3

import pytest
from helpers import Fleet
from test_identity import Signed

from gitlease.cli.core import leases_json
from gitlease.core import jsontext
from gitlease.core.refnames import id_ref, scope_ref
from gitlease.core.store import RefUpdate
from gitlease.identity import trust
from gitlease.service import viewcache
from gitlease.service.views import KeptView


@pytest.fixture
def checks(monkeypatch):
    """The lease histories checked (trust.Trust.check_chain calls), by lease id."""
    seen: list[str] = []
    real = trust.Trust.check_chain

    def counted(self, lease_id, *args, **kw):
        seen.append(lease_id)
        return real(self, lease_id, *args, **kw)

    monkeypatch.setattr(trust.Trust, "check_chain", counted)
    return seen


def _fleet(tmp_path, url, signed_store):
    return Signed(tmp_path, url) if signed_store else Fleet(tmp_path, url)


def _answer(svc, snap) -> list[dict]:
    """What ``git lease status --json`` prints of each lease (the CLI's own writer), parsed."""
    now, skew = svc.clock.now(), svc.settings.skew
    held = {v.lease_id for v in snap.leases if v.lease_id.endswith("0")}
    return json.loads(jsontext.dumps({"leases": leases_json(snap.leases, now, skew, held)}))["leases"]


def _same(svc, snap, full):
    assert _answer(svc, snap) == _answer(svc, full)
    assert [(v.lease_id, v.valid, v.problems, v.paths, v.granted(), v.refs()) for v in snap.leases] == [
        (v.lease_id, v.valid, v.problems, v.paths, v.granted(), v.refs()) for v in full.leases
    ]
    assert snap.overlaps(svc.clock.now(), svc.settings.skew) == full.overlaps(svc.clock.now(), svc.settings.skew)


@pytest.mark.parametrize("signed_store", [False, True])
def test_a_second_read_takes_every_unmoved_lease_and_answers_the_same(tmp_path, remote_file, signed_store, checks):
    fleet = _fleet(tmp_path, remote_file.url, signed_store)
    a = fleet.agent("a")
    one = a.acquire(["svc", "docs/api"], ttl=600)
    two = a.acquire(["lib"], ttl=600)
    fleet.clock.advance(10)
    a.renew(one.lease_id, progress="half")
    c = fleet.agent("c")
    c.status()
    assert sorted(checks) == sorted([one.lease_id, two.lease_id])
    checks.clear()
    again = fleet.agent("c")  # another process on the same clone
    snap = again.status()
    assert checks == [] and all(isinstance(v, KeptView) for v in snap.leases)
    assert snap.find(one.lease_id).record.version == 2 and snap.find(one.lease_id).record.progress.note == "half"
    fleet.clock.advance(700)  # the state and seconds left follow the clock, not the kept template
    _same(again, again.status(), fleet.agent("c").snapshot(reuse=False))
    assert {d["state"] for d in _answer(again, again.status())} == {"expired"}


def test_only_the_lease_that_moved_is_checked_again(tmp_path, remote_file, checks):
    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    one, two, three = (a.acquire([p], ttl=600) for p in ("x", "y", "z"))
    fleet.agent("c").status()
    checks.clear()
    fleet.clock.advance(10)
    a.renew(two.lease_id)
    a.extend(three.lease_id, ["w"])  # a new version and a new scope ref
    c = fleet.agent("c")
    snap = c.status()
    assert sorted(checks) == sorted([two.lease_id, three.lease_id])
    assert isinstance(snap.find(one.lease_id), KeptView) and snap.find(three.lease_id).paths == ("w", "z")
    _same(c, snap, fleet.agent("c").snapshot(reuse=False))
    a.release(one.lease_id)
    checks.clear()
    snap = fleet.agent("c").status()
    assert checks == [] and [v.lease_id for v in snap.leases] == sorted([two.lease_id, three.lease_id])
    with sqlite3.connect(viewcache.ViewCache(c.repo.shared_dir(), c.store.name).path) as db:
        assert {k for (k,) in db.execute("SELECT lease FROM v")} == {two.lease_id, three.lease_id}  # one dropped


def test_another_ref_at_a_kept_commit_is_read_again(tmp_path, remote_file, checks):
    """A scope ref the lease's record does not name, added at its grant: that lease's kept view is not taken
    (the others are), and the lease is invalid, as a full read finds it."""
    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    got = a.acquire(["svc"], ttl=600)
    other = a.acquire(["lib"], ttl=600)
    c = fleet.agent("c")
    assert c.status().find(got.lease_id).valid
    assert a.store.apply([RefUpdate(scope_ref("more"), got.oid, None)]).ok
    checks.clear()
    c = fleet.agent("c")
    snap = c.status()
    assert checks == [got.lease_id] and isinstance(snap.find(other.lease_id), KeptView)
    view = snap.find(got.lease_id)
    assert not isinstance(view, KeptView) and not view.valid and "more" in view.paths
    _same(c, snap, fleet.agent("c").snapshot(reuse=False))


def test_another_commit_naming_a_kept_lease_makes_the_read_check_everything(tmp_path, remote_file):
    """A scope ref at a later version of a kept lease (a forged second grant): the lease's own refs have not
    moved, but a ref the read checks names it; the read is done again without kept views."""
    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    got = a.acquire(["svc"], ttl=600)
    fleet.clock.advance(10)
    v2 = a.renew(got.lease_id).oid
    assert fleet.agent("c").status().find(got.lease_id).valid
    fleet.clock.advance(10)
    v3 = a.renew(got.lease_id).oid
    fleet.agent("c").status()  # kept at v3
    assert a.store.apply([RefUpdate(scope_ref("svc2"), v2, None)]).ok
    c = fleet.agent("c")
    snap = c.status()
    view = snap.find(got.lease_id)
    assert not view.valid and view.current_oid == v3, view.problems
    assert not any(isinstance(v, KeptView) for v in snap.leases)
    _same(c, snap, fleet.agent("c").snapshot(reuse=False))


def test_a_kept_view_of_an_older_version_is_still_judged_by_the_replay_memory(tmp_path, remote_file):
    """The row was finished at v2; the clone has since seen v3 (a read that kept nothing); the id ref moved
    back to v2 matches the row, and the replay memory refuses it."""
    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    got = a.acquire(["svc"], ttl=600)
    fleet.clock.advance(10)
    v2 = a.renew(got.lease_id).oid
    assert fleet.agent("c").status().find(got.lease_id).valid  # kept at v2
    fleet.clock.advance(10)
    v3 = a.renew(got.lease_id).oid
    assert fleet.agent("c").snapshot(reuse=False).find(got.lease_id).record.version == 3  # seen, not kept
    assert a.store.apply([RefUpdate(id_ref(got.lease_id), v2, v3)]).ok
    c = fleet.agent("c")
    snap = c.status()
    view = snap.find(got.lease_id)
    assert isinstance(view, KeptView) and not view.valid and any("replay" in p for p in view.problems)
    assert _answer(c, snap)[0]["problems"] == view.problems and _answer(c, snap)[0]["valid"] is False


def test_a_changed_trust_file_takes_no_kept_view(tmp_path, remote_file, checks):
    signed = Signed(tmp_path, remote_file.url)
    got = signed.agent("a").acquire(["svc"], ttl=600)
    assert signed.agent("c").status().find(got.lease_id).valid
    signed.publish_trust(f'c namespaces="gitlease" {signed.keys["c"].public_key()}\n')  # a is no longer trusted
    checks.clear()
    view = signed.agent("c").status().find(got.lease_id)
    assert checks == [got.lease_id] and not view.valid and any("not trusted" in p for p in view.problems)


@pytest.mark.parametrize("damage", ["file", "row", "record"])
def test_a_damaged_view_cache_is_never_trusted(tmp_path, remote_file, damage):
    fleet = Fleet(tmp_path, remote_file.url)
    got = fleet.agent("a").acquire(["svc"], ttl=600)
    c = fleet.agent("c")
    c.status()
    path = viewcache.ViewCache(c.repo.shared_dir(), c.store.name).path
    if damage == "file":
        with open(path, "r+b") as fh:
            fh.write(b"garbage" * 200)
    else:
        with sqlite3.connect(path) as db:
            if damage == "row":
                db.execute("UPDATE v SET data = ?", (b"\x00not marshal",))
            else:  # decodes, but its record does not: the view turns invalid (it still blocks its paths)
                import marshal

                (data,) = db.execute("SELECT data FROM v").fetchone()
                t = list(marshal.loads(data))
                t[5] = marshal.dumps(("short",))  # the record's fields
                db.execute("UPDATE v SET data = ?", (marshal.dumps(tuple(t)),))
    c = fleet.agent("c")
    view = c.status().find(got.lease_id)
    if damage == "record":
        assert view.record is None and not view.valid and view.paths == ("svc",)
        assert c.status().blocking(["svc"], c.clock.now(), c.settings.skew)
    else:
        assert view.valid and view.record.paths == ("svc",)
        _same(c, c.status(), fleet.agent("c").snapshot(reuse=False))


def test_show_checks_every_version_again(tmp_path, remote_file):
    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    got = a.acquire(["svc"], ttl=600)
    fleet.clock.advance(10)
    a.renew(got.lease_id)
    fleet.agent("c").status()
    view, history, _ = fleet.agent("c").show(got.lease_id)
    assert view.valid and [h.record.version for h in history] == [2, 1]
    assert all(h.verification == "unsigned" for h in history)


def test_status_json_from_kept_views_is_the_same_text(make_repo, tmp_path):
    """The real executable: ``status --json`` written from kept templates parses to the same document as the
    first read's (which wrote every lease from ``to_json``), the clock's fields aside."""
    from conftest import cli, git

    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    a, b = make_repo("a"), make_repo("b")
    for r in (a, b):
        git(r, "config", "lease.remote", bare.as_uri())
    assert cli(a, "acquire", "--scope", "svc", "--scope", "l\u00e9gal", "--task", "t1").returncode == 0
    assert cli(b, "acquire", "--scope", "docs").returncode == 0

    def doc():
        res = cli(b, "status", "--json")
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        out["result"]["fetchedAt"] = None
        for lease in out["result"]["leases"]:
            lease["secondsLeft"] = 0
        return out

    first, second = doc(), doc()
    assert first == second and [x["heldHere"] for x in second["result"]["leases"]].count(True) == 1


def test_the_collector_pause_leaves_it_as_it_found_it():
    """core/gcpause.py: on again after a pause that turned it off; still off after one inside a pause (or after a
    caller turned it off on purpose)."""
    import gc

    from gitlease.core.gcpause import paused

    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_json_text_puts_raw_pieces_in_and_writes_no_lone_surrogate():
    """core/jsontext.py: ``Raw`` text goes in as it is, in order; a string holding bytes that were not UTF-8
    (a surrogate escape) is written ``\\xNN`` (the whole document again), and the Raw pieces with it."""
    from gitlease.core.jsontext import Raw, dumps

    bad = b"caf\xe9".decode("utf-8", "surrogateescape")
    text = dumps({"b": [Raw('{"x": 1}'), Raw("[2, 3]")], "a": bad, "c": Raw('"\\u00e9"')})
    assert json.loads(text) == {"a": "caf\\xe9", "b": [{"x": 1}, [2, 3]], "c": "\u00e9"}
    assert "\\ud" not in text and text.index('"a"') < text.index('"b"') < text.index('"c"')  # keys sorted
