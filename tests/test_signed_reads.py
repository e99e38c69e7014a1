"""Reads of a signed store that verify nothing new load nothing they do not need (issue 22): the configured
signing key is loaded only when something needs it (signer.KeySigner), and the trust file's parsed content is
reused while the store's default branch is at the same commit. Neither may skip a check: a version no process
verified is verified, a forged one refused, a changed trust file read again, a key that cannot be loaded
reported where it is needed. Real git throughout; a "new process" is a fresh verification memo."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import cli, git
from test_identity import Signed, _current, _forge
from test_scale_io import _signed_lease, new_process, signed, verify_calls  # noqa: F401 - fixtures shared

from gitlease.core import errors
from gitlease.core.config import resolve
from gitlease.core.refnames import id_ref
from gitlease.core.repo import Repo
from gitlease.core.store import RefUpdate
from gitlease.identity import trust
from gitlease.identity.signer import KeySigner
from gitlease.service.factory import signer_for
from gitlease.service.leases import LeaseService


def _lazy(signed: Signed, name: str, key_path: str) -> LeaseService:
    """Agent ``name``'s service with its key configured as ``lease.signingKey`` is: a KeySigner."""
    repo = Repo.discover(signed.path(name))
    settings = resolve(repo.config, env={}, remote=signed.url, agent=name, task=f"task-{name}", timeout=20)
    return LeaseService(repo, settings, clock=signed.clock, signer=KeySigner(key_path))


def _copy_key(signed: Signed, name: str, to) -> str:
    """A copy of ``name``'s key file (a test deletes it), and its .pub."""
    src = signed.keys[name].path
    for suffix in ("", ".pub"):
        with open(src + suffix, "rb") as fh, open(str(to) + suffix, "wb") as out:
            out.write(fh.read())
    os.chmod(str(to), 0o600)
    return str(to)


# ------------------------------------------------------------------------------------------ lazy signer


def test_the_configured_key_is_a_lazy_signer(signed, tmp_path):
    key = _copy_key(signed, "a", tmp_path / "lazy_a")
    svc = _lazy(signed, "a", key)
    assert svc.signer.configured and not svc.signer.loaded
    assert svc.signer.public_key == signed.keys["a"].public_key() and svc.signer.loaded
    assert svc.signer.fingerprint == signed.keys["a"].fingerprint()
    repo = Repo.discover(signed.path("z"))
    assert isinstance(signer_for(resolve(repo.config, env={}, signing_key=key)), KeySigner)
    assert not signer_for(resolve(repo.config, env={})).configured


def test_a_read_of_verified_versions_never_loads_the_key(signed, tmp_path, new_process, verify_calls):
    key = _copy_key(signed, "a", tmp_path / "lazy_a")
    a = _lazy(signed, "a", key)
    got = a.acquire(["svc"], ttl=600)  # a write loads it
    assert a.signer.loaded
    signed.clock.advance(10)
    a.renew(got.lease_id)
    new_process()
    reader = _lazy(signed, "a", key)
    assert _current(reader, got.lease_id).verification == "verified"
    assert not reader.signer.loaded  # nothing was signed: the key was never read
    assert verify_calls  # ... while both versions were verified (no process had verified them)


def test_with_the_key_unreadable_a_new_version_is_still_verified_and_a_forgery_refused(
    signed, tmp_path, new_process, verify_calls
):
    key = _copy_key(signed, "a", tmp_path / "lazy_a")
    a = _lazy(signed, "a", key)
    got = a.acquire(["svc"], ttl=600)
    new_process()
    assert _current(_lazy(signed, "a", key), got.lease_id).valid  # every version cached
    os.remove(key)
    a.renew(got.lease_id)  # the holder's process had loaded its key: it still signs
    calls = len(verify_calls)
    new_process()
    reader = _lazy(signed, "a", key)
    view = _current(reader, got.lease_id)
    assert view.valid and view.verification == "verified" and view.record.version == 2
    assert len(verify_calls) == calls + 1  # the version no process had verified was verified
    b = signed.agent("b")
    forged = _forge(b, got.lease_id, view.current_oid, view.record.next_version(signed.clock.now(), ttl=600))
    assert b.store.apply([RefUpdate(id_ref(got.lease_id), forged, view.current_oid)]).ok
    for _ in range(2):
        new_process()
        reader = _lazy(signed, "a", key)
        view = _current(reader, got.lease_id)
        assert not view.valid and any("not by the owner key" in p for p in view.problems), view.problems
        assert not reader.signer.loaded
    with pytest.raises(errors.ConfigError) as err:  # a write needs the key: the clear error, nothing written
        reader.acquire(["other"])
    assert "no such file" in str(err.value) and "lazy_a" in str(err.value)
    assert not any(v.record.paths == ("other",) for v in reader.status().leases if v.record)


