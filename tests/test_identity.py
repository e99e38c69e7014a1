"""Signed identity against real git stores: every version signed by its owner, verified by every reader,
forgeries, replays and non-owners refused or detected, trust read from the store's default branch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import cli, git, not_released_by_another
from helpers import Fleet

from gitlease.core import errors
from gitlease.core import record as records
from gitlease.core.clock import iso
from gitlease.core.config import resolve
from gitlease.core.objects import RECORD_FILE, SIGNATURE_FILE
from gitlease.core.refnames import id_ref, scope_ref
from gitlease.core.repo import Repo
from gitlease.core.store import RefUpdate
from gitlease.identity import sshsig
from gitlease.identity.signer import UNSIGNED, SshSigner
from gitlease.service.leases import LeaseService

SSH_KEYGEN = shutil.which("ssh-keygen")
TRUST = ".gitlease/allowed_signers"


class Signed(Fleet):
    """A Fleet whose store's default branch carries an allowed_signers file; agents sign with their keys."""

    def __init__(self, base: Path, url: str | None, agents=("a", "b", "c"), admins=("boss",), untrusted=("eve",)):
        super().__init__(base, url)
        self.keys = {}
        for name in (*agents, *admins, *untrusted):
            self.keys[name] = sshsig.generate_key(str(base / f"key_{name}"), comment=name)
        lines = [f'{n} namespaces="gitlease" {self.keys[n].public_key()}' for n in agents]
        lines += [f'{n} namespaces="gitlease,gitlease-admin" {self.keys[n].public_key()}' for n in admins]
        self.publish_trust("\n".join(lines) + "\n")

    def publish_trust(self, text: str | bytes, path: str = TRUST) -> None:
        target = self.main / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode() if isinstance(text, str) else text)
        git(self.main, "add", path)
        git(self.main, "commit", "-q", "-m", "trust")
        if self.url:
            git(self.main, "push", "-q", self.url, "HEAD:refs/heads/main")

    def agent(self, name: str = "", *, key: str | None = "", **flags) -> LeaseService:
        """``key``: whose key it signs with ('' = its own, None = unsigned)."""
        name = name or "x"
        repo = Repo.discover(self.path(flags.pop("at", name)))
        settings = resolve(repo.config, env={}, remote=self.url, agent=name, task=f"task-{name}", timeout=20, **flags)
        who = name if key == "" else key
        signer = SshSigner(self.keys[who]) if who else UNSIGNED
        return LeaseService(repo, settings, clock=self.clock, signer=signer)


@pytest.fixture
def signed(tmp_path, store_url):
    return Signed(tmp_path, store_url)


def _forge(
    svc: LeaseService,
    lease_id: str,
    parent_oid: str,
    rec: records.Record,
    *,
    sig: bytes | None = None,
    data: bytes | None = None,
) -> str:
    """Write a version commit the way gitlease does, but with whatever record bytes and signature we like."""
    if parent_oid:
        svc.store.ensure_objects([parent_oid])  # the forger has fetched the lease it forges a version of
    data = rec.canonical() if data is None else data
    sig = svc.signer.sign(data) if sig is None else sig
    w = svc.objects
    files = {RECORD_FILE: w.blob(data)}
    if sig:
        files[SIGNATURE_FILE] = w.blob(sig)
    return w.commit(w.tree(files), (parent_oid,) if parent_oid else (), "Mallory <m@x>", 1_800_000_000, "forged")


def _current(svc: LeaseService, lease_id: str):
    view = svc.status().find(lease_id)
    assert view is not None
    return view


# ------------------------------------------------------------------------------------- the happy path


def test_signed_leases_verify_for_every_reader(signed):
    a, c = signed.agent("a"), signed.agent("c")
    got = a.acquire(["services/billing"])
    signed.clock.advance(10)
    a.renew(got.lease_id)
    for reader in (a, c, signed.agent("boss")):
        snap = reader.status()
        assert snap.signed_store and snap.trust.startswith("signed: trust from .gitlease/allowed_signers on main")
        view = snap.find(got.lease_id)
        assert view.valid and view.verification == "verified" and view.signer == signed.keys["a"].fingerprint()
    view, history, _ = c.show(got.lease_id)
    assert [(h.record.version, h.verification, h.principal) for h in history] == [
        (2, "verified", "a"),
        (1, "verified", "a"),
    ]
    assert all(h.signer == signed.keys["a"].fingerprint() for h in history)
    a.release(got.lease_id)
    assert c.status().leases == []


