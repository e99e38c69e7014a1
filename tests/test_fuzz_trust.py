"""Fuzzing the trust file (``.gitlease/allowed_signers``) and the signatures checked against it.

Properties:
* parsing never raises anything but InvalidRecord, with one line naming the file and the line;
* never more trust than OpenSSH: whenever our parser accepts a file and says a key is allowed for a principal
  in namespace gitlease, the real ``ssh-keygen -Y verify`` with that file agrees (differential, for a sample);
* end to end (a real repository, a signed lease, the trust file committed on the default branch): a file that
  does not parse makes ``snapshot``/``git lease status`` fail with exit 5 (and one JSON envelope with --json),
  and a lease is only ever "verified" when the file allows its key for its agent;
* a signature with a flipped bit, over flipped data, in another namespace or with another hash algorithm never
  verifies, and never makes a version "verified".
"""

from __future__ import annotations

import base64
import json
import os
import subprocess

import pytest
from conftest import cli, git
from hypothesis import given
from hypothesis import strategies as st
from test_sshsig import (
    SSH_KEYGEN,
    in_process_key,
    make_key,
    needs_ssh_keygen,
    pack_blob,
    pub_of,
    split_blob,
    ssh_string,
    unarmor,
)

from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.errors import InvalidRecord
from gitlease.core.record import Owner, new_record
from gitlease.core.repo import Repo
from gitlease.identity import sshsig
from gitlease.identity.signer import SshSigner
from gitlease.identity.sshsig import wire
from gitlease.identity.trust import INVALID, VERIFIED, Trust, _parse
from gitlease.service.leases import LeaseService
from testing.fuzz import event, examples, fuzz_settings, tally  # noqa: F401  (tally: an autouse fixture)

NS = "gitlease"
KA, KB = in_process_key(7), in_process_key(8)
A, B = KA.public_key(), KB.public_key()


@pytest.fixture(scope="module")
def other_keys(tmp_path_factory):
    """Real RSA and ECDSA public keys (ssh-keygen made), for lines of other key types."""
    if not os.path.exists(SSH_KEYGEN):
        return ["ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQ"]
    d = tmp_path_factory.mktemp("otherkeys")
    return [pub_of(make_key(d, "rsa", "rsa")), pub_of(make_key(d, "ec", "ecdsa"))]


# ------------------------------------------------------------------------------------- strategies


def _mangled(key: str) -> list[str]:
    kt, b64 = key.split()
    blob = base64.b64decode(b64)
    return [
        f"{kt} {b64[:-4]}",
        f"{kt} {b64[:20]}",
        f"{kt} {b64}!",
        f"{kt} {b64.rstrip('=')}",
        f"{kt} ={b64}",
        f"ssh-rsa {b64}",
        f"ssh-ed25519 {base64.b64encode(blob + b'x').decode()}",
        f"ssh-ed25519 {base64.b64encode(blob[:-1]).decode()}",
        "ssh-ed25519",
        f"SSH-ED25519 {b64}",
        f"ssh-ed25519\t{b64}",
        f"ssh-ed25519  {b64}",
        f"ssh-ed25519 {b64[:30]}\n{b64[30:]}",
        f"ssh-ed25519 {b64.lower()}",
        f"{kt}\u00a0{b64}",
    ]


