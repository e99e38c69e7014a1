"""The audit log: where it lives (outside refs/leases/, invisible to lease readers), what an entry holds, that a
reclaim never lands without its record (nor its record without the reclaim), signatures stored beside the
entry, and that 100 reclaims by 4 concurrent sweepers leave exactly 100 entries."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest
from conftest import cli, git, in_threads
from helpers import Fleet
from test_sweep import plant, sfleet  # noqa: F401  (the fixture is shared)

from gitlease.core import record as records
from gitlease.core.record import Owner
from gitlease.core.refnames import id_ref, scope_ref
from gitlease.core.store import RefUpdate
from gitlease.identity.signer import Signer
from gitlease.ops.sweep import Sweeper, history
from gitlease.service.audit import AUDIT_PREFIX, ENTRY_FILE, ENTRY_SIG, list_audit_refs, read_log


def _show(svc, name):
    return git(svc.repo.cwd, "cat-file", "-p", name)


def _parents(svc, oid):
    return git(svc.repo.cwd, "log", "-1", "--format=%P", oid).split()


def test_audit_refs_live_outside_the_lease_namespace(sfleet):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    lease = a.acquire(["x"], ttl=60)
    sfleet.clock.advance(100)
    assert Sweeper(sw).sweep().results[0].outcome == "reclaimed"
    assert set(list_audit_refs(sw.store)) == {AUDIT_PREFIX + "sweeper"}
    assert sw.store.list_refs() == {}  # lease readers never see the audit refs ...
    assert sw.snapshot(use_cache=False).leases == []
    assert sw.acquire(["."]).lease_id  # ... and nothing blocks the whole repository
    # Why not refs/leases/audit/...: a ref there is not gitlease's (readers report it as a store fault, the
    # server hook refuses it); it blocks nothing, since git refuses no lease because of it (issue 16, item 6).
    w = sw.objects
    junk = w.commit(w.tree({ENTRY_FILE: w.blob(b"{}")}), (), "A <a@x>", 1_800_000_000, "x")
    sw.store.apply([RefUpdate("refs/leases/audit/sweeper", junk, None)])
    snap = sw.snapshot(use_cache=False)
    assert all(v.valid for v in snap.leases) and snap.foreign == ["refs/leases/audit/sweeper"]
    assert lease.lease_id


def test_entry_records_who_which_version_why_when_and_keeps_the_history(sfleet):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    first = a.acquire(["h/one"], ttl=60)
    sfleet.clock.advance(30)
    v2 = a.renew(first.lease_id)
    released = a.acquire(["h/released"], ttl=60)
    a.release(released.lease_id)
    second = a.acquire(["h/two"], ttl=60)
    sfleet.clock.advance(200)
    got = Sweeper(sw).sweep()
    assert [r.outcome for r in got.results] == ["reclaimed", "reclaimed"]
    entries = read_log(sw.store)
    assert [(e.doc["action"], e.doc["leaseId"], e.doc["by"]) for e in entries if e.doc["action"] == "release"] == [
        ("release", released.lease_id, "a")
    ]  # a release is recorded too, by its holder
    reclaims = [e for e in entries if e.doc["action"] == "reclaim"]
    e1, e2 = sorted(reclaims, key=lambda e: e.doc["leaseId"] != first.lease_id)
    assert e1.doc["leaseId"] == first.lease_id and e2.doc["leaseId"] == second.lease_id
    d = e1.doc
    assert d["schema"] == "gitlease.audit/1" and d["action"] == "reclaim" and d["rule"] == "expired"
    assert d["reason"] == "expired=140s" and d["by"] == "sweeper" and d["writer"] == "sweeper"
    assert d["version"] == 2 and d["oid"] == v2.oid and d["grant"] == first.oid
    assert d["refs"] == {id_ref(first.lease_id): v2.oid, scope_ref("h/one"): first.oid}
    assert d["owner"]["taskId"] == "task-a" and d["paths"] == ["h/one"]
    assert d["signing"] == "unsigned" and d["key"] is None and not e1.signed
    older, newer = sorted((e1, e2), key=lambda e: e.doc["seq"])
    assert (older.doc["seq"], older.doc["prev"]) == (1, None)
    assert (newer.doc["seq"], newer.doc["prev"]) == (2, older.oid)
    # entry commits: first parent the writer's previous entry, second the lease version reclaimed
    assert _parents(sw, older.oid) == [older.doc["oid"]] and _parents(sw, newer.oid) == [older.oid, newer.doc["oid"]]
    assert e1.pointer == v2.oid and e2.pointer == second.oid
    assert ENTRY_SIG not in _show(sw, e1.oid + "^{tree}")
    events = [(ev.event, ev.lease_id, ev.version) for ev in history(sw)]
    assert (
        ("acquire", first.lease_id, 1) in events
        and ("renew", first.lease_id, 2) in events
        and ("reclaim", first.lease_id, 2) in events
    )
    # a release by its holder is in the log too, with the history it kept reachable: who held h/released when
    assert [ev for ev in events if ev[1] == released.lease_id] == [
        ("acquire", released.lease_id, 1),
        ("release", released.lease_id, 1),
    ]
    only = history(sw, lease_id=second.lease_id)
    assert [ev.event for ev in only] == ["acquire", "reclaim"]


def test_signed_entry_stores_its_signature_beside_it(tmp_path, remote_file):
    from test_identity import Signed

    from gitlease.identity import sshsig

    fleet = Signed(tmp_path, remote_file.url)
    a, sw = fleet.agent("a"), fleet.agent("b")
    a.acquire(["s/x"], ttl=60)
    fleet.clock.advance(100)
    assert Sweeper(sw).sweep().results[0].outcome == "reclaimed"
    (entry,) = read_log(sw.store)
    assert entry.signed and entry.doc["signing"] == "sshsig" and entry.doc["key"] == sw.signer.public_key
    data = _show(sw, f"{entry.oid}:{ENTRY_FILE}").encode()
    sig = _show(sw, f"{entry.oid}:{ENTRY_SIG}").encode()
    assert sshsig.verify(sig, data, "gitlease") == sw.signer.public_key  # a real SSHSIG over the exact bytes
    assert records.canonical(entry.doc) == data


def test_acquire_that_clears_an_expired_blocker_is_audited(sfleet):
    a, b = sfleet.agent("a"), sfleet.agent("b")
    old = a.acquire(["c/svc"], ttl=60)
    sfleet.clock.advance(100)
    got = b.acquire(["c/svc/deeper"])
    assert got.cleared == (old.lease_id,)
    (entry,) = read_log(b.store)
    assert entry.doc["action"] == "clear" and entry.doc["by"] == "b" and entry.doc["leaseId"] == old.lease_id
    assert entry.doc["reason"] == "expired=40s"


def test_no_reclaim_without_its_record(tmp_path, remote_file):
    """The store refuses the audit ref: the whole atomic push fails, the lease stays, the sweep says so."""
    hook = remote_file.path / "hooks" / "pre-receive"
    hook.write_text(
        '#!/bin/sh\nwhile read old new ref; do case "$ref" in refs/leases-audit/*) '
        "echo 'no audit here' >&2; exit 1;; esac; done\nexit 0\n"
    )
    hook.chmod(0o755)
    fleet = Fleet(tmp_path, remote_file.url)
    a, sw = fleet.agent("a"), fleet.agent("sweeper")
    lease = a.acquire(["n/x"], ttl=60)
    fleet.clock.advance(100)
    before = sw.store.list_refs()
    got = Sweeper(sw).sweep()
    assert [r.outcome for r in got.results] == ["failed"] and got.results[0].line().startswith("failed: ")
    assert sw.store.list_refs() == before and list_audit_refs(sw.store) == {}
    assert lease.lease_id in {v.lease_id for v in sw.snapshot(use_cache=False).leases}


def test_reclaim_whose_push_times_out_after_landing_is_resolved_by_reading(tmp_path, remote_file):
    fleet = Fleet(tmp_path, remote_file.url)
    lease = plant(fleet.agent("a"), ["amb/x"], ttl=60)
    fleet.clock.advance(100)
    hook = remote_file.path / "hooks" / "post-receive"
    hook.write_text("#!/bin/sh\ncat >/dev/null\nexec sleep 60\n")  # the server hangs after landing
    hook.chmod(0o755)
    sw = fleet.agent("sweeper", timeout=3)
    got = Sweeper(sw).sweep()
    os.unlink(hook)
    assert [(r.lease_id, r.outcome) for r in got.results] == [(lease, "reclaimed")]
    assert sw.store.list_refs() == {} and [e.doc["leaseId"] for e in read_log(sw.store)] == [lease]


def plant_many(svc, n, *, ttl=60):
    """n leases on disjoint scopes, written in one atomic push (fast)."""
    now = svc.clock.now()
    ups, ids = [], []
    for i in range(n):
        owner = Owner(task_id=f"job_{i}", agent_id="holder", host="h", pid=0)
        rec = records.new_record(
            lease_id=records.new_lease_id(now),
            repo="r",
            paths=(f"many/{i:04d}",),
            workspace_id="w",
            owner=owner,
            now=now,
            ttl=ttl,
        )
        oid = svc._write_version(rec, None, "acquire")
        ups += [RefUpdate(id_ref(rec.lease_id), oid, None), RefUpdate(scope_ref(rec.paths[0]), oid, None)]
        ids.append(rec.lease_id)
    assert svc.store.apply(ups).ok
    return ids


def _concurrent_sweeps(fleet, names):
    sweepers = [Sweeper(fleet.agent(n)) for n in names]
    barrier = threading.Barrier(len(sweepers), timeout=60)

    def go(s):
        barrier.wait()
        return s.sweep()

    return in_threads(go, sweepers, timeout=300)


def _assert_each_once(svc, ids, results):
    won = [r.lease_id for s in results for r in s.results if r.outcome == "reclaimed"]
    assert sorted(won) == sorted(ids)
    assert {r.outcome for s in results for r in s.results} <= {"reclaimed", "gone"}
    entries = read_log(svc.store)
    assert len(entries) == len(ids) and sorted(e.doc["leaseId"] for e in entries) == sorted(ids)
    assert all(e.problem is None for e in entries), [e.problem for e in entries if e.problem]
    by_ref: dict[str, list[int]] = {}
    for e in entries:
        by_ref.setdefault(e.ref, []).append(e.doc["seq"])
    assert all(sorted(seqs) == list(range(1, len(seqs) + 1)) for seqs in by_ref.values())
    assert svc.store.list_refs() == {}


def _reclaims_by_concurrent_sweepers(fleet, leases, names):
    """``leases`` stale leases, swept by sweepers ``names`` at once: each reclaimed once, each with its entry."""
    a = fleet.agent("a")
    ids = plant_many(a, leases)
    fleet.clock.advance(100)
    _assert_each_once(a, ids, _concurrent_sweeps(fleet, names))


def test_100_reclaims_by_4_concurrent_sweepers(tmp_path):
    """The local store (refs shared by 4 worktrees, one update-ref transaction per reclaim): fast. The same
    over a file:// remote and, bigger, over git daemon are the slow variants below (a push costs ~50 ms)."""
    _reclaims_by_concurrent_sweepers(Fleet(tmp_path, None), 100, [f"sweeper{i}" for i in range(4)])