@pytest.mark.skipif(SSH_KEYGEN is None, reason="OpenSSH ssh-keygen not installed")
def test_stored_signature_verifies_with_ssh_keygen(signed, tmp_path):
    a = signed.agent("a")
    got = a.acquire(["x"])
    blob = a.store.read([got.oid])[got.oid]
    (tmp_path / "lease.sig").write_bytes(blob.signature)
    (tmp_path / "allowed").write_text(f'a namespaces="gitlease" {signed.keys["a"].public_key()}\n')

    def keygen_verify(namespace):
        allowed, sig = str(tmp_path / "allowed"), str(tmp_path / "lease.sig")
        argv = [SSH_KEYGEN, "-Y", "verify", "-f", allowed, "-I", "a", "-n", namespace, "-s", sig]
        return subprocess.run(argv, input=blob.record, capture_output=True)

    res = keygen_verify("gitlease")
    assert res.returncode == 0, res.stderr
    res = keygen_verify("git")
    assert res.returncode != 0


# --------------------------------------------------------------------- one file per signer, beside the trust file


def test_signer_files_beside_the_trust_file_are_trusted_with_it_and_removing_one_revokes(signed, tmp_path):
    signed.keys["d"] = sshsig.generate_key(str(tmp_path / "key_d"), comment="d")
    got_a = signed.agent("a").acquire(["svc/a"])
    signed.publish_trust(f'd namespaces="gitlease" {signed.keys["d"].public_key()}\n', ".gitlease/signers/host-d.pub")
    # not signer files: another suffix, a folder below, a file elsewhere
    eve = f'eve namespaces="gitlease" {signed.keys["eve"].public_key()}\n'
    signed.publish_trust(eve, ".gitlease/signers/host-e.pub.bak")
    signed.publish_trust(eve, ".gitlease/signers/old/host-e.pub")
    signed.publish_trust(eve, "host-e.pub")
    got_d = signed.agent("d").acquire(["svc/d"])
    snap = signed.agent("c").status()
    assert snap.trust.startswith("signed: trust from .gitlease/allowed_signers and .gitlease/signers/ (1 file) on main")
    assert snap.find(got_d.lease_id).verification == "verified" and snap.find(got_a.lease_id).valid
    with pytest.raises(errors.UntrustedWriter):
        signed.agent("eve").acquire(["svc/e"])
    # revoking host d: its file goes (one commit); its lease stops verifying, a's does not
    git(signed.main, "rm", "-q", ".gitlease/signers/host-d.pub")
    git(signed.main, "commit", "-q", "-m", "revoke host-d")
    if signed.url:
        git(signed.main, "push", "-q", signed.url, "HEAD:refs/heads/main")
    snap = signed.agent("c").status()
    assert not snap.find(got_d.lease_id).valid and snap.find(got_a.lease_id).valid
    assert any("not trusted" in p for p in snap.find(got_d.lease_id).problems)


def test_signer_files_alone_make_a_signed_store_and_a_bad_one_is_named(tmp_path, remote_file):
    fleet = Signed(tmp_path, remote_file.url)
    git(fleet.main, "rm", "-q", TRUST)
    git(fleet.main, "commit", "-q", "-m", "no shared file")
    for name in ("a", "b"):
        fleet.publish_trust(
            f'{name} namespaces="gitlease" {fleet.keys[name].public_key()}\n', f".gitlease/signers/{name}.pub"
        )
    got = fleet.agent("a").acquire(["x"])
    snap = fleet.agent("b").status()
    assert snap.trust.startswith("signed: trust from .gitlease/signers/ (2 files) on main")
    assert snap.find(got.lease_id).verification == "verified"
    fleet.publish_trust("b this is not a key\n", ".gitlease/signers/b.pub")
    with pytest.raises(errors.InvalidRecord) as err:
        fleet.agent("b").status()
    assert ".gitlease/signers/b.pub on main" in str(err.value) and "does not parse" in str(err.value)


# ---------------------------------------------------------------------------------- forged renewal