def trust_lines(other_keys):
    principals = st.one_of(
        st.sampled_from(
            [
                "agent-a",
                "agent-b",
                "*",
                "agent-?",
                "!agent-a,*",
                "agent-a,agent-b",
                '"agent-a"',
                '"agent a"',
                '"agent-a',
                'agent"a',
                "\u00fc",
                "agent-a\u00a0",
                "*@ci",
                "agent-a,",
                ",agent-a",
                "!*",
                "agent-" + "a" * 1100,
                "Agent-A",
            ]
        ),
        st.text(max_size=12),
    )
    option = st.one_of(
        st.sampled_from(
            [
                "cert-authority",
                'namespaces="gitlease"',
                'namespaces="git"',
                'namespaces="gitlease,git"',
                'namespaces="*"',
                'namespaces="!gitlease,*"',
                'namespaces=""',
                'namespaces="git?ease"',
                'valid-after="20200101"',
                'valid-before="20990101Z"',
                'valid-before="20200101"',
                'valid-after="20990101"',
                'valid-after="20200101120000UTC"',
                'NAMESPACES="gitlease"',
                "namespaces=gitlease",
                'namespaces="gitlease',
                'valid-after="2020"',
                'valid-after="20201301"',
                "no-touch-required",
                'namespaces="a\\"b"',
                "cert-authority,",
                ",cert-authority",
                'namespaces="gitlease"x',
            ]
        ),
        st.text(max_size=8),
    )
    options = st.lists(option, max_size=3).map(",".join)
    key = st.one_of(st.sampled_from([A, A, B, *other_keys]), st.sampled_from(_mangled(A)), st.text(max_size=20))
    comment = st.one_of(
        st.just(""), st.sampled_from(["agent a's laptop", "# not a comment", '"', "\u202e"]), st.text(max_size=10)
    )
    sep = st.one_of(st.just(" "), st.sampled_from(["  ", "\t", "\r", "\u00a0", ""]))
    entry = st.builds(
        lambda p, s1, o, s2, k, s3, c: p + s1 + (o + s2 if o else "") + k + (s3 + c if c else ""),
        principals,
        sep,
        options,
        sep,
        key,
        sep,
        comment,
    )
    other = st.one_of(
        st.sampled_from(["", "   ", "# trusted agents", "#", "  # indented comment", "\t"]), st.text(max_size=40)
    )
    return st.one_of(entry, entry, entry, other)


def clean_lines(other_keys):
    """Lines that parse (mostly): the options and principals people write."""
    principals = st.sampled_from(
        ["agent-a", "agent-b", "*", "agent-?", "!agent-a,*", "agent-a,agent-b", '"agent-a"', "agent-*,!agent-b", "x"]
    )
    option = st.sampled_from(
        [
            "cert-authority",
            'namespaces="gitlease"',
            'namespaces="git"',
            'namespaces="*"',
            'namespaces="gitlease,git"',
            'namespaces="!gitlease,*"',
            'namespaces="git?ease"',
            'valid-after="20200101"',
            'valid-before="20990101Z"',
            'valid-before="20200101"',
            'valid-after="20990101"',
            'NAMESPACES="gitlease"',
        ]
    )
    options = st.lists(option, max_size=2, unique=True).map(",".join)
    key = st.sampled_from([A, A, B, *other_keys])
    entry = st.builds(
        lambda p, o, k, c: " ".join(x for x in (p, o, k, c) if x),
        principals,
        options,
        key,
        st.sampled_from(["", "laptop", "agent a's key"]),
    )
    return st.one_of(entry, entry, entry, entry, st.sampled_from(["", "# trusted agents", "  "]))


def _join(lines, eol, bom):
    return ("\ufeff" if bom else "") + eol.join(lines) + (eol if lines else "")


def clean_files(other_keys):
    return st.builds(
        _join,
        st.lists(clean_lines(other_keys), min_size=1, max_size=4),
        st.sampled_from(["\n", "\n", "\r\n"]),
        st.just(False),
    ).map(str.encode)


def trust_files(other_keys):
    def join(lines, eol, bom):
        return ("\ufeff" if bom else "") + eol.join(lines) + (eol if lines else "")

    text = st.builds(
        join, st.lists(trust_lines(other_keys), max_size=5), st.sampled_from(["\n", "\r\n", "\r"]), st.booleans()
    )
    raw = st.one_of(
        text.map(lambda t: t.encode("utf-8", "surrogatepass")),
        text.map(lambda t: t.encode("utf-16")),
        st.binary(max_size=120),
    )
    clean = clean_files(other_keys)
    mixed = st.builds(lambda c, t: c + t.encode("utf-8", "surrogatepass"), clean, text)
    return st.one_of(raw, text.map(lambda t: t.encode("utf-8", "surrogatepass")), mixed, clean, clean, clean)


