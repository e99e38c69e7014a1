"""A push that times out while the server holds its ref locks: over file:// the server is our own child."""
import stat

from conftest import git
from helpers import Fleet
from servers import make_bare


def _slow_prepare(bare, seconds: float) -> None:
    hook = bare / "hooks" / "reference-transaction"
    hook.write_text(f'#!/bin/sh\ncat >/dev/null\n[ "$1" = prepared ] && sleep {seconds}\nexit 0\n')
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)


def test_timed_out_file_push_lets_the_server_finish_its_transaction(tmp_path):
    bare = make_bare(tmp_path / "store.git")
    _slow_prepare(bare, 1.3)  # holds every ref lock of the transaction past the client's 1 s timeout
    fleet = Fleet(tmp_path, bare.as_uri())
    a = fleet.agent("a", timeout=1)
    got = a.acquire(["services/billing", "libs/tax"])  # ambiguous at the client, settled by re-reading
    refs = git(bare, "for-each-ref", "--format=%(refname)", "refs/leases/").split()
    assert sorted(refs) == sorted([f"refs/leases/id/{got.lease_id}", "refs/leases/scope/libs/tax",
                                   "refs/leases/scope/services/billing"])
    assert not list(bare.rglob("*.lock")), "a killed receive-pack left ref locks behind"
