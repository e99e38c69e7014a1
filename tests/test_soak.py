"""The reliability harness, short: real worker processes, real faults, an independent checker (soak/)."""

import json

import pytest

from soak import checker, serverlog  # noqa: E402
from soak import run as soak_run  # noqa: E402


def _run(capsys, *argv):
    rc = soak_run.main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


# Timings for a short run on a loaded machine (at a load of 30 on 2 cores one git push can take seconds): a TTL
# whose renewals never come near the expiry, a push timeout of several seconds, and a checker tolerance (server
# time against record times) above that timeout. The run goes on until every remote kind has done what the
# asserts below need (--until), so no assert counts what the machine's speed decides.
LOADED = ["--ttl", "10", "--timeout", "4", "--tolerance", "8"]


def test_short_soak_with_faults_finds_no_anomaly(capsys):
    until = "acquired=3,renewed=1,fenced-push=1,faults=6"
    rc, res = _run(
        capsys,
        *("--duration", "8", "--workers", "6", "--kinds", "file,daemon,http", "--seed", "7"),
        *("--fault-every", "0.5", "--until", until, "--max-duration", "600", *LOADED),
    )
    assert res["anomalies"] == [], res["anomalies"]
    assert rc == 0
    assert res["until"]["reached"] is True, (res["ops"], res["faults"])  # what the checks below need was done
    assert res["signed"] is True
    checks = res["checks"].values()
    assert all(c["transactions"] > 0 for c in checks)
    assert sum(c["fenced_updates"] for c in checks) == sum(c["branch_updates"] for c in checks) > 0
    assert all(c["signatures"] > 0 and c["ssh_keygen_verified"] > 0 for c in checks)


def test_negative_control_with_cas_switched_off_fails_the_checker(capsys):
    rc, res = _run(
        capsys,
        *("--duration", "4", "--workers", "4", "--kinds", "file", "--no-faults", "--mode", "force", "--seed", "3"),
        *("--until", "acquired=12", "--max-duration", "300", *LOADED),
    )
    assert rc == 0  # in force mode, success means the checker found the hazard
    assert any("granted while" in a or "moved from" in a for a in res["anomalies"]), res["anomalies"]


# each negative control of fencing and signing, and the one kind of anomaly the checker must report for it
CONTROLS = {
    "unfenced": ("updated without a proper renewal of a live lease in the same transaction (unfenced)",),
    "outside": ("outside the scope of",),
    # (a renewal signed by an untrusted key is no fence: the branch update it carried is flagged as well)
    "untrusted": (
        "is not the trust file's key for",
        "a key the trust file does not list",
        "updated without a proper renewal of a live lease in the same transaction (unfenced)",
    ),
}


@pytest.mark.parametrize("mode", sorted(CONTROLS))
def test_negative_controls_of_fencing_and_signing_fail_the_checker(capsys, mode):
    extra = ["--unsigned"] if mode == "unfenced" else []  # (and the unsigned mode reports nothing else)
    until = {"unfenced": "unfenced-push=1", "outside": "fenced-push=1", "untrusted": "acquired=2"}[mode]
    rc, res = _run(
        capsys,
        *("--duration", "4", "--workers", "4", "--kinds", "file", "--no-faults", "--mode", mode, "--seed", "3"),
        *("--until", until, "--max-duration", "300", *LOADED, *extra),
    )
    assert rc == 0, res["anomalies"]  # in a control mode, success means the checker found the hazard
    assert res["anomalies"], res["ops"]
    strays = [a for a in res["anomalies"] if not any(want in a for want in CONTROLS[mode])]
    assert strays == [], strays  # the checker flags exactly that hazard, nothing spurious


@pytest.mark.slow
def test_longer_soak(capsys):
    rc, res = _run(capsys, "--duration", "120", "--workers", "16")
    assert rc == 0 and res["anomalies"] == []


def test_server_log_parse_orders_by_prepare_and_keeps_unlogged_outcomes_uncertain():
    z, a, b = "0" * 40, "a" * 40, "b" * 40
    text = (
        f"txn prepared 1 10.0\n{z} {a} refs/x\n.\n"
        f"txn prepared 2 11.0\n{z} {b} refs/y\n.\n"
        f"txn committed 2 11.1\n{z} {b} refs/y\n.\n"
        f"txn committed 1 11.2\n{z} {a} refs/x\n.\n"
        f"txn prepared 3 12.0\n{a} {z} refs/x\n.\n"
    )  # pid 3 died before it logged the outcome
    txns = serverlog.parse(text)
    assert [(t.pid, t.certain) for t in txns] == [(1, True), (2, True), (3, False)]
    assert [t.pid for t in serverlog.settle(txns, {"refs/y": b})] == [1, 2, 3]  # refs/x is gone: it landed
    assert [t.pid for t in serverlog.settle(txns, {"refs/x": a, "refs/y": b})] == [1, 2]
    with pytest.raises(serverlog.LogCorrupt):
        serverlog.parse("garbage\n")