def parse_outcome(data: bytes) -> tuple[sshsig.AllowedSigner, ...] | None:
    """Our parse of a trust file, or None (InvalidRecord: one line naming the file and the line)."""
    try:
        return _parse(data, ".gitlease/allowed_signers on main")
    except InvalidRecord as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith("trust file .gitlease/allowed_signers on main does not parse: ")
        assert exc.exit_code == 5
        return None


# ------------------------------------------------------------------------------------------- parsing


def test_fuzz_trust_file_parsing(other_keys):
    check_parsing(other_keys, examples(400, 20000))


def check_parsing(other_keys, examples):
    @fuzz_settings(examples)
    @given(trust_files(other_keys), st.sampled_from(["agent-a", "agent-b", "x", "\u00fc"]))
    def prop(data, principal):
        signers = parse_outcome(data)
        event("parsed" if signers is not None else "refused")
        if signers is None:
            return
        trust = Trust(signers, "fuzz")
        for key in (A, B):
            ok = trust.trusted_for(principal, key, 1_800_000_000)
            # only a line listing that very key (plain, not cert-authority) can vouch for it
            assert not ok or any(s.key == key and not s.cert_authority for s in signers)
        assert trust.trusted_for(principal, None, 0) is False

    prop()


def test_huge_trust_file_parses_or_refuses_in_bounded_time():
    line = f'agent-a namespaces="gitlease" {A} laptop\n'
    big = (line * 15000).encode()  # about 1.3 MB
    signers = parse_outcome(big)
    assert signers is not None and len(signers) == 15000
    assert parse_outcome(big + b"agent-b ssh-ed25519 AAAA\n") is None


@needs_ssh_keygen
def test_fuzz_trust_file_against_ssh_keygen(tmp_path, other_keys):
    """Differential: when we trust KA for a principal, OpenSSH does too (never more trust than ssh-keygen)."""
    check_against_ssh_keygen(tmp_path, other_keys, examples(50, 3000))


def check_against_ssh_keygen(tmp_path, other_keys, examples):
    data_file = tmp_path / "data"
    data_file.write_bytes(b"lease record bytes")
    sig_file = tmp_path / "data.sig"
    sig_file.write_text(sshsig.sign(KA, b"lease record bytes", NS))
    allowed_file = tmp_path / "allowed_signers"

    clean = clean_files(other_keys)

    @fuzz_settings(examples)
    @given(st.one_of(clean, clean, trust_files(other_keys)), st.sampled_from(["agent-a", "agent-b", "x"]))
    def prop(data, principal):
        signers = parse_outcome(data)
        if signers is None:
            event("ours refuses")
            return
        ours = sshsig.allowed(signers, principal, A, NS)
        allowed_file.write_bytes(data)
        res = subprocess.run(
            [SSH_KEYGEN, "-Y", "verify", "-f", str(allowed_file), "-I", principal, "-n", NS, "-s", str(sig_file)],
            input=b"lease record bytes",
            capture_output=True,
            timeout=30,
        )
        theirs = res.returncode == 0
        event(f"ours={ours} ssh-keygen={theirs}")
        if ours:
            assert theirs, (data, principal, res.stderr)

    prop()


# ------------------------------------------------------------------------------------ end to end


@pytest.fixture
def signed_repo(make_repo, tmp_path):
    """A repository (local store) whose agent-a signs with a key file; one lease acquired."""
    r = make_repo("signed")
    key = sshsig.generate_key(str(tmp_path / "key_a"), comment="agent-a")
    (r / ".gitlease").mkdir()
    (r / ".gitlease" / "allowed_signers").write_text(f'agent-a namespaces="gitlease" {key.public_key()}\n')
    git(r, "add", ".gitlease")
    git(r, "commit", "-q", "-m", "trust")
    git(r, "config", "lease.signingKey", str(tmp_path / "key_a"))
    git(r, "config", "lease.agent", "agent-a")
    svc = service(r, key)
    lease = svc.acquire(["svc"], ttl=3600).lease_id
    return r, key, lease


def service(r, key):
    repo = Repo.discover(r)
    return LeaseService(repo, resolve(repo.config, env={}), signer=SshSigner(key))