def test_cli_status_works_without_the_key_and_writes_say_why_not(signed, tmp_path, remote_file):
    key = _copy_key(signed, "a", tmp_path / "cli_a")
    w = signed.path("a")
    git(w, "config", "lease.remote", remote_file.url)
    git(w, "config", "lease.agent", "a")
    git(w, "config", "lease.signingKey", key)
    res = cli(w, "acquire", "--scope", "svc", "--json")
    assert res.returncode == 0, res.stderr
    lease = json.loads(res.stdout)["result"]["leaseId"]
    assert cli(w, "status").returncode == 0  # verifies and caches
    os.remove(key)
    res = cli(w, "status", "--json")
    assert res.returncode == 0, res.stderr
    (view,) = json.loads(res.stdout)["result"]["leases"]
    assert view["valid"] and view["verification"] == "verified"
    for args in (["acquire", "--scope", "web"], ["renew", lease], ["release", lease]):
        res = cli(w, *args)
        assert res.returncode == 1, (args, res.stdout, res.stderr)
        assert f"signing key {key}: no such file" in res.stderr and "Traceback" not in res.stderr, args
        assert res.stderr.count("\n") == 1
    res = cli(w, "status", "--json")  # nothing was written meanwhile: the lease is as it was
    (after,) = json.loads(res.stdout)["result"]["leases"]
    assert after["leaseId"] == lease and after["version"] == view["version"] and after["valid"]