@pytest.mark.parametrize("as_owner", [True, False], ids=["owner-copied", "owner-replaced"])
@pytest.mark.parametrize("store", ["local", "file", "daemon"])
def test_forged_renewal_by_a_trusted_agent(request, tmp_path, store, as_owner):
    """B, trusted for agent b, pushes version 2 of A's lease: a valid CAS at the git level. Every reader
    reports the lease invalid, its scope stays blocked however old it gets, and A's next renew exits 6."""
    url = None if store == "local" else request.getfixturevalue(f"remote_{store}").url
    fleet = Signed(tmp_path, url)
    a, b, c = fleet.agent("a"), fleet.agent("b"), fleet.agent("c")
    got = a.acquire(["svc"], ttl=60)
    nxt = got.record.next_version(fleet.clock.now(), ttl=3600)
    if not as_owner:  # B claims the lease for itself
        from dataclasses import replace

        nxt = replace(nxt, owner=replace(nxt.owner, agent_id="b", key=b.signer.public_key))
    forged = _forge(b, got.lease_id, got.oid, nxt)
    assert b.store.apply([RefUpdate(id_ref(got.lease_id), forged, got.oid)]).ok
    for reader in (a, b, c, fleet.agent("d", key=None)):
        view = reader.status().find(got.lease_id)
        assert not view.valid and view.state(fleet.clock.now(), 30) == "invalid"
        why = " ".join(view.problems)
        assert ("owner binding broken" in why) if as_owner else ("changes the owner" in why), why
    fleet.clock.advance(10**6)  # whatever its age: never cleared automatically
    with pytest.raises(errors.HeldError) as err:
        c.acquire(["svc/x"])
    assert "invalid" in str(err.value)
    _, blockers, _ = c.can_start(["svc"])
    assert [v.lease_id for v in blockers] == [got.lease_id]
    fleet.clock.advance(-(10**6))
    with pytest.raises(errors.LeaseLost) as err:
        a.renew(got.lease_id)
    assert err.value.exit_code == 6


def test_forged_renewal_cli(tmp_path, remote_file):
    """The same through the real CLI: show exits 5 naming the reason, status flags it, renew exits 6."""
    fleet = Signed(tmp_path, remote_file.url)
    wa, wc = fleet.path("a"), fleet.path("c")
    for w, who in ((wa, "a"), (wc, "c")):
        git(w, "config", "lease.remote", remote_file.url)
        git(w, "config", "lease.agent", who)
        git(w, "config", "lease.signingKey", fleet.keys[who].path)
    res = cli(wa, "acquire", "--scope", "svc")
    assert res.returncode == 0, res.stderr
    lease = res.stdout.split()[2]
    res = cli(wc, "show", lease)
    assert res.returncode == 0 and "verified" in res.stdout and fleet.keys["a"].fingerprint() in res.stdout
    b = fleet.agent("b")
    cur = b.status().find(lease)
    forged = _forge(b, lease, cur.current_oid, cur.record.next_version(cur.record.renewed + 1))
    assert b.store.apply([RefUpdate(id_ref(lease), forged, cur.current_oid)]).ok
    res = cli(wc, "show", lease)
    assert res.returncode == 5 and "does not verify" in res.stderr and "owner binding" in res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    assert "INVALID" in res.stdout and "history:" in res.stdout
    env = json.loads(cli(wc, "show", lease, "--json").stdout)
    assert env["ok"] is False and env["error"]["exitCode"] == 5
    res = cli(wc, "status")
    assert res.returncode == 0 and "INVALID" in res.stdout and "only a gitlease-admin key" in res.stdout
    assert cli(wc, "can-start", "--scope", "svc/deep").returncode == 3
    res = cli(wa, "renew", lease)
    assert res.returncode == 6 and "lost or replaced" in res.stderr


# ------------------------------------------------------------------------- non-owners and reclaims


def test_release_and_renew_by_a_non_owner_are_refused(signed):
    a, b, got, before = not_released_by_another(signed)
    # the same worktree, but configured with another (trusted) key: owner binding refuses it too
    impostor = signed.agent("a", key="b")
    for act in (impostor.release, impostor.renew):
        with pytest.raises(errors.Forbidden) as err:
            act(got.lease_id)
        assert signed.keys["a"].fingerprint() in str(err.value)
    unsigned = signed.agent("a", key=None)
    with pytest.raises(errors.Forbidden):
        unsigned.release(got.lease_id)
    assert a.store.list_refs() == before
    assert _current(b, got.lease_id).valid
    a.release(got.lease_id)


def test_reclaim_needs_an_admin_key_unless_expired(signed):
    a, b, boss = signed.agent("a"), signed.agent("b"), signed.agent("boss")
    live = a.acquire(["live"], ttl=60)
    with pytest.raises(errors.Forbidden) as err:
        b.require_admin("reclaim")
    assert "gitlease-admin" in str(err.value) and signed.keys["b"].fingerprint() in str(err.value)
    with pytest.raises(errors.Forbidden):
        signed.agent("c", key=None).require_admin("force-release")  # no key on a signed store
    with pytest.raises(errors.Forbidden):
        signed.agent("boss", key="eve").require_admin("reclaim")  # a key the trust file does not list
    assert boss.require_admin("reclaim") == f"boss ({signed.keys['boss'].fingerprint()})"
    with pytest.raises(errors.HeldError):
        b.acquire(["live/x"])  # a live lease is never reclaimed by an ordinary acquire
    signed.clock.advance(60 + 31)
    got = b.acquire(["live/x"])  # expired beyond the skew margin: any trusted agent may clear it
    assert got.cleared == (live.lease_id,)
    assert _current(a, got.lease_id).verification == "verified"