def commit_trust(r, data: bytes):
    (r / ".gitlease" / "allowed_signers").write_bytes(data)
    git(r, "add", ".gitlease/allowed_signers")
    git(r, "commit", "-q", "--allow-empty", "-m", "trust")


def test_fuzz_trust_file_end_to_end(signed_repo, other_keys):
    check_end_to_end(signed_repo, other_keys, examples(30, 1000))


def check_end_to_end(signed_repo, other_keys, examples):
    r, key, lease = signed_repo
    mine = key.public_key()
    keys = st.sampled_from([mine, mine, B])
    clean = clean_files(other_keys)

    @fuzz_settings(examples)
    @given(st.one_of(clean, clean, trust_files(other_keys)), keys)
    def prop(data, which):
        data = data.replace(A.encode(), which.encode())  # lines naming "A" name this lease's key (or B)
        commit_trust(r, data)
        signers = parse_outcome(data)
        svc = service(r, key)
        try:
            snap = svc.snapshot(use_cache=False)
        except InvalidRecord as exc:
            event("exit 5")
            assert signers is None and "does not parse" in exc.message and exc.exit_code == 5
            return
        assert signers is not None, data
        view = snap.find(lease)
        trusted = sshsig.allowed(signers, "agent-a", mine, NS)
        event(f"{view.verification}")
        assert view.verification == (VERIFIED if trusted else INVALID)
        assert view.valid == trusted  # an untrusted lease is invalid: it blocks, and is held by no one

    prop()


def test_fuzz_trust_file_cli_json(signed_repo, other_keys):
    """A sample through the real ``git lease status --json``: one JSON object, exit 0 or 5, no traceback."""
    r, key, lease = signed_repo

    @fuzz_settings(4)
    @given(trust_files(other_keys))
    def prop(data):
        data = data.replace(A.encode(), key.public_key().encode())
        commit_trust(r, data)
        res = cli(r, "status", "--json")
        assert "Traceback" not in res.stderr
        doc = json.loads(res.stdout)
        if parse_outcome(data) is None:
            assert res.returncode == 5 and doc["ok"] is False and doc["error"]["kind"] == "invalid"
            assert doc["error"]["exitCode"] == 5 and "does not parse" in doc["error"]["message"]
        else:
            assert res.returncode == 0 and doc["ok"] is True

    prop()


# ------------------------------------------------------------------------------------------ signatures

DATA = new_record(
    lease_id="lease_0000000000aaaaaa",
    repo="r",
    paths=("svc",),
    workspace_id="w",
    owner=Owner(task_id="t", agent_id="agent-a", host="h", pid=0, key=A),
    now=FakeClock().now(),
    ttl=60,
)
GOOD_SIG = sshsig.sign(KA, DATA.canonical(), NS)
TRUST_A = Trust(tuple(sshsig.parse_allowed_signers(f'agent-a namespaces="gitlease" {A}\n')), "fuzz")


def test_the_good_signature_verifies():
    assert TRUST_A.check_version(DATA, DATA.canonical(), GOOD_SIG.encode(), 0).status == VERIFIED


@fuzz_settings(300)
@given(st.data())
def test_fuzz_bit_flips_never_verify(data):
    """One or more bit flips in the record bytes, the signature blob or its armor: never verified."""
    where = data.draw(st.sampled_from(["record", "blob", "armor"]))
    rec_bytes, sig = DATA.canonical(), GOOD_SIG
    flips = data.draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=3, unique=True))
    if where == "record":
        b = bytearray(rec_bytes)
        for f in flips:
            b[f % len(b)] ^= 1 << (f % 8)
        changed = bytes(b) != rec_bytes
        rec_bytes = bytes(b)
    elif where == "blob":
        blob = bytearray(unarmor(sig))
        for f in flips:
            blob[f % len(blob)] ^= 1 << (f % 8)
        changed = bytes(blob) != unarmor(sig)
        b64 = base64.b64encode(bytes(blob)).decode()
        sig = (
            "-----BEGIN SSH SIGNATURE-----\n"
            + "\n".join(b64[i : i + 70] for i in range(0, len(b64), 70))
            + "\n-----END SSH SIGNATURE-----\n"
        )
    else:
        b = bytearray(sig.encode())
        for f in flips:
            b[f % len(b)] ^= 1 << (f % 8)
        changed = "".join(bytes(b).decode("latin-1").split()) != "".join(sig.split())
        sig = bytes(b).decode("latin-1")
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(sig))))
    if cut is not None:
        sig, changed = sig[:cut], changed or cut < len(sig.rstrip())
    check = TRUST_A.check_version(DATA, rec_bytes, sig.encode("latin-1"), 0)
    if changed:
        assert check.status == INVALID and check.problem, (where, flips, cut)
    try:
        sshsig.verify(sig, rec_bytes, NS)
        assert not changed
    except InvalidRecord:
        pass