def _store(tmp_path, *, logged: bool = False):
    """A real bare store (its transactions logged by the server's hook when ``logged``) and agent w0's service on
    it, from a repository of its own. Returns (the bare store, the service)."""
    import subprocess

    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo
    from gitlease.service.leases import LeaseService

    bare = tmp_path / "store.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    if logged:
        serverlog.install(bare)
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    repo = Repo.discover(str(work))
    return bare, LeaseService(repo, resolve(repo.config, env={}, remote=bare.as_uri(), agent="w0", ttl=60))


def _two_leases(tmp_path):
    """Real lease objects in a real bare store: a released lease on ``src`` and a held one on ``src/x``."""
    bare, svc = _store(tmp_path)
    a = svc.acquire(["src"])
    svc.release(a.lease_id)
    b = svc.acquire(["src/x"])
    return bare, a, b


def test_checker_half_landed_grant_is_not_a_lease_but_renewing_it_is_an_anomaly(tmp_path):
    from gitlease.core.refnames import id_ref, scope_ref

    bare, a, b = _two_leases(tmp_path)
    z, t0 = "0" * 40, a.record.expires - 60
    # the server died committing a's grant: only its id ref landed, its scope ref did not
    half = serverlog.Txn(
        0,
        t0,
        1,
        ((z, a.oid, id_ref(a.lease_id)),),
        partial=True,
        prepared=((z, a.oid, id_ref(a.lease_id)), (z, a.oid, scope_ref("src"))),
    )
    grant_b = serverlog.Txn(1, t0 + 1, 2, ((z, b.oid, id_ref(b.lease_id)), (z, b.oid, scope_ref("src/x"))))
    rep = checker.check(bare, [half, grant_b], tolerance=2, final_refs={})
    assert rep.anomalies == [] and rep.half_landed == 1 and rep.half_grants == 1 and rep.leases == 1
    # b overlapping a's scope ref, had that one landed, is an anomaly (git would have refused it)
    landed = serverlog.Txn(0, t0, 1, ((z, a.oid, scope_ref("src")),), partial=True, prepared=half.prepared)
    rep = checker.check(bare, [landed, grant_b], tolerance=2, final_refs={})
    assert any("still holds scope refs" in x for x in rep.anomalies), rep.anomalies
    # and a half-landed grant that someone renews (or fences a branch with) was used without being granted
    renew = serverlog.Txn(2, t0 + 2, 3, ((a.oid, b.oid, id_ref(a.lease_id)),))
    rep = checker.check(bare, [half, grant_b, renew], tolerance=2, final_refs={})
    assert any("never granted whole" in x for x in rep.anomalies), rep.anomalies
    # its writer, told nothing landed, deletes what did (LeaseService._undo_partial): no audit needed, as the
    # half grant was never anyone's; deleting a whole lease's refs unaudited and unreleased is still an anomaly
    undo = serverlog.Txn(2, t0 + 2, 3, ((a.oid, z, id_ref(a.lease_id)),))
    rep = checker.check(bare, [half, grant_b, undo], tolerance=2, final_refs={})
    assert rep.anomalies == [] and rep.half_grants == 1 and rep.half_grants_undone == 1, rep.anomalies
    drop = serverlog.Txn(2, t0 + 2, 3, ((b.oid, z, id_ref(b.lease_id)), (b.oid, z, scope_ref("src/x"))))
    rep = checker.check(bare, [half, grant_b, drop], tolerance=2, final_refs={})
    assert rep.anomalies and rep.half_grants_undone == 0, rep.anomalies


def test_checker_follows_extend_and_narrow(tmp_path):
    """A lease extended and narrowed (real pushes, logged by the server's reference-transaction hook): no
    anomaly; the same extend without its scope ref, or a grant overlapping an extended path, is one."""
    from gitlease.core.refnames import id_ref

    bare, svc = _store(tmp_path, logged=True)
    early = svc.acquire(["docs/a"])
    svc.release(early.lease_id)
    got = svc.acquire(["src"])
    ext = svc.extend(got.lease_id, ["docs", "lib"])
    nar = svc.narrow(got.lease_id, ["src"])
    svc.release(got.lease_id)
    assert nar.record.paths == ("docs", "lib")
    txns = serverlog.settle(serverlog.parse(serverlog.log_path(bare).read_text()), {})
    intents = {early.lease_id, got.lease_id}
    rep = checker.check(bare, txns, tolerance=2, release_intents=intents, final_refs={})
    assert rep.anomalies == [] and rep.leases == 2 and rep.renewals == 2 and rep.releases == 2
    early_grant, grant, extend_t = txns[0], txns[2], txns[3]
    # the extend's transaction without its scope refs: the scope changed without them
    bare_extend = serverlog.Txn(extend_t.seq, extend_t.time, extend_t.pid, ((got.oid, ext.oid, id_ref(got.lease_id)),))
    rep = checker.check(bare, [grant, bare_extend], tolerance=2, final_refs={})
    assert any("scope changed without" in x for x in rep.anomalies), rep.anomalies
    # an extend over a path another lease still holds (had git let it through): an overlap
    rep = checker.check(bare, [early_grant, grant, extend_t], tolerance=2, final_refs={})
    assert any("extended by docs lib while" in x for x in rep.anomalies), rep.anomalies