@pytest.mark.slow
def test_100_reclaims_by_4_concurrent_sweepers_over_file_remote(tmp_path, remote_file):
    _reclaims_by_concurrent_sweepers(Fleet(tmp_path, remote_file.url), 100, [f"sweeper{i}" for i in range(4)])


@pytest.mark.slow
def test_200_reclaims_by_6_concurrent_sweepers_two_sharing_a_writer(tmp_path, remote_daemon):
    names = ["s0", "s1", "s2", "s3", "shared", "shared"]
    _reclaims_by_concurrent_sweepers(Fleet(tmp_path, remote_daemon.url), 200, names)


class FakeSigner(Signer):
    """Signs without a key the service would know (public_key None keeps the store in unsigned mode): only the
    audit log's verify seam is under test here."""

    def sign(self, data: bytes) -> bytes:
        return b"SIG:" + hashlib.sha256(data).hexdigest().encode()


def test_read_log_verify_seam_flags_entries(sfleet):
    a, sw = sfleet.agent("a"), sfleet.agent("sweeper")
    sw.signer = FakeSigner()
    plant(a, ["v/x"], ttl=60)
    sfleet.clock.advance(100)
    Sweeper(sw).sweep()
    seen = []

    def verify(data, sig, doc):
        seen.append((data, sig))
        return None if sig == FakeSigner().sign(data) else "bad signature"

    (entry,) = read_log(sw.store, verify=verify)
    assert entry.problem is None and seen and seen[0][1] is not None
    (entry,) = read_log(sw.store, verify=lambda data, sig, doc: "key not trusted")
    assert entry.problem == "key not trusted"