def _resigned(namespace: bytes, hash_alg: bytes, digest_of: str = "sha512", data: bytes | None = None) -> str:
    """An SSHSIG blob signed for real by KA, with any namespace and hash algorithm name in it."""
    import hashlib

    data = DATA.canonical() if data is None else data
    digest = getattr(hashlib, digest_of)(data).digest()
    to_sign = wire._signed_data(namespace, b"", hash_alg, digest)
    sig_blob = ssh_string(b"ssh-ed25519") + ssh_string(KA._private.sign(to_sign))
    version, fields = split_blob(unarmor(GOOD_SIG))
    return (
        wire._SIG_BEGIN
        + "\n"
        + base64.b64encode(pack_blob(version, [fields[0], namespace, b"", hash_alg, sig_blob])).decode()
        + "\n"
        + wire._SIG_END
        + "\n"
    )


@fuzz_settings(200)
@given(
    st.one_of(
        st.sampled_from(
            [
                b"gitlease",
                b"gitlease-admin",
                b"git",
                b"file",
                b"",
                b"Gitlease",
                b"gitlease\0",
                b"gitlease ",
                "gitl\u00e9ase".encode(),
            ]
        ),
        st.binary(max_size=12),
    ),
    st.one_of(
        st.sampled_from(
            [b"sha512", b"sha256", b"sha1", b"md5", b"SHA512", b"sha512\0", b"sha384", b"sha3_512", b"", b"sha512 "]
        ),
        st.binary(max_size=8),
    ),
    st.sampled_from(["sha512", "sha256", "sha1", "sha3_512"]),
)
def test_fuzz_namespace_and_hash_algorithm(namespace, hash_alg, digest_of):
    """Real signatures by the owner key, made over another namespace or hash algorithm: they verify only in the
    namespace gitlease with sha256/sha512 over the record's own digest."""
    sig = _resigned(namespace, hash_alg, digest_of)
    expect = namespace == b"gitlease" and hash_alg in (b"sha512", b"sha256") and hash_alg.decode() == digest_of
    check = TRUST_A.check_version(DATA, DATA.canonical(), sig.encode(), 0)
    assert (check.status == VERIFIED) == expect, check
    try:
        assert sshsig.verify(sig, DATA.canonical(), NS) == A and expect
    except InvalidRecord as exc:
        assert not expect and "\n" not in str(exc)


def test_a_signature_for_the_admin_namespace_is_not_a_lease_signature():
    sig = sshsig.sign(KA, DATA.canonical(), "gitlease-admin")
    assert TRUST_A.check_version(DATA, DATA.canonical(), sig.encode(), 0).status == INVALID


# ------------------------------------------------------------------------------------ the server hook


@pytest.fixture
def guarded_signed(tmp_path, origin):
    """A bare remote with the server hook; an admin clone that commits trust files; agent-a's signing clone."""
    bare = origin.bare
    assert cli(bare, "install-hooks", "--server").returncode == 0
    admin, a = origin("admin"), origin("a")
    key = sshsig.generate_key(str(tmp_path / "key_a"), comment="agent-a")
    git(a, "config", "lease.signingKey", str(tmp_path / "key_a"))
    git(a, "config", "lease.agent", "agent-a")
    (admin / ".gitlease").mkdir()
    return bare, admin, a, key


