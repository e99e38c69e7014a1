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

from gitlease.core import errors
from gitlease.core.config import resolve
from gitlease.core.refnames import id_ref
from gitlease.core.repo import Repo
from gitlease.core.store import RefUpdate
from gitlease.identity import sshsig, trust
from gitlease.identity.signer import KeySigner
from gitlease.service.factory import signer_for
from gitlease.service.leases import LeaseService


@pytest.fixture
def signed(tmp_path, remote_file):
    return Signed(tmp_path, remote_file.url)


@pytest.fixture
def new_process(monkeypatch):
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