def test_batched_sweeps_pass_the_server_hook_and_it_checks_every_entry(tmp_path, remote_file):
    """The sweep meets the server hook: a batch opening a writer's log (its first entry's only parent is the
    reclaimed version) and a batch continuing it both land; every entry of a chain is judged, so an inner entry
    whose lease this push does not delete is refused."""
    assert cli(remote_file.path, "install-hooks", "--server").returncode == 0
    fleet = Fleet(tmp_path, remote_file.url)
    a, sw = fleet.agent("a"), fleet.agent("sweeper")
    ids = [a.acquire([f"b/{i}"], ttl=60).lease_id for i in range(5)]
    fleet.clock.advance(100)
    got = Sweeper(sw, batch=3).sweep()
    assert [r.outcome for r in got.results] == ["reclaimed"] * 5, [r.detail for r in got.results]
    assert got.pushes == 2
    entries = read_log(sw.store)
    assert sorted(e.doc["leaseId"] for e in entries) == sorted(ids)
    assert sorted(e.doc["seq"] for e in entries) == [1, 2, 3, 4, 5] and all(e.problem is None for e in entries)
    assert sw.store.list_refs() == {}

    # a forged chain: two entries, but the push deletes only the second one's lease
    keep, gone = (a.acquire([f"c/{i}"], ttl=60) for i in range(2))
    fleet.clock.advance(100)
    refs = sw.store.list_refs()
    log = sw.audit
    head, seq = log.read_head()
    views = {v.lease_id: v for v in sw.snapshot(use_cache=False).leases}
    first, _ = log._entry_commit(
        {"action": "reclaim", "leaseId": keep.lease_id, "refs": views[keep.lease_id].refs(), "reason": "x"},
        head,
        seq + 1,
        None,
    )
    second, _ = log._entry_commit(
        {"action": "reclaim", "leaseId": gone.lease_id, "refs": views[gone.lease_id].refs(), "reason": "x"},
        first,
        seq + 2,
        None,
    )
    deletes = [RefUpdate(r, None, o) for r, o in views[gone.lease_id].refs().items()]
    out = sw.store.apply([*deletes, RefUpdate(log.ref, second, head)])
    assert not out.ok and "are not deleted by this push" in out.message, out.message
    assert sw.store.list_refs() == refs