def test_fuzz_trust_file_on_the_server(guarded_signed, other_keys):
    """The pre-receive hook reads the trust file on the server's HEAD: a signed acquire lands only when that file
    parses and trusts the key for the agent; an unparsable file refuses every lease push (exit 5 in the hook)."""
    bare, admin, a, key = guarded_signed
    clean = clean_files(other_keys)

    @fuzz_settings(2)
    @given(st.one_of(clean, clean, trust_files(other_keys)))
    def prop(data):
        data = data.replace(A.encode(), key.public_key().encode())
        (admin / ".gitlease" / "allowed_signers").write_bytes(data)
        git(admin, "add", ".gitlease/allowed_signers")
        git(admin, "commit", "-q", "--allow-empty", "-m", "trust")
        git(admin, "push", "-q", "origin", "HEAD:main")
        signers = parse_outcome(data)
        res = cli(a, "acquire", "--scope", "svc", "--json")
        assert "Traceback" not in res.stderr
        doc = json.loads(res.stdout)
        granted = signers is not None and sshsig.allowed(signers, "agent-a", key.public_key(), NS)
        event(f"granted={granted}")
        assert doc["ok"] is granted, (data, res.stderr)
        if granted:
            assert cli(a, "release", doc["result"]["leaseId"]).returncode == 0
        else:
            assert res.returncode == 1 and "hook declined" in res.stderr or "refused" in res.stderr, res.stderr
            if signers is None:
                assert "does not parse" in res.stderr
        assert git(bare, "for-each-ref", "refs/leases/") == ""

    prop()


def test_a_broken_trust_file_on_the_server_can_still_be_fixed_by_a_push(guarded_signed):
    """Regression (found by fuzzing): once a trust file that does not parse was on the server's HEAD, the
    pre-receive hook refused every push (exit 5), the push fixing the file too, and it cannot be skipped.
    Now lease pushes are refused, branch pushes are checked against every lease with no claim honoured."""
    bare, admin, a, key = guarded_signed
    good = f'agent-a namespaces="gitlease" {key.public_key()}\n'.encode()
    trust = admin / ".gitlease" / "allowed_signers"

    def publish(data):
        trust.write_bytes(data)
        git(admin, "add", ".gitlease/allowed_signers")
        git(admin, "commit", "-q", "-m", "trust")
        return subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=admin, capture_output=True, text=True)

    assert publish(good).returncode == 0
    res = cli(a, "acquire", "--scope", "svc", "--json")
    assert res.returncode == 0, res.stderr
    lease = json.loads(res.stdout)["result"]["leaseId"]
    assert publish(good + b"agent-b ssh-ed25519 AAAA\n").returncode == 0  # HEAD's trust was still good
    res = cli(a, "acquire", "--scope", "other")
    assert res.returncode == 1 and "does not parse" in res.stderr
    git(a, "pull", "-q", "--rebase", "origin", "main")
    (a / "svc").mkdir()
    (a / "svc" / "x").write_text("x\n")
    git(a, "add", "svc/x")
    # signed with the lease's owner key (also when rebased): on a signed store only such a commit's claim
    # counts (issue 16)
    for k, v in (("gpg.format", "ssh"), ("user.signingKey", str(key.path)), ("commit.gpgSign", "true")):
        git(a, "config", k, v)
    git(a, "commit", "-q", "--no-verify", "-m", f"work\n\nLease: {lease}")
    res = subprocess.run(["git", "push", "--no-verify", "origin", "HEAD:main"], cwd=a, capture_output=True, text=True)
    assert res.returncode == 1 and "no lease claim is honoured until the trust file is fixed" in res.stderr
    git(admin, "pull", "-q", "--rebase", "origin", "main")
    assert publish(good).returncode == 0  # the fix lands
    git(a, "pull", "-q", "--rebase", "origin", "main")
    res = subprocess.run(
        ["git", "push", "-q", "--no-verify", "origin", "HEAD:main"], cwd=a, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr  # and the claim counts again
    assert cli(a, "release", lease).returncode == 0
