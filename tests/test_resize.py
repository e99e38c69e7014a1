"""A lease that grows with the task: ``extend`` and ``narrow``, against every store kind, and every reader that
depends on what scope refs point at (views, history verification, the server hook, the hooks' own reader)."""

import json
import subprocess

import pytest
from conftest import cli, git, run_git
from test_verify import guarded  # noqa: F401  (a fixture)

from gitlease.core import errors
from gitlease.core import record as records
from gitlease.core.config import resolve
from gitlease.core.refnames import id_ref, scope_ref
from gitlease.core.repo import Repo
from gitlease.service.leases import LeaseService


def test_extend_adds_paths_in_one_push_and_readers_agree(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    got = a.acquire(["services/billing"], ttl=60)
    fleet.clock.advance(10)
    res = a.extend(got.lease_id, ["libs/tax", "services/billing/api.py", "docs/x.md"])
    assert res.added == ("docs/x.md", "libs/tax")  # already covered paths add nothing
    assert res.record.version == 2 and res.record.paths == ("docs/x.md", "libs/tax", "services/billing")
    assert res.record.expires == fleet.clock.now() + 60  # an extend is a renewal too
    refs = a.store.list_refs()
    # the new scope refs point at the grant, like the first one: scope refs never move, readers group by grant
    assert refs[scope_ref("libs/tax")] == got.oid and refs[scope_ref("docs/x.md")] == got.oid
    assert refs[id_ref(got.lease_id)] == res.oid
    view = a.snapshot().find(got.lease_id)
    assert view.valid, view.problems
    assert view.paths == ("docs/x.md", "libs/tax", "services/billing")
    assert a.held_here()[got.lease_id].paths == ["docs/x.md", "libs/tax", "services/billing"]
    with pytest.raises(errors.HeldError) as err:
        b.acquire(["libs"])
    assert got.lease_id in str(err.value)
    # history records the change; renew keeps the new scope; release deletes every scope ref
    _, history, _ = a.show(got.lease_id)
    assert [h.record.paths for h in history] == [res.record.paths, ("services/billing",)]
    assert a.renew(got.lease_id).record.paths == res.record.paths
    a.release(got.lease_id)
    assert a.store.list_refs() == {}


def test_extend_overlapping_another_lease_is_all_or_nothing(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    mine = a.acquire(["src"])
    theirs = b.acquire(["libs/tax"])
    before = a.store.list_refs()
    with pytest.raises(errors.HeldError) as err:
        a.extend(mine.lease_id, ["docs", "libs"])
    assert err.value.exit_code == 3
    assert theirs.lease_id in str(err.value) and "task=task-b" in str(err.value) and "agent=b" in str(err.value)
    assert a.store.list_refs() == before  # docs was not taken either
    assert a.held_here()[mine.lease_id].paths == ["src"]
    assert a.renew(mine.lease_id).record.version == 2  # still held, at the version written here


def test_extend_clears_an_expired_blocker(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    old = b.acquire(["docs"], ttl=60)
    mine = a.acquire(["src"], ttl=600)
    fleet.clock.advance(100)
    res = a.extend(mine.lease_id, ["docs/guide.md"])
    assert res.added == ("docs/guide.md",)
    assert id_ref(old.lease_id) not in a.store.list_refs()


def test_narrow_gives_paths_back(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    got = a.acquire(["docs", "libs/tax", "src"])
    res = a.narrow(got.lease_id, ["libs", "docs"])
    assert res.removed == ("docs", "libs/tax") and res.record.paths == ("src",)
    refs = a.store.list_refs()
    assert scope_ref("libs/tax") not in refs and scope_ref("docs") not in refs and refs[scope_ref("src")] == got.oid
    assert b.acquire(["libs/tax"]).lease_id
    assert a.snapshot().find(got.lease_id).valid
    with pytest.raises(errors.HeldError):
        b.acquire(["src/a.py"])


def test_narrow_and_extend_refusals(tmp_path):
    from helpers import Fleet

    fleet = Fleet(tmp_path, None)
    a = fleet.agent("a")
    got = a.acquire(["a/b", "c"])
    for bad, why in [
        (["a/b/c"], "only whole scopes"),
        (["zz"], "does not hold zz"),
        (["a", "c"], "release it instead"),
    ]:
        with pytest.raises(errors.UsageError) as err:
            a.narrow(got.lease_id, bad)
        assert why in str(err.value) and err.value.exit_code == 2
    with pytest.raises(errors.UsageError) as err:
        a.extend(got.lease_id, ["a"])  # git cannot turn a/b's ref into a's in one push
    assert "it contains a/b" in str(err.value)
    assert a.extend(got.lease_id, ["c/d"]).changed is False  # covered already: nothing to push
    assert a.store.list_refs()[id_ref(got.lease_id)] == got.oid
    with pytest.raises(errors.NotHeld):
        fleet.agent("b").extend(got.lease_id, ["x"])
    fleet.clock.advance(301)
    with pytest.raises(errors.LeaseLost):
        a.extend(got.lease_id, ["x"])


def test_extend_of_a_lost_lease_is_a_stop_signal(tmp_path):
    from helpers import Fleet

    fleet = Fleet(tmp_path, None)
    a, b = fleet.agent("a"), fleet.agent("b")
    got = a.acquire(["svc"], ttl=60)
    for ref in (id_ref(got.lease_id), scope_ref("svc")):  # someone cleared it (a sweep, a forced release)
        git(fleet.main, "update-ref", "-d", ref)
    b.acquire(["svc"])
    with pytest.raises(errors.LeaseLost) as err:
        a.extend(got.lease_id, ["other"])
    assert err.value.exit_code == 6
    assert scope_ref("other") not in a.store.list_refs()


def test_readers_fail_closed_on_a_scope_ref_the_current_version_does_not_name(tmp_path):
    """A scope ref at the lease's grant for a path its current version does not hold (a torn read of an
    extend, or someone pushing one by hand): the lease is invalid and the path stays blocked."""
    from helpers import Fleet

    fleet = Fleet(tmp_path, None)
    a, b = fleet.agent("a"), fleet.agent("b")
    got = a.acquire(["src"])
    git(fleet.main, "update-ref", scope_ref("extra"), got.oid)
    view = b.snapshot().find(got.lease_id)
    assert not view.valid and "a scope ref names a path the lease does not hold" in view.problems
    assert "extra" in view.paths
    with pytest.raises(errors.HeldError):
        b.acquire(["extra/file"])


def test_cli_extend_and_narrow(make_repo):
    repo = make_repo("w")
    acq = json.loads(cli(repo, "acquire", "--scope", "src", "--json").stdout)
    lease = acq["result"]["leaseId"]
    res = cli(repo, "extend", lease, "--scope", "docs", "--scope", "src/x.py")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"lease extended: {lease} +docs",
        "scope: docs src",
        f"version: 2 expiresAt={_expires(repo, lease)}",
    ]
    res = cli(repo, "narrow", lease, "--scope", "docs", "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["result"]["removed"] == ["docs"] and doc["result"]["paths"] == ["src"]
    other = repo.parent / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    theirs = json.loads(cli(other, "acquire", "--scope", "lib", "--json").stdout)["result"]["leaseId"]
    res = cli(repo, "extend", lease, "--scope", "lib/a.py")
    assert res.returncode == 3 and theirs in res.stderr
    res = cli(repo, "narrow", lease, "--scope", "src")
    assert res.returncode == 2 and "release it instead" in res.stderr


def _expires(repo, lease):
    held = json.loads((repo / ".git" / "gitlease" / "held.json").read_text())
    return held["leases"][lease]["expires_at"]


def test_hold_extend_and_narrow(tmp_path):
    from helpers import Fleet

    import gitlease
    from gitlease.core.clock import SYSTEM

    fleet = Fleet(tmp_path, None, SYSTEM)  # a real clock: the heartbeat waits its interval, not a spin on fake time
    svc = fleet.agent("a")
    with gitlease.hold(str(svc.repo.cwd), ["src"], service=svc, renew_agent=False) as lease:
        lease.extend(["docs"])
        assert lease.paths == ("docs", "src")
        lease.narrow(["src"])
        assert lease.paths == ("docs",)
        assert svc.held_here()[lease.lease_id].paths == ["docs"]
    assert svc.store.list_refs() == {}


def test_hook_reader_knows_an_extended_lease_is_ours(make_repo):
    """The pre-commit hook tells its own leases from others' by the grant the scope refs point at: an extended
    path's scope ref points at the grant too, so a commit inside it passes."""
    repo = make_repo("w")
    assert cli(repo, "install-hooks").returncode == 0
    r = Repo.discover(repo)
    svc = LeaseService(r, resolve(r.config, env={}, agent="a", task="t"))
    got = svc.acquire(["src"])
    svc.extend(got.lease_id, ["docs"])
    (repo / "docs").mkdir()
    (repo / "docs" / "a.md").write_text("x\n")
    git(repo, "add", ".")
    res = subprocess.run(["git", "commit", "-q", "-m", "docs"], cwd=repo, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # and another worktree (mode others) is refused inside the extended path, naming the lease
    other = repo.parent / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    (other / "docs").mkdir(exist_ok=True)
    (other / "docs" / "b.md").write_text("y\n")
    git(other, "add", ".")
    res = subprocess.run(["git", "commit", "-q", "-m", "b"], cwd=other, capture_output=True, text=True)
    assert res.returncode == 1 and got.lease_id in res.stderr


def test_server_hook_accepts_extend_and_narrow_and_refuses_half_of_one(guarded):
    a = guarded("a")
    r = Repo.discover(a)
    svc = LeaseService(r, resolve(r.config, env={}, agent="a", task="t"))
    got = svc.acquire(["svc"])
    res = svc.extend(got.lease_id, ["docs", "lib"])
    assert git(guarded.bare, "rev-parse", scope_ref("docs")).strip() == got.oid
    res = svc.narrow(got.lease_id, ["docs"])
    assert res.record.paths == ("lib", "svc")
    # a version naming a new path without its scope ref (or a scope ref without the version) is refused
    ref = id_ref(got.lease_id)
    cur = res.oid
    rec = records.parse(git(a, "cat-file", "blob", f"{cur}:lease.json").encode())
    from dataclasses import replace

    wider = replace(rec.next_version(rec.renewed + 1), paths=("lib", "svc", "zz"))
    oid = svc._write_version(wider, cur, "extend")
    out = run_git(
        a, "push", "--porcelain", "--atomic", f"--force-with-lease={ref}:{cur}", "origin", f"{oid}:{ref}", check=False
    )
    assert out.returncode == 1 and "a renewal may not change paths" in out.stderr
    zz = scope_ref("zz")
    out = run_git(
        a, "push", "--porcelain", "--atomic", f"--force-with-lease={zz}:", "origin", f"{got.oid}:{zz}", check=False
    )
    assert out.returncode == 1 and "created without their lease's id ref" in out.stderr
    svc.release(got.lease_id)
    assert git(guarded.bare, "for-each-ref", "refs/leases/") == ""


def test_history_with_a_changed_scope_verifies_when_signed(tmp_path, monkeypatch):
    """Owner binding still holds across a scope change: every version signed by version 1's key verifies."""
    pytest.importorskip("cryptography")
    from helpers import Fleet

    from gitlease.identity import sshsig
    from gitlease.identity.signer import load_signer

    key = tmp_path / "key"
    sshsig.generate_key(str(key), comment="a")
    (tmp_path / "f").mkdir()
    fleet = Fleet(tmp_path / "f", None)
    a = fleet.agent("a")
    a.signer = load_signer(str(key))
    (fleet.main / ".gitlease").mkdir()
    (fleet.main / ".gitlease" / "allowed_signers").write_text(f'a namespaces="gitlease" {a.signer.public_key}\n')
    git(fleet.main, "add", ".gitlease")
    git(fleet.main, "commit", "-q", "-m", "trust")
    got = a.acquire(["src"])
    a.extend(got.lease_id, ["docs"])
    view, history, snap = a.show(got.lease_id)
    assert view.valid and view.verification == "verified", view.problems
    assert [h.record.version for h in history] == [2, 1] and view.record.owner.key == a.signer.public_key