def test_cli_status_of_cached_versions_imports_no_cryptography(signed, tmp_path, remote_file):
    key = _copy_key(signed, "a", tmp_path / "cli_a")
    w = signed.path("a")
    for k, v in (("lease.remote", remote_file.url), ("lease.agent", "a"), ("lease.signingKey", key)):
        git(w, "config", k, v)
    assert cli(w, "acquire", "--scope", "svc").returncode == 0
    assert cli(w, "status").returncode == 0
    probe = (
        "import sys, io, contextlib\n"
        "from gitlease.cli import dispatch\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    code = dispatch(['status', '--json'])\n"
        "print(code, 'cryptography' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], cwd=w, capture_output=True, text=True)
    assert res.stdout.split() == ["0", "False"], res.stderr


# ------------------------------------------------------------------------------------------- trust file


@pytest.fixture
def trust_reads(monkeypatch):
    """The commits whose trust files were read from git (trust.read_trust_files), in order."""
    calls = []
    real = trust.read_trust_files
    monkeypatch.setattr(
        trust, "read_trust_files", lambda commit, path, **kw: calls.append(commit) or real(commit, path, **kw)
    )
    return calls


def _trust_cache(svc: LeaseService) -> trust.TrustCache:
    return trust.TrustCache(svc.repo.shared_dir(), svc.store.name)


def test_the_trust_file_of_a_commit_is_read_once(signed, trust_reads, new_process):
    a = signed.agent("a")
    got = a.acquire(["svc"], ttl=600)
    c = signed.agent("c")
    assert _current(c, got.lease_id).verification == "verified"
    n = len(trust_reads)  # each clone (its own cache) read it once: a to write, c to read
    cache = _trust_cache(c)
    stamp = os.stat(cache.path).st_mtime_ns
    os.utime(cache.path, ns=(stamp - 10**9, stamp - 10**9))
    for _ in range(2):  # new services, new processes: the same default branch commit, nothing read again
        new_process()
        snap = signed.agent("c").status()
        assert snap.find(got.lease_id).verification == "verified" and snap.trust.startswith("signed: trust from")
    assert len(trust_reads) == n
    assert os.stat(cache.path).st_mtime_ns == stamp - 10**9  # and the cache is not rewritten
    # the trust file changes (a new commit on the default branch): read again, and a is no longer trusted
    signed.publish_trust(f'c namespaces="gitlease" {signed.keys["c"].public_key()}\n')
    new_process()
    view = _current(signed.agent("c"), got.lease_id)
    assert len(trust_reads) == n + 1 and not view.valid and any("not trusted" in p for p in view.problems)
    new_process()
    assert not _current(signed.agent("c"), got.lease_id).valid and len(trust_reads) == n + 1


def test_a_trust_file_removed_on_a_new_commit_is_missed_with_a_key(signed, tmp_path, new_process):
    key = _copy_key(signed, "c", tmp_path / "lazy_c")
    got = signed.agent("a").acquire(["svc"], ttl=600)
    assert _current(_lazy(signed, "c", key), got.lease_id).valid  # the trust file read and cached
    git(signed.main, "rm", "-q", ".gitlease/allowed_signers")
    git(signed.main, "commit", "-q", "-m", "no trust")
    git(signed.main, "push", "-q", signed.url, "HEAD:refs/heads/main")
    new_process()
    with pytest.raises(errors.InvalidRecord) as err:
        _lazy(signed, "c", key).status()
    assert err.value.exit_code == 5 and "there is no trust file" in str(err.value)
    new_process()
    with pytest.raises(errors.InvalidRecord):  # and again: a commit without the file is remembered as such
        _lazy(signed, "c", key).status()
    snap = signed.agent("c", key=None).status()  # without a key: unsigned mode, and the signed lease untrusted
    assert not snap.signed_store and snap.find(got.lease_id).verification == "untrusted"


@pytest.mark.parametrize("other", ["commit", "path"])
def test_the_cached_trust_of_another_commit_or_path_is_not_used(signed, trust_reads, new_process, other):
    got = signed.agent("a").acquire(["svc"], ttl=600)
    c = signed.agent("c")
    assert _current(c, got.lease_id).valid
    n = len(trust_reads)
    cache = _trust_cache(c)
    with open(cache.path, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["text"] = f'a namespaces="gitlease" {signed.keys["eve"].public_key()}\n'  # what the commit does not hold
    if other == "commit":
        doc["commit"] = "0" * len(doc["commit"])
    else:
        doc["path"] = "other/allowed_signers"
    with open(cache.path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    new_process()
    view = _current(signed.agent("c"), got.lease_id)
    assert view.valid and view.verification == "verified" and len(trust_reads) == n + 1  # read from git again


# --------------------------------------------------------------------------- versions read from the cache


def _cached_lease(signed, new_process, renewals=3):
    a, lease_id, oids = _signed_lease(signed, renewals)
    new_process()
    assert _current(signed.agent("c"), lease_id).valid  # every version verified and cached
    return a, lease_id, oids


@pytest.mark.parametrize("how", ["grant-fields", "skips-a-version"])
def test_an_owner_signed_bad_version_on_a_cached_history_is_refused(signed, new_process, verify_calls, how):
    """The owner's own key signs a version that breaks the history rules against v1 (or the version before):
    a new process has v1..v4 only as the verified cache's rows, and still compares the new one with them."""
    from dataclasses import replace

    a, lease_id, oids = _cached_lease(signed, new_process)
    v4 = a.status().find(lease_id).record
    bad = v4.next_version(signed.clock.now(), ttl=600)
    bad = replace(bad, workspace_id="elsewhere") if how == "grant-fields" else replace(bad, version=6)
    forged = _forge(a, lease_id, oids[-1], bad)  # a's own key: the signature verifies
    assert a.store.apply([RefUpdate(id_ref(lease_id), forged, oids[-1])]).ok
    want = "changes the owner or grant fields of v1" if how == "grant-fields" else "v6 ("
    for _ in range(2):
        new_process()
        calls = len(verify_calls)
        view = _current(signed.agent("c"), lease_id)
        assert not view.valid and any(want in p for p in view.problems), view.problems
        assert len(verify_calls) == calls + 1  # only the new version's signature: v1..v4 came from the cache


def test_show_of_a_cached_history_reads_every_record(signed, new_process, verify_calls):
    a, lease_id, oids = _cached_lease(signed, new_process, renewals=4)
    new_process()
    calls = len(verify_calls)
    view, history, _ = signed.agent("c").show(lease_id)
    assert [h.oid for h in history] == oids[::-1] and len(verify_calls) == calls
    assert [h.record.version for h in history] == [5, 4, 3, 2, 1]
    assert all(h.verification == "verified" and h.principal == "a" for h in history)
    assert view.chain.versions[-1].record.version == 1 and len(view.chain.versions) == 5


def test_a_cached_history_without_v1s_record_is_checked_from_scratch(signed, new_process, verify_calls):
    """v1's record is needed to check a new version against: a cached history whose v1 has no record bytes
    (a damaged file) is not taken as whole, and the history is verified again rather than trusted."""
    import sqlite3

    a, lease_id, oids = _cached_lease(signed, new_process)
    signed.clock.advance(10)
    a.renew(lease_id)
    c = signed.agent("c")
    db = sqlite3.connect(os.path.join(c.repo.shared_dir(), "cache", "verified.sqlite3"))
    with db:
        assert db.execute("UPDATE v SET data = 'not bytes' WHERE oid = ?", (oids[0],)).rowcount == 1
    db.close()
    new_process()
    calls = len(verify_calls)
    view = _current(c, lease_id)
    assert view.valid and view.verification == "verified" and view.record.version == 5, view.problems
    assert len(verify_calls) == calls + 5  # all five versions, not only the new one