def test_require_admin_unsigned_mode(tmp_path):
    fleet = Fleet(tmp_path, None)
    assert fleet.agent("a").require_admin("reclaim") == "unsigned:a"


# --------------------------------------------------------------------------------------------- replay


def test_replay_of_an_old_version_is_detected(signed):
    a, b, c = signed.agent("a"), signed.agent("b"), signed.agent("c")
    got = a.acquire(["svc"], ttl=60)
    signed.clock.advance(10)
    v2 = a.renew(got.lease_id)
    signed.clock.advance(10)
    v3 = a.renew(got.lease_id)
    assert _current(c, got.lease_id).valid  # c has now seen v3
    b.store.ensure_objects([v3.oid])  # b has fetched the lease (and so its history)
    # 1. the id ref moved back to A's own, validly signed v2
    assert b.store.apply([RefUpdate(id_ref(got.lease_id), v2.oid, v3.oid)]).ok
    view = _current(c, got.lease_id)
    assert not view.valid and "replay: the id ref moved back to v2 after v3 was seen" in view.problems
    assert not _current(c, got.lease_id).valid  # and it stays flagged
    with pytest.raises(errors.LeaseLost):
        a.renew(got.lease_id)
    # 2. A's old signed v2 bytes re-used in a new commit on top of v3: caught by every reader, memory or not
    blob = b.store.read([v2.oid])[v2.oid]
    replayed = _forge(b, got.lease_id, v3.oid, v2.record, sig=blob.signature, data=blob.record)
    assert b.store.apply([RefUpdate(id_ref(got.lease_id), replayed, v2.oid)]).ok
    fresh = signed.agent("d", key=None, at="fresh-reader") if signed.url else None
    for reader in [c] + ([fresh] if fresh else []):
        view = _current(reader, got.lease_id)
        assert not view.valid and any("versions must advance by one" in p for p in view.problems), view.problems


def test_released_lease_pushed_back_is_detected(signed):
    a, b, c = signed.agent("a"), signed.agent("b"), signed.agent("c")
    got = a.acquire(["svc"], ttl=3600)
    refs = a.store.list_refs()
    assert c.status().find(got.lease_id).valid
    b.store.ensure_objects(refs.values())  # b has fetched it while it lived
    a.release(got.lease_id)
    assert c.status().find(got.lease_id) is None  # c saw it gone
    # b re-creates the released lease's refs at their old, validly signed objects
    assert b.store.apply([RefUpdate(r, o, None) for r, o in sorted(refs.items())]).ok
    view = c.status().find(got.lease_id)
    assert not view.valid and "reappeared" in " ".join(view.problems)


# ----------------------------------------------------------------------------------- bad signatures


