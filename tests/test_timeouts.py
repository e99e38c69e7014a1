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
    assert sorted(refs) == sorted(
        [f"refs/leases/id/{got.lease_id}", "refs/leases/scope/libs/tax", "refs/leases/scope/services/billing"]
    )
    assert not list(bare.rglob("*.lock")), "a killed receive-pack left ref locks behind"


def test_an_acquire_whose_push_lands_after_the_re_read_is_still_ours(tmp_path, remote_file):
    """The server commits the push after the client gave up and after its first re-read (a stalled server):
    the refusal path then finds the attempt's own, unique lease and takes it, instead of reporting itself
    as the blocker."""
    from gitlease.core.store import Outcome, RemoteStore

    class LateStore(RemoteStore):
        deferred = None
        reads = 0

        def apply(self, updates, **kw):
            if self.deferred is None and any(u.ref.startswith("refs/leases/scope/") for u in updates):
                self.deferred = list(updates)  # the answer is lost; the server has not committed yet
                return Outcome(ok=False, ambiguous=True, message="timed out")
            return super().apply(updates, **kw)

        def list_refs(self, **kw):
            refs = super().list_refs(**kw)
            self.reads += 1
            if self.reads == 1 and self.deferred:
                assert super().apply(self.deferred).ok  # ... and now it commits, after the first re-read
            return refs

    fleet = Fleet(tmp_path, remote_file.url)
    a = fleet.agent("a")
    a.store = LateStore(a.repo.cwd, remote_file.url)
    got = a.acquire(["services/billing"])
    refs = git(remote_file.path, "for-each-ref", "--format=%(refname)", "refs/leases/").split()
    assert f"refs/leases/id/{got.lease_id}" in refs and len(refs) == 2  # one lease: the late one, ours
    assert got.lease_id in a.held_here()


def test_a_renewal_that_lands_after_the_client_gave_up_is_settled_by_the_next_one(tmp_path, remote_daemon):
    """The server commits a renewal after the client's push timed out and after its re-read (seen over git
    daemon in the fleet soak): the renewal's outcome is unknown (kept pending, RemoteUnavailable: the heartbeat
    retries), not "not landed"; the next renewal reads that the pending version won and renews from it. Before,
    the version was dropped, the next renewal was pinned to the one before it, and the lease was lost."""
    import time

    import pytest

    from gitlease.core import errors
    from gitlease.core.refnames import id_ref

    bare = remote_daemon.path  # over git daemon the server's receive-pack outlives the client that gave up
    fleet = Fleet(tmp_path, remote_daemon.url)
    a = fleet.agent("a", timeout=1)
    got = a.acquire(["svc"], ttl=600)
    _slow_prepare(bare, 3)  # holds the renewal's transaction past the client's 1 s timeout and its re-read
    with pytest.raises(errors.RemoteUnavailable, match="may still land"):
        a.renew(got.lease_id)
    assert a.held_here()[got.lease_id].pending  # kept: which version won is read at the next renewal
    deadline = time.monotonic() + 30
    while git(bare, "rev-parse", id_ref(got.lease_id)).strip() == got.oid:  # the server finishing (not a TTL)
        assert time.monotonic() < deadline, "the server never committed the renewal"
        time.sleep(0.05)  # polling a real server process that finishes a push, not letting a TTL pass
    (bare / "hooks" / "reference-transaction").unlink()
    again = a.renew(got.lease_id)
    assert again.record.version == 3 and git(bare, "rev-parse", id_ref(got.lease_id)).strip() == again.oid
