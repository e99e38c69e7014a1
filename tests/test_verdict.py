"""What doctor found, kept on the store, and read where it matters: ``acquire`` warns (or, with
``lease.requireDoctor``, refuses) on a store without a passing verdict for the server it talks to, and
``status --mine`` reports an overlap that involves a lease held here."""

from __future__ import annotations

import json

from conftest import cli, git


def _overlapping_store(tmp_path, make_repo):
    """A store where ``holder`` holds ``a`` and another lease, granted elsewhere, holds ``a/b``: what a server
    that does not serialise ref updates can leave. git refuses to create such refs, so the other lease's refs
    are written into packed-refs by hand."""
    store, elsewhere = tmp_path / "store.git", tmp_path / "elsewhere.git"
    for bare in (store, elsewhere):
        git(tmp_path, "init", "-q", "--bare", str(bare))
    holder, other = make_repo("holder"), make_repo("other")
    assert cli(holder, "acquire", "--remote", str(store), "--scope", "a").returncode == 0
    assert cli(other, "acquire", "--remote", str(elsewhere), "--scope", "a/b").returncode == 0
    git(store, "fetch", "-q", str(elsewhere), "refs/leases/*:refs/tmp/*")
    lines = []
    for bare in (store, elsewhere):
        lines += git(bare, "for-each-ref", "--format=%(objectname) %(refname)", "refs/leases/").splitlines()
    for ref in git(store, "for-each-ref", "--format=%(refname)").split():
        git(store, "update-ref", "-d", ref)
    (store / "packed-refs").write_text(
        "# pack-refs with: peeled fully-peeled sorted \n" + "\n".join(sorted(lines, key=lambda s: s.split()[1])) + "\n"
    )
    return store, holder


def test_status_mine_reports_an_overlap_that_involves_the_holder(tmp_path, make_repo):
    store, holder = _overlapping_store(tmp_path, make_repo)
    res = cli(holder, "status", "--mine", "--remote", str(store))
    assert res.returncode == 5, res.stdout + res.stderr
    assert "store fault: live leases overlap" in res.stderr
    assert len([ln for ln in res.stdout.splitlines() if ln.startswith("lease_")]) == 1  # only its own listed
    doc = json.loads(cli(holder, "status", "--mine", "--json", "--remote", str(store)).stdout)
    assert doc["error"]["exitCode"] == 5 and len(doc["error"]["details"]["overlaps"]) == 1
    # a worktree that holds neither: its --mine has nothing to report
    bystander = make_repo("bystander")
    assert cli(bystander, "status", "--mine", "--remote", str(store)).returncode == 0


# -------------------------------------------------------------------------------------- the verdict


def _doctor(repo, url, *args):
    res = cli(repo, "doctor", "--json", "--remote", url, *args, timeout=300)
    doc = json.loads(res.stdout)
    checks = doc["result"]["checks"] if doc["ok"] else doc["error"]["details"]["checks"]
    return res, {c["name"]: c for c in checks}


def test_acquire_warns_once_on_a_store_without_a_verdict(remote_daemon, make_repo):
    from gitlease.service.factory import open_service

    work = make_repo()
    res = cli(work, "acquire", "--remote", remote_daemon.url, "--scope", "README", "--json")
    assert res.returncode == 0, res.stderr
    warning = f"no doctor verdict for {remote_daemon.url} on this store"
    lines = [ln for ln in res.stderr.splitlines() if "doctor" in ln]
    assert lines == [f"git-lease: warning: {warning} (git lease doctor records one; lease.requireDoctor=true refuses)"]
    assert any(warning in w for w in json.loads(res.stdout)["result"]["warnings"])
    # the library keeps it (once per service), it prints nothing
    svc = open_service(str(work), remote=remote_daemon.url)
    svc.acquire(["a"], ttl=60)
    svc.acquire(["b"], ttl=60)
    assert len(svc.warnings) == 1 and warning in svc.warnings[0]
    # the local store needs none: its transactions are this machine's git's own
    local = make_repo()
    res = cli(local, "acquire", "--scope", "README")
    assert res.returncode == 0 and "doctor" not in res.stderr


def test_require_doctor_refuses_until_doctor_passes_then_acquire_is_quiet(remote_file, make_repo):
    work = make_repo()
    git(work, "config", "lease.requireDoctor", "true")
    res = cli(work, "acquire", "--remote", remote_file.url, "--scope", "README", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    err = json.loads(res.stdout)["error"]
    assert err["kind"] == "doctor-required" and "lease.requireDoctor is set" in err["message"]
    assert git(remote_file.path, "for-each-ref", "refs/leases/id/") == ""  # nothing written
    res, checks = _doctor(work, remote_file.url)  # the default rounds: a verdict acquire takes as passing
    assert res.returncode == 0, res.stderr
    verdict = checks["verdict"]
    assert verdict["status"] == "pass" and verdict["passed"] and verdict["ref"].startswith("refs/leases/verdict/")
    doc = json.loads(git(remote_file.path, "cat-file", "blob", f"{verdict['ref']}:verdict.json"))
    assert doc["ok"] and doc["agent"].startswith("git/") and doc["rounds"] == 30 and doc["probeVersion"] == 2
    assert doc["url"] == remote_file.url and "atomic" in doc["capabilities"]
    other = make_repo()  # another clone, reaching the store at the same URL, reads it from the store
    git(other, "config", "lease.requireDoctor", "true")
    for clone in (work, other):
        res = cli(clone, "acquire", "--remote", remote_file.url, "--scope", f"{clone.name}/x")
        assert res.returncode == 0, res.stderr
        assert "doctor" not in res.stderr


def test_a_failing_verdict_is_kept_and_acquire_names_what_failed(remote_file, make_repo):
    hook = remote_file.path / "hooks" / "pre-receive"  # deletes refused: leases could never be released
    hook.write_text(
        '#!/bin/sh\nwhile read old new ref; do [ "$new" = 0000000000000000000000000000000000000000 ]'
        ' && { echo "no deletes" >&2; exit 1; }; done; exit 0\n'
    )
    hook.chmod(0o755)
    work = make_repo()
    res, checks = _doctor(work, remote_file.url, "--rounds", "3")
    assert res.returncode == 1 and checks["verdict"]["passed"] is False
    other = make_repo()
    res = cli(other, "acquire", "--remote", remote_file.url, "--scope", "README")
    assert res.returncode == 0, res.stderr
    assert f"git lease doctor failed {remote_file.url} on " in res.stderr and "(deletes, cleanup)" in res.stderr


def test_a_short_doctor_run_is_not_a_passing_verdict(remote_file, make_repo):
    work = make_repo()
    res, checks = _doctor(work, remote_file.url, "--rounds", "3")
    assert res.returncode == 0 and checks["verdict"]["passed"] is True
    res = cli(make_repo(), "acquire", "--remote", remote_file.url, "--scope", "README")
    assert "raced" in res.stderr and "in 3 rounds only (at least 30)" in res.stderr


def test_doctor_passes_behind_gitleases_own_server_hook(remote_file, make_repo):
    """The probes (fast-forwards of probe refs in the compare-and-swap probe, the alphabet of ref names) and
    the verdict are shapes the server hook accepts."""
    assert cli(remote_file.path, "install-hooks", "--server").returncode == 0
    res, checks = _doctor(make_repo(), remote_file.url, "--rounds", "3")
    assert res.returncode == 0, json.dumps(checks, indent=1)
    for name in ("custom-refs", "ref-names", "compare-and-swap", "concurrency", "deletes", "cleanup", "verdict"):
        assert checks[name]["status"] == "pass", checks[name]