def _signed_with(b: LeaseService, rec: records.Record, how: str) -> tuple[bytes, bytes]:
    data = rec.canonical()
    sig = b.signer.sign(data)
    if how == "tampered":  # a canonical record with a later expiry, under the original signature
        from dataclasses import replace

        data = replace(rec, expires_at=iso(rec.expires + 3600), ttl=rec.ttl + 3600).canonical()
    elif how == "namespace":
        sig = sshsig.sign(b.signer._key, data, "git").encode()
    elif how == "truncated":
        sig = sig[: len(sig) // 2]
    return data, sig


@pytest.mark.parametrize(
    "how,why",
    [
        ("tampered", "signature does not verify"),
        ("namespace", "wrong signature namespace"),
        ("truncated", "malformed signature"),
        ("untrusted", "is not trusted for agent 'eve'"),
    ],
)
def test_bad_signatures_are_invalid_exit_5(tmp_path, remote_file, how, why):
    fleet = Signed(tmp_path, remote_file.url)
    eve = fleet.agent("eve")
    got = None
    if how == "untrusted":
        with pytest.raises(errors.UntrustedWriter):  # the writer knows (issue 21) ...
            eve.acquire(["svc"], ttl=60)
        eve.check_writer = lambda: None  # ... readers must catch it all the same when one is written anyway
        got = eve.acquire(["svc"], ttl=60)
    if got is None:  # a's first version, made badly and pushed as a new lease
        a = fleet.agent("a")
        now = fleet.clock.now()
        owner = records.Owner(task_id="t", agent_id="a", host="h", pid=0, key=a.signer.public_key)
        rec = records.new_record(
            lease_id=records.new_lease_id(now), repo="r", paths=("svc",), workspace_id="w", owner=owner, now=now, ttl=60
        )
        data, sig = _signed_with(a, rec, how)
        oid = _forge(a, rec.lease_id, "", rec, data=data, sig=sig)
        assert a.store.apply([RefUpdate(id_ref(rec.lease_id), oid, None), RefUpdate(scope_ref("svc"), oid, None)]).ok
        lease = rec.lease_id
    else:
        lease = got.lease_id
    w = fleet.path("c")
    git(w, "config", "lease.remote", remote_file.url)
    git(w, "config", "lease.agent", "c")
    git(w, "config", "lease.signingKey", fleet.keys["c"].path)
    res = cli(w, "show", lease)
    assert res.returncode == 5, (res.stdout, res.stderr)
    assert why in res.stderr and "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    res = cli(w, "status")
    assert res.returncode == 0 and "INVALID" in res.stdout and why in res.stdout
    res = cli(w, "acquire", "--scope", "svc")
    assert res.returncode == 3 and "invalid" in res.stderr


@pytest.mark.parametrize(
    "problem,why",
    [
        ("missing", "there is no trust file"),
        ("unparsable", "does not parse: allowed signers line 2"),
        ("binary", "does not parse: not UTF-8"),
    ],
)
def test_trust_file_missing_or_unparsable_exit_5(tmp_path, remote_file, problem, why):
    fleet = Signed(tmp_path, remote_file.url)
    if problem == "missing":
        git(fleet.main, "rm", "-q", TRUST)
        git(fleet.main, "commit", "-q", "-m", "no trust")
        git(fleet.main, "push", "-q", remote_file.url, "HEAD:refs/heads/main")
    else:
        fleet.publish_trust("# ok\nnot a valid line\n" if problem == "unparsable" else b"\xff\xfe\n")
    w = fleet.path("a")
    git(w, "config", "lease.remote", remote_file.url)
    git(w, "config", "lease.signingKey", fleet.keys["a"].path)
    for args in (["status"], ["can-start", "--scope", "x"], ["show", "lease_0000000000000000"]):
        res = cli(w, *args)
        assert res.returncode == 5, (args, res.stderr)
        assert why in res.stderr and "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    env = json.loads(cli(w, "status", "--json").stdout)
    assert env["error"]["exitCode"] == 5 and env["error"]["kind"] == "invalid"
    git(w, "config", "--unset", "lease.signingKey")
    res = cli(w, "status")
    if problem == "missing":  # no key, no trust file: unsigned mode, and it says so
        assert res.returncode == 0 and res.stdout.startswith("unsigned: no trust file")
    else:  # a trust file that is there but broken fails closed for everyone
        assert res.returncode == 5 and why in res.stderr


# -------------------------------------------------------------------------------------- unsigned mode


def test_unsigned_mode_says_so(make_repo):
    a = make_repo("a")
    res = cli(a, "acquire", "--scope", "x")
    assert res.returncode == 0
    res = cli(a, "status")
    assert res.stdout.startswith(
        "unsigned: no trust file (neither .gitlease/allowed_signers nor .gitlease/signers/*.pub on main"
    )
    assert "[unsigned]" in res.stdout
    env = json.loads(cli(a, "status", "--json").stdout)["result"]
    assert env["signed"] is False and env["leases"][0]["verification"] == "unsigned"


def test_signed_lease_read_without_trust_file(tmp_path, remote_file):
    """No trust file on the store: a reader without a key checks the signatures it finds (a bad one is
    invalid) but cannot tell whose key it is; a reader with a key refuses to answer (exit 5)."""
    fleet = Fleet(tmp_path, remote_file.url)
    key = sshsig.generate_key(str(tmp_path / "k"), comment="a")
    repo = Repo.discover(fleet.path("a"))
    a = LeaseService(
        repo, resolve(repo.config, env={}, remote=remote_file.url, agent="a"), clock=fleet.clock, signer=SshSigner(key)
    )
    got = a.acquire(["svc"])  # the happy path reads nothing, so it works without a trust file
    reader = fleet.agent("r")
    snap = reader.status()
    assert not snap.signed_store and snap.trust.startswith("unsigned:")
    view = snap.find(got.lease_id)
    assert view.valid and view.verification == "untrusted" and view.signer == key.fingerprint()
    with pytest.raises(errors.InvalidRecord) as err:
        a.status()
    assert err.value.exit_code == 5 and "no trust file" in str(err.value)
    # a signature that does not verify is invalid even without a trust file
    bad = _forge(a, got.lease_id, got.oid, got.record.next_version(fleet.clock.now()), sig=b"junk")
    assert a.store.apply([RefUpdate(id_ref(got.lease_id), bad, got.oid)]).ok
    assert not reader.status().find(got.lease_id).valid


def test_unsigned_lease_on_a_signed_store_is_invalid(signed):
    got = signed.agent("a", key=None).acquire(["svc"])
    view = _current(signed.agent("c"), got.lease_id)
    assert not view.valid and "unsigned, but this store is signed" in " ".join(view.problems)


def test_stale_status_still_verifies_from_the_cached_trust(tmp_path, remote_file):
    fleet = Signed(tmp_path, remote_file.url)
    a = fleet.agent("a")
    got = a.acquire(["svc"])
    assert a.status().find(got.lease_id).verification == "verified"
    remote_file.path.rename(tmp_path / "gone.git")
    again = fleet.agent("a")
    snap = again.status()
    assert snap.stale and snap.signed_store and "as last read" in snap.trust
    assert snap.find(got.lease_id).verification == "verified"


# ------------------------------------------------------------------------------------------- keygen


def test_keygen_and_a_signed_cli_session(tmp_path, remote_file):
    work = tmp_path / "work"
    git(tmp_path, "init", "-q", str(work))
    res = cli(work, "keygen", "--agent", "codex-worker-4", "--output", str(tmp_path / "keys" / "w4"))
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert (
        out[3] == f"  git lease trust add codex-worker-4 --key {tmp_path / 'keys' / 'w4'}.pub --agents codex-worker-4"
    )
    line = out[4].removeprefix("(or add this line to .gitlease/allowed_signers there: ").removesuffix(")")
    assert line.startswith('codex-worker-4 namespaces="gitlease" ssh-ed25519 ')
    assert oct(os.stat(tmp_path / "keys" / "w4").st_mode & 0o777) == "0o600"
    signer = sshsig.parse_allowed_signers(line)
    key = sshsig.SigningKey.load(tmp_path / "keys" / "w4")
    assert sshsig.allowed(signer, "codex-worker-4", key.public_key(), "gitlease")
    res = cli(work, "keygen", "--agent", "codex-worker-4", "--output", str(tmp_path / "keys" / "w4"))
    assert res.returncode == 1 and "refusing to overwrite" in res.stderr
    res = cli(work, "keygen", "--agent", "admin", "--admin", "--output", str(tmp_path / "keys" / "adm"), "--json")
    assert 'namespaces="gitlease,gitlease-admin"' in json.loads(res.stdout)["result"]["allowedSigners"]

    (work / ".gitlease").mkdir()
    (work / ".gitlease" / "allowed_signers").write_text(line + "\n")
    git(work, "add", ".gitlease")
    git(work, "commit", "-q", "-m", "trust codex-worker-4")
    git(work, "push", "-q", remote_file.url, "HEAD:refs/heads/main")
    git(work, "config", "lease.remote", remote_file.url)
    git(work, "config", "lease.agent", "codex-worker-4")
    git(work, "config", "lease.signingKey", str(tmp_path / "keys" / "w4"))
    res = cli(work, "acquire", "--scope", "services/billing")
    assert res.returncode == 0, res.stderr
    lease = res.stdout.split()[2]
    assert cli(work, "renew", lease).returncode == 0
    res = cli(work, "status")
    assert res.stdout.startswith("signed: trust from .gitlease/allowed_signers on main")
    assert "[unsigned]" not in res.stdout and "INVALID" not in res.stdout
    res = cli(work, "show", lease)
    assert res.returncode == 0
    assert f"signed by {key.fingerprint()} (agent codex-worker-4): verified" in res.stdout
    assert res.stdout.count(": verified") == 2
    assert cli(work, "release", lease).returncode == 0


# ------------------------------------------------------------------------------------------ ssh-agent


@pytest.fixture
def ssh_agent(tmp_path):
    """A real ssh-agent on a socket of ours (it daemonizes; killed by its own pid at the end)."""
    agent_bin, add_bin = shutil.which("ssh-agent"), shutil.which("ssh-add")
    if not agent_bin or not add_bin:
        pytest.skip("OpenSSH ssh-agent not installed")
    sock = tmp_path / "agent.sock"
    out = subprocess.run([agent_bin, "-s", "-a", str(sock)], capture_output=True, text=True, check=True).stdout
    pid = int(out.split("SSH_AGENT_PID=", 1)[1].split(";", 1)[0])
    try:
        yield str(sock), add_bin
    finally:
        os.kill(pid, 15)


def test_ssh_agent_key_signs_like_the_key_file(tmp_path, remote_file, ssh_agent, monkeypatch):
    sock, add_bin = ssh_agent
    fleet = Signed(tmp_path, remote_file.url)
    key = fleet.keys["a"]
    env = dict(os.environ, SSH_AUTH_SOCK=sock)
    subprocess.run([add_bin, "-q", key.path], env=env, check=True, capture_output=True)
    monkeypatch.setenv("SSH_AUTH_SOCK", sock)
    from gitlease.identity.signer import load_signer

    agent_signer = load_signer(key.path + ".pub")  # a public key file: the private half is in the agent
    data = b'{"some":"record"}'
    assert agent_signer.public_key == key.public_key()
    assert agent_signer.sign(data) == SshSigner(key).sign(data)  # Ed25519 is deterministic: same bytes
    assert load_signer("key::" + key.public_key()).sign(data) == agent_signer.sign(data)

    w = fleet.path("a")
    git(w, "config", "lease.remote", remote_file.url)
    git(w, "config", "lease.agent", "a")
    git(w, "config", "lease.signingKey", key.path + ".pub")
    res = cli(w, "acquire", "--scope", "svc", env={"SSH_AUTH_SOCK": sock})
    assert res.returncode == 0, res.stderr
    lease = res.stdout.split()[2]
    res = cli(w, "show", lease, env={"SSH_AUTH_SOCK": sock})
    assert res.returncode == 0 and f"signed by {key.fingerprint()} (agent a): verified" in res.stdout

    # a key the agent does not hold, and no agent at all: clear errors, exit 1, no traceback
    git(w, "config", "lease.signingKey", fleet.keys["b"].path + ".pub")
    res = cli(w, "renew", lease, env={"SSH_AUTH_SOCK": sock})
    assert res.returncode == 1 and "not in the ssh-agent" in res.stderr and "Traceback" not in res.stderr
    res = cli(w, "renew", lease, env={"SSH_AUTH_SOCK": str(tmp_path / "nope.sock")})
    assert res.returncode == 1 and "ssh-agent" in res.stderr and "Traceback" not in res.stderr


def test_damaged_replay_memory_forgets_and_never_crashes(signed):
    import marshal

    from gitlease.identity.replay import Seen

    a, c = signed.agent("a"), signed.agent("c")
    got = a.acquire(["svc"])
    assert c.status().find(got.lease_id).valid
    path = Seen(c.repo.shared_dir(), c.store.name).path
    tag = "gitlease-seen-1"
    damaged = [
        b"not marshal",
        b"",
        marshal.dumps([1, 2]),
        marshal.dumps({got.lease_id: {"v": 1}}),  # the JSON form's shape: not this format
        marshal.dumps((tag, {got.lease_id: ("x", 1, 0)}, {})),
        marshal.dumps((tag, {got.lease_id: (True, "0" * 40, 0.0)}, {})),  # a bool is not a version
        marshal.dumps((tag, {got.lease_id: 7, 3: (1,)}, {got.lease_id: "soon"})),
        marshal.dumps((tag, [], {})),
    ]
    for junk in damaged:
        Path(path).write_bytes(junk)
        assert c.status().find(got.lease_id).valid
        assert Seen(c.repo.shared_dir(), c.store.name).load().get(got.lease_id)["v"] == 1  # rewritten from the read


def test_a_replay_memory_written_by_an_older_gitlease_still_catches_a_rollback(signed):
    """The memory's earlier format (JSON, ``seen-<hash>.json``) is read until the first write replaces it, so
    an upgrade does not forget which version was seen."""
    a, c = signed.agent("a"), signed.agent("c")
    got = a.acquire(["svc"], ttl=60)
    signed.clock.advance(10)
    v2 = a.renew(got.lease_id)
    signed.clock.advance(10)
    v3 = a.renew(got.lease_id)
    from gitlease.identity.replay import Seen

    seen = Seen(c.repo.shared_dir(), c.store.name)
    legacy = Path(seen.path).with_suffix(".json")
    legacy.parent.mkdir(parents=True, exist_ok=True)
    legacy.write_text(json.dumps({got.lease_id: {"v": 3, "oid": v3.oid, "exp": v3.record.expires}}))
    assert not Path(seen.path).exists()
    assert a.store.apply([RefUpdate(id_ref(got.lease_id), v2.oid, v3.oid)]).ok  # the id ref moved back to v2
    view = _current(c, got.lease_id)
    assert not view.valid and "replay: the id ref moved back to v2 after v3 was seen" in view.problems
    assert Path(seen.path).exists() and not legacy.exists()  # rewritten in the new format


def test_oversized_signature_is_reported_not_ignored(signed):
    from gitlease.core.store import MAX_BLOB_BYTES

    a, c = signed.agent("a"), signed.agent("c")
    got = a.acquire(["svc"])
    big = _forge(a, got.lease_id, got.oid, got.record.next_version(signed.clock.now()), sig=b"x" * (MAX_BLOB_BYTES + 1))
    assert a.store.apply([RefUpdate(id_ref(got.lease_id), big, got.oid)]).ok
    view = _current(c, got.lease_id)
    assert not view.valid and "lease.sig is not a file, or over the size limit" in view.problems


# ------------------------------------------------------------------------------- the log verifies too


def test_log_verifies_lease_versions_and_audit_entries(signed):
    from gitlease.ops.sweep import Sweeper, history
    from gitlease.service.audit import AuditLog

    a, b, boss = signed.agent("a"), signed.agent("b"), signed.agent("boss")
    old = a.acquire(["old"], ttl=60)
    live = a.acquire(["live"], ttl=600)
    signed.clock.advance(60 + 31)
    assert b.acquire(["old/x"]).cleared == (old.lease_id,)  # an expired clear by an ordinary agent: audited
    assert Sweeper(boss).force(live.lease_id, action="force-release").outcome == "reclaimed"  # admin: audited
    events = history(boss)
    audit = [e for e in events if e.source == "audit"]
    assert {e.event for e in audit} == {"clear", "force-release"} and all(e.signed for e in audit)
    assert [e.problem for e in events] == [None] * len(events)

    # b (no admin key) writes an entry claiming a forced release, and eve (untrusted) one claiming a clear
    for who, action, rule in (("b", "force-release", "forced"), ("eve", "clear", "expired")):
        svc = signed.agent(who)
        log = AuditLog(svc.store, svc.objects, svc.signer, svc.clock, writer=who)
        assert log.append_with(
            [], {"action": action, "rule": rule, "reason": "forged", "by": who, "leaseId": live.lease_id, "version": 1}
        ).ok
    bad = {e.by: e.problem for e in history(boss) if e.source == "audit" and e.by in ("b", "eve")}
    assert "needs a gitlease-admin key" in bad["b"]
    assert "not trusted for writer 'eve'" in bad["eve"]
    lines = [e.line() for e in history(boss)]
    assert any("INVALID: force-release by rule 'forced' needs a gitlease-admin key" in line for line in lines)


# ------------------------------------------------------------------ memoised verification (trust.ChainMemo)


def test_a_read_verifies_only_versions_it_has_not_verified(signed, monkeypatch):
    a, c = signed.agent("a"), signed.agent("c")
    got = a.acquire(["svc"], ttl=60)
    for _ in range(3):
        signed.clock.advance(10)
        a.renew(got.lease_id)
    calls = []
    real = sshsig.verify
    monkeypatch.setattr(sshsig, "verify", lambda *args: calls.append(1) or real(*args))
    assert _current(c, got.lease_id).valid and len(calls) == 4  # v1..v4, once each
    assert _current(c, got.lease_id).valid and len(calls) == 4  # nothing new: nothing verified again
    signed.clock.advance(10)
    a.renew(got.lease_id)
    view = _current(c, got.lease_id)
    assert view.valid and view.record.version == 5 and len(calls) == 5  # only the new version
    _, history, _ = c.show(got.lease_id)
    assert [h.record.version for h in history] == [5, 4, 3, 2, 1]  # the whole history, from the memo


@pytest.mark.parametrize("how", ["other-key", "unsigned", "version-jump", "scope-changed"])
def test_memo_cannot_be_fooled_by_a_forged_version_on_a_verified_parent(signed, how):
    from dataclasses import replace

    a, b, c = signed.agent("a"), signed.agent("b"), signed.agent("c")
    got = a.acquire(["svc"], ttl=60)
    signed.clock.advance(10)
    v2 = a.renew(got.lease_id)
    assert _current(c, got.lease_id).valid  # c has verified (and memoised) v1 and v2
    nxt = v2.record.next_version(signed.clock.now(), ttl=3600)
    if how == "other-key":  # b signs a v3 that keeps a's owner fields
        forged = _forge(b, got.lease_id, v2.oid, nxt)
    elif how == "unsigned":
        forged = _forge(b, got.lease_id, v2.oid, nxt, sig=b"")
    elif how == "version-jump":  # signed by a's own key (a stolen key would do this), skipping versions
        forged = _forge(a, got.lease_id, v2.oid, replace(nxt, version=7))
    else:
        forged = _forge(a, got.lease_id, v2.oid, replace(nxt, paths=("other",)))
    forger = b if how in ("other-key", "unsigned") else a
    assert forger.store.apply([RefUpdate(id_ref(got.lease_id), forged, v2.oid)]).ok
    view = _current(c, got.lease_id)
    assert not view.valid, how
    assert not _current(c, got.lease_id).valid  # and a forged version is never memoised as verified


def test_memo_sees_a_changed_trust_file(signed):
    a, c = signed.agent("a"), signed.agent("c")
    got = a.acquire(["svc"], ttl=60)
    assert _current(c, got.lease_id).valid
    signed.publish_trust(f'c namespaces="gitlease" {signed.keys["c"].public_key()}\n')  # a is no longer trusted
    view = _current(signed.agent("c"), got.lease_id)  # a new reader reads the new trust file
    assert not view.valid and any("not trusted" in p for p in view.problems), view.problems
