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
