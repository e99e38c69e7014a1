"""gitlease.identity.sshsig against the real ssh-keygen (both directions), its failure modes, allowed_signers, fuzzing."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import stat
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitlease.core.errors import ConfigError, InvalidRecord
from gitlease.identity import sshsig
from gitlease.identity.sshsig import patterns

SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
needs_ssh_keygen = pytest.mark.skipif(not os.path.exists(SSH_KEYGEN), reason="OpenSSH ssh-keygen not installed")
NS = "gitlease"


# --- helpers ----------------------------------------------------------------------------------------------


def keygen(*args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([SSH_KEYGEN, *args], input=input, capture_output=True, timeout=60)
    if check and res.returncode != 0:
        raise AssertionError(f"ssh-keygen {' '.join(args)} failed ({res.returncode}): {res.stderr.decode()}")
    return res


def make_key(
    tmp_path,
    name: str = "id",
    key_type: str = "ed25519",
    passphrase: str = "",
    comment: str = "someone@example.com",
    *extra: str,
):
    path = tmp_path / name
    args = ["-q", "-t", key_type, "-N", passphrase, "-C", comment, "-f", str(path), *extra]
    if key_type == "rsa":
        args += ["-b", "1024"]  # small: speed only, never used to sign anything that matters
    if passphrase:
        args += ["-a", "1"]  # few KDF rounds: speed only
    keygen(*args)
    return path


def ssh_sign(tmp_path, key_path, data: bytes, namespace: str = NS, *options: str) -> str:
    msg = tmp_path / "message"
    msg.write_bytes(data)
    sig = tmp_path / "message.sig"
    if sig.exists():
        sig.unlink()
    opts = [x for o in options for x in ("-O", o)]
    keygen("-Y", "sign", "-f", str(key_path), "-n", namespace, *opts, str(msg))
    return sig.read_text()


def ssh_verify(
    tmp_path, allowed_text: str, principal: str, armored: str, data: bytes, namespace: str = NS, *options: str
) -> subprocess.CompletedProcess:
    allowed_file = tmp_path / "allowed_signers"
    allowed_file.write_text(allowed_text)
    sig = tmp_path / "check.sig"
    sig.write_text(armored)
    opts = [x for o in options for x in ("-O", o)]
    return keygen(
        "-Y",
        "verify",
        "-f",
        str(allowed_file),
        "-I",
        principal,
        "-n",
        namespace,
        "-s",
        str(sig),
        *opts,
        input=data,
        check=False,
    )


def pub_of(path) -> str:
    """'ssh-ed25519 <b64>' of an ssh-keygen .pub file (comment dropped)."""
    return " ".join((path.parent / (path.name + ".pub")).read_text().split()[:2])


def keygen_fingerprint(path) -> str:
    return keygen("-lf", str(path)).stdout.decode().split()[1]


def unarmor(armored: str) -> bytes:
    lines = armored.strip().splitlines()
    return base64.b64decode("".join(lines[1:-1]))


def armor(blob: bytes) -> str:
    b64 = base64.b64encode(blob).decode()
    body = "\n".join(b64[i : i + 70] for i in range(0, len(b64), 70))
    return f"-----BEGIN SSH SIGNATURE-----\n{body}\n-----END SSH SIGNATURE-----\n"


def ssh_string(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


def split_blob(blob: bytes) -> tuple[int, list[bytes]]:
    """(version, [public key, namespace, reserved, hash alg, signature]) of an SSHSIG blob."""
    assert blob[:6] == b"SSHSIG"
    version, pos, fields = int.from_bytes(blob[6:10], "big"), 10, []
    for _ in range(5):
        n = int.from_bytes(blob[pos : pos + 4], "big")
        fields.append(blob[pos + 4 : pos + 4 + n])
        pos += 4 + n
    assert pos == len(blob)
    return version, fields


def pack_blob(version: int, fields: list[bytes]) -> bytes:
    return b"SSHSIG" + version.to_bytes(4, "big") + b"".join(ssh_string(f) for f in fields)


def in_process_key(seed_byte: int = 1) -> sshsig.SigningKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return sshsig.SigningKey(Ed25519PrivateKey.from_private_bytes(bytes([seed_byte]) * 32), "fuzz@example")


def raises_invalid(armored, data: bytes = b"payload", namespace: str = NS) -> str:
    with pytest.raises(InvalidRecord) as info:
        sshsig.verify(armored, data, namespace)
    msg = str(info.value)
    assert "\n" not in msg and info.value.exit_code == 5
    return msg


# --- keys -------------------------------------------------------------------------------------------------


@needs_ssh_keygen
def test_generate_key_writes_files_ssh_keygen_reads(tmp_path):
    path = tmp_path / "lease_key"
    key = sshsig.generate_key(str(path), "agent@build-7")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert (tmp_path / "lease_key.pub").read_text() == key.public_line() + "\n"
    assert key.public_line() == key.public_key() + " agent@build-7"
    assert key.public_key().startswith("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI")
    # ssh-keygen parses our private key file and derives the same public key and fingerprint
    assert keygen("-y", "-f", str(path)).stdout.decode().split()[:2] == key.public_key().split()
    assert keygen_fingerprint(path) == key.fingerprint()
    assert keygen_fingerprint(str(path) + ".pub") == key.fingerprint()
    again = sshsig.SigningKey.load(path)
    assert (again.public_key(), again.comment, again.fingerprint()) == (
        key.public_key(),
        "agent@build-7",
        key.fingerprint(),
    )


def test_generate_key_refuses_to_overwrite(tmp_path):
    existing = tmp_path / "key"
    existing.write_text("precious")
    with pytest.raises(ConfigError, match="refusing to overwrite .*key"):
        sshsig.generate_key(existing, "x")
    assert existing.read_text() == "precious"
    assert not (tmp_path / "key.pub").exists()

    (tmp_path / "other.pub").write_text("precious pub")
    with pytest.raises(ConfigError, match=r"refusing to overwrite .*other\.pub"):
        sshsig.generate_key(tmp_path / "other", "x")
    assert not (tmp_path / "other").exists()
    assert (tmp_path / "other.pub").read_text() == "precious pub"


def test_generate_key_bad_directory_and_comment(tmp_path):
    with pytest.raises(ConfigError, match="cannot write"):
        sshsig.generate_key(tmp_path / "missing" / "key", "x")
    with pytest.raises(ConfigError, match="comment"):
        sshsig.generate_key(tmp_path / "key", "two\nlines")
    assert not (tmp_path / "key").exists()


@needs_ssh_keygen
def test_load_ssh_keygen_key(tmp_path):
    path = make_key(tmp_path, comment="dev@laptop")
    key = sshsig.SigningKey.load(str(path))
    assert key.fingerprint() == keygen_fingerprint(path)
    assert key.public_line() == (tmp_path / "id.pub").read_text().strip()
    assert key.public_key() == pub_of(path)
    assert key.comment == "dev@laptop"
    assert sshsig.fingerprint_of((tmp_path / "id.pub").read_text()) == key.fingerprint()
    assert sshsig.fingerprint_of(key.public_key()) == key.fingerprint()
    secret_lines = [line for line in path.read_text().splitlines() if "-----" not in line]
    assert not any(line in repr(key) for line in secret_lines)


def _load_error(path) -> str:
    with pytest.raises(ConfigError) as info:
        sshsig.SigningKey.load(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    if os.path.isfile(path):  # no key material in the message
        assert not any(len(line) > 8 and line in msg for line in open(path, errors="replace").read().splitlines())
    return msg


@needs_ssh_keygen
def test_load_encrypted_key_is_config_error(tmp_path):
    msg = _load_error(make_key(tmp_path, passphrase="correct horse"))
    assert "encrypted" in msg and "passphrase" in msg


@needs_ssh_keygen
def test_load_rsa_and_ecdsa_keys_are_config_errors(tmp_path):
    assert "unsupported key type 'ssh-rsa'" in _load_error(make_key(tmp_path, "rsa", "rsa"))
    assert "unsupported key type 'ecdsa-sha2-nistp256'" in _load_error(make_key(tmp_path, "ec", "ecdsa"))
    assert "not an OpenSSH-format private key" in _load_error(make_key(tmp_path, "pem", "rsa", "", "c", "-m", "PEM"))


@needs_ssh_keygen
def test_load_bad_files_are_config_errors(tmp_path):
    assert "no such file" in _load_error(tmp_path / "nope")
    assert "directory" in _load_error(tmp_path)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(os.urandom(300))
    assert "not an OpenSSH private key" in _load_error(garbage)
    text = tmp_path / "text"
    text.write_text("hello\n")
    assert "not an OpenSSH private key" in _load_error(text)
    good = make_key(tmp_path)
    assert "public key" in _load_error(str(good) + ".pub")
    lines = good.read_text().splitlines()
    truncated = tmp_path / "truncated"
    truncated.write_text("\n".join(lines[:3] + lines[-1:]) + "\n")
    assert "corrupt key file" in _load_error(truncated)
    no_end = tmp_path / "no_end"
    no_end.write_text("\n".join(lines[:-1]) + "\n")
    assert "corrupt key file" in _load_error(no_end)
    for offset in (-30, -70):  # a byte of the stored public half, then of the seed
        flipped = tmp_path / f"flipped{offset}"
        blob = bytearray(base64.b64decode("".join(lines[1:-1])))
        blob[offset] ^= 0x01
        b64 = base64.b64encode(bytes(blob)).decode()
        flipped.write_text(f"{lines[0]}\n{b64}\n{lines[-1]}\n")
        assert "corrupt key file" in _load_error(flipped)


def test_load_unreadable_file(tmp_path):
    assert "cannot read (File name too long)" in _load_error(tmp_path / ("x" * 300))
    with pytest.raises(ConfigError, match=r"cannot read \(invalid path\)"):
        sshsig.SigningKey.load(str(tmp_path / "nul\0key"))
    with pytest.raises(ConfigError, match="invalid path"):
        sshsig.generate_key(str(tmp_path / "nul\0key"), "x")
    if os.geteuid() != 0:  # root reads any file
        path = tmp_path / "locked"
        path.write_text("x")
        path.chmod(0)
        assert "cannot read (Permission denied)" in _load_error(path)


# --- interop ----------------------------------------------------------------------------------------------


@needs_ssh_keygen
@pytest.mark.parametrize("data", [b"", b"lease version 7\n", bytes(range(256)) * 40])
def test_ssh_keygen_verifies_our_signature(tmp_path, data):
    key = sshsig.generate_key(tmp_path / "k", "agent@host")
    armored = sshsig.sign(key, data, NS)
    allowed_text = f'agent@example.com namespaces="{NS}" {key.public_key()}\n'
    res = ssh_verify(tmp_path, allowed_text, "agent@example.com", armored, data)
    assert res.returncode == 0, res.stderr
    assert b'Good "gitlease" signature for agent@example.com' in res.stdout
    sig = tmp_path / "check.sig"
    assert keygen("-Y", "check-novalidate", "-n", NS, "-s", str(sig), input=data, check=False).returncode == 0
    found = keygen("-Y", "find-principals", "-f", str(tmp_path / "allowed_signers"), "-s", str(sig))
    assert found.stdout.decode().split() == ["agent@example.com"]
    # and ssh-keygen really checks: other data, other namespace fail
    assert ssh_verify(tmp_path, allowed_text, "agent@example.com", armored, data + b"!").returncode != 0
    assert ssh_verify(tmp_path, allowed_text, "agent@example.com", armored, data, "file").returncode != 0


@needs_ssh_keygen
def test_our_signature_is_byte_identical_to_ssh_keygen(tmp_path):
    path = make_key(tmp_path)
    data = b'{"leaseId":"lease_1","version":1}'
    assert sshsig.sign(sshsig.SigningKey.load(path), data, NS) == ssh_sign(tmp_path, path, data)


@needs_ssh_keygen
@pytest.mark.parametrize("hash_alg", ["sha512", "sha256"])
def test_we_verify_ssh_keygen_signature(tmp_path, hash_alg):
    path = make_key(tmp_path)
    data = b"some lease record\n"
    armored = ssh_sign(tmp_path, path, data, NS, f"hashalg={hash_alg}")
    assert split_blob(unarmor(armored))[1][3] == hash_alg.encode()
    assert sshsig.verify(armored, data, NS) == pub_of(path)
    assert sshsig.verify(armored.encode(), data, NS) == pub_of(path)
    assert sshsig.verify(armored.replace("\n", "\r\n"), data, NS) == pub_of(path)
    assert "does not verify" in raises_invalid(armored, data + b" ")


@needs_ssh_keygen
def test_signature_by_another_key_returns_that_key(tmp_path):
    ours = sshsig.generate_key(tmp_path / "ours", "us")
    theirs_path = make_key(tmp_path, "theirs")
    armored = ssh_sign(tmp_path, theirs_path, b"data")
    signer = sshsig.verify(armored, b"data", NS)
    assert signer == pub_of(theirs_path) != ours.public_key()
    signers = sshsig.parse_allowed_signers(f"us {ours.public_key()}\n")
    assert not sshsig.allowed(signers, "us", signer, NS)
    assert sshsig.principals_for(signers, signer, NS) == []


@needs_ssh_keygen
def test_rsa_signature_is_unsupported(tmp_path):
    armored = ssh_sign(tmp_path, make_key(tmp_path, "rsa", "rsa"), b"data")
    assert raises_invalid(armored, b"data") == "unsupported signature key type 'ssh-rsa' (only ssh-ed25519)"


# --- verification failures --------------------------------------------------------------------------------

KEY = in_process_key()
DATA = b"payload"
GOOD = sshsig.sign(KEY, DATA, NS)
GOOD_BLOB = unarmor(GOOD)


def test_round_trip_and_messages():
    assert sshsig.verify(GOOD, DATA, NS) == KEY.public_key()
    assert raises_invalid(GOOD, b"payload!") == "signature does not verify"
    assert raises_invalid(GOOD, DATA, "file") == "wrong signature namespace 'gitlease' (expected 'file')"
    assert raises_invalid("", DATA).startswith("malformed signature: missing '-----BEGIN SSH SIGNATURE-----'")
    assert raises_invalid("hello world").startswith("malformed signature")
    assert raises_invalid(None).startswith("malformed signature")
    assert raises_invalid(b"\xff\xfe").startswith("malformed signature")


def test_truncated_signatures():
    lines = GOOD.splitlines()
    assert "END SSH SIGNATURE" in raises_invalid("\n".join(lines[:-1]))
    assert raises_invalid("\n".join(lines[:2] + lines[-1:])).startswith("malformed signature")
    for cut in range(len(GOOD_BLOB)):
        assert raises_invalid(armor(GOOD_BLOB[:cut])).startswith("malformed signature: ")


def test_structural_failures():
    version, fields = split_blob(GOOD_BLOB)
    assert "trailing bytes" in raises_invalid(armor(GOOD_BLOB + b"\0"))
    assert "bad magic" in raises_invalid(armor(b"SSHSIH" + GOOD_BLOB[6:]))
    assert "unsupported signature version 2" in raises_invalid(armor(pack_blob(2, fields)))
    assert "reserved field" in raises_invalid(armor(pack_blob(1, fields[:2] + [b"x"] + fields[3:])))
    assert (
        raises_invalid(armor(pack_blob(1, fields[:3] + [b"sha1"] + fields[4:])))
        == "unsupported signature hash algorithm 'sha1'"
    )
    other_sig = ssh_string(b"ssh-rsa") + fields[4][15:]
    assert "signature type 'ssh-rsa'" in raises_invalid(armor(pack_blob(1, fields[:4] + [other_sig])))
    short_sig = fields[4][:-1]
    short_sig = short_sig[:15] + (63).to_bytes(4, "big") + short_sig[19:]
    assert "signature length" in raises_invalid(armor(pack_blob(1, fields[:4] + [short_sig])))
    sk_key = ssh_string(b"sk-ssh-ed25519@openssh.com") + fields[0][15:]
    assert raises_invalid(armor(pack_blob(1, [sk_key] + fields[1:]))).startswith(
        "unsupported signature key type 'sk-ssh-ed25519@openssh.com'"
    )
    long_ns = "x" * 500 + "\nInjected: line"
    msg = raises_invalid(sshsig.sign(KEY, DATA, long_ns))
    assert msg.startswith("wrong signature namespace 'xxx") and len(msg) < 200
    # base64 must be exact: no stray characters, no non-canonical final character
    b64 = GOOD.splitlines()[-2]
    assert "base64" in raises_invalid(GOOD.replace(b64, b64[:-3] + "?" + b64[-2:]))
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    assert b64.endswith("==")  # 178 bytes: the last character carries 2 data bits and 4 spare (zero) bits
    spare_bit_set = alphabet[alphabet.index(b64[-3]) | 1]
    assert "non-canonical base64" in raises_invalid(GOOD.replace(b64, b64[:-3] + spare_bit_set + b64[-2:]))
    assert "too long" in raises_invalid(GOOD + " " * 20000)


def test_sha256_signature_made_in_process_verifies():
    version, fields = split_blob(GOOD_BLOB)
    tosign = (
        b"SSHSIG"
        + ssh_string(NS.encode())
        + ssh_string(b"")
        + ssh_string(b"sha256")
        + ssh_string(hashlib.sha256(DATA).digest())
    )
    sig = ssh_string(b"ssh-ed25519") + ssh_string(KEY._private.sign(tosign))
    assert sshsig.verify(armor(pack_blob(1, [fields[0], fields[1], b"", b"sha256", sig])), DATA, NS) == KEY.public_key()
    # the hash algorithm is signed: relabelling it breaks the signature
    assert (
        raises_invalid(armor(pack_blob(1, [fields[0], fields[1], b"", b"sha512", sig])), DATA)
        == "signature does not verify"
    )


def test_whitespace_and_wrapping_are_free():
    b64 = base64.b64encode(GOOD_BLOB).decode()
    rewrapped = (
        "-----BEGIN SSH SIGNATURE-----\n"
        + "\n".join(b64[i : i + 76] for i in range(0, len(b64), 76))
        + "\n-----END SSH SIGNATURE-----"
    )
    assert sshsig.verify("\n  " + rewrapped + "  \n\n", DATA, NS) == KEY.public_key()


def test_programming_errors_are_not_invalid_record():
    with pytest.raises(ValueError):
        sshsig.sign(KEY, DATA, "")
    with pytest.raises(TypeError):
        sshsig.verify(GOOD, "payload", NS)  # type: ignore[arg-type]


def test_fingerprint_of_malformed_keys():
    for bad in ["", "ssh-ed25519", "ssh-ed25519 !!!", "ssh-rsa " + KEY.public_key().split()[1], None]:
        with pytest.raises(InvalidRecord, match="malformed public key"):
            sshsig.fingerprint_of(bad)  # type: ignore[arg-type]


# --- fuzzing: verify raises InvalidRecord and nothing else ------------------------------------------------


def _verify_outcome(armored) -> str | None:
    """The signer key, or None for InvalidRecord; any other exception fails the test."""
    try:
        return sshsig.verify(armored, DATA, NS)
    except InvalidRecord as exc:
        assert "\n" not in str(exc)
        return None


@settings(deadline=None, max_examples=300)
@given(
    st.one_of(
        st.text(max_size=600),
        st.binary(max_size=600),
        st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=\n \r", max_size=400).map(
            lambda b: f"-----BEGIN SSH SIGNATURE-----\n{b}\n-----END SSH SIGNATURE-----\n"
        ),
    )
)
def test_fuzz_random_input(armored):
    assert _verify_outcome(armored) is None


@settings(deadline=None, max_examples=300)
@given(st.binary(max_size=300))
def test_fuzz_random_blob(blob):
    assert _verify_outcome(armor(blob)) is None
    assert _verify_outcome(armor(b"SSHSIG\0\0\0\1" + blob)) is None


@settings(deadline=None, max_examples=400)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["replace", "insert", "delete"]), st.integers(0, len(GOOD_BLOB) - 1), st.integers(0, 255)
        ),
        min_size=1,
        max_size=4,
    )
)
def test_fuzz_blob_mutations(edits):
    blob = bytearray(GOOD_BLOB)
    for op, pos, value in edits:
        pos %= max(len(blob), 1)
        if op == "replace" and blob:
            blob[pos] = value
        elif op == "insert":
            blob.insert(pos, value)
        elif blob:
            del blob[pos]
    outcome = _verify_outcome(armor(bytes(blob)))
    assert outcome is None or (bytes(blob) == GOOD_BLOB and outcome == KEY.public_key())


@settings(deadline=None, max_examples=400)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["replace", "insert", "delete"]),
            st.integers(0, len(GOOD) - 1),
            st.characters() | st.sampled_from(list("\n =A-")),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_fuzz_armor_mutations(edits):
    text = GOOD
    for op, pos, char in edits:
        pos %= max(len(text), 1)
        if op == "replace":
            text = text[:pos] + char + text[pos + 1 :]
        elif op == "insert":
            text = text[:pos] + char + text[pos:]
        else:
            text = text[:pos] + text[pos + 1 :]
    outcome = _verify_outcome(text)
    if outcome is not None:  # only white space may have changed
        assert outcome == KEY.public_key() and "".join(text.split()) == "".join(GOOD.split())


# --- allowed signers --------------------------------------------------------------------------------------

K1 = in_process_key(1).public_key()
K2 = in_process_key(2).public_key()


def test_parse_allowed_signers_basic():
    text = f"""# trusted agents
alice@example.com {K1} alice's laptop

   bob@example.com,*@ci.example.com namespaces="gitlease,git" {K2}
"carol smith" NAMESPACES="file",valid-after="20240101",valid-before="20300101120000Z" {K1}
ca@example.com cert-authority {K2}\r
"""
    a, b, c, d = sshsig.parse_allowed_signers(text)
    assert a == sshsig.AllowedSigner(("alice@example.com",), K1, None, False, None, None)
    assert b.principals == ("bob@example.com", "*@ci.example.com") and b.key == K2
    assert b.namespaces == ("gitlease", "git") and not b.cert_authority
    assert c.principals == ("carol smith",) and c.namespaces == ("file",)
    assert c.valid_after == datetime(2024, 1, 1).astimezone()
    assert c.valid_before == datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert d.cert_authority and d.principals == ("ca@example.com",)
    with pytest.raises(Exception):
        a.key = K2  # frozen


@needs_ssh_keygen
def test_other_key_types_are_kept(tmp_path):
    rsa = pub_of(make_key(tmp_path, "rsa", "rsa"))
    ecdsa = pub_of(make_key(tmp_path, "ec", "ecdsa"))
    entries = sshsig.parse_allowed_signers(f'a {rsa} c\nb namespaces="x" {ecdsa}\n')
    assert [e.key for e in entries] == [rsa, ecdsa]
    assert not sshsig.allowed(entries, "a", K1, NS)


@pytest.mark.parametrize(
    "line,reason",
    [
        ("alice", "missing public key"),
        ("alice ", "missing public key"),
        ('"alice', "unterminated quote"),
        ('alice"x ' + K1, "stray quote"),
        ("alice ssh-ed25519 AAAA!!!", "invalid public key"),
        ("alice ssh-ed25519 " + K2.split()[1][:-4], "invalid public key"),
        ("alice ssh-rsa " + K1.split()[1], "invalid public key"),
        ("alice namespaces=gitlease " + K1, "double quotes"),
        ('alice namespaces="gitlease ' + K1, "unterminated quote"),
        ("alice frobnicate " + K1, "unknown option 'frobnicate'"),
        ('alice namespaces="a",namespaces="b" ' + K1, 'multiple "namespaces"'),
        ("alice cert-authority, " + K1, "end with a comma"),
        ('alice valid-after="2024" ' + K1, "invalid valid-after time"),
        ('alice valid-before="20241301" ' + K1, "invalid valid-before time"),
        ('alice valid-after="20250101",valid-before="20240101" ' + K1, "not after"),
        ('alice namespaces="x"junk ' + K1, "unknown option"),
        ('alice namespaces="x" ', "missing public key"),
    ],
)
def test_bad_allowed_signers_lines(line, reason):
    with pytest.raises(InvalidRecord) as info:
        sshsig.parse_allowed_signers(f"# header\n\nok {K1}\n{line}\n")
    assert str(info.value).startswith("allowed signers line 4: ") and reason in str(info.value)
    assert info.value.exit_code == 5


@pytest.mark.parametrize(
    "patterns,principal,expected",
    [
        ("alice@example.com", "alice@example.com", True),
        ("alice@example.com", "Alice@example.com", False),  # case-sensitive, as ssh-keygen
        ("*@example.com", "bob@example.com", True),
        ("*@example.com", "bob@example.org", False),
        ("?ob", "bob", True),
        ("?ob", "bbob", False),
        ("a*b*c", "aXXbYYc", True),
        ("a*b*c", "aXXbYY", False),
        ("alice,bob", "bob", True),
        ("*,!mallory", "mallory", False),
        ("!mallory,*", "mallory", False),
        ("!mallory,*", "alice", True),
        ("!mallory", "alice", False),  # a negation alone never grants
        ("*@example.com,!*-bot@example.com", "ci-bot@example.com", False),
        ("*@example.com,!*-bot@example.com", "dev@example.com", True),
        ("*", "", True),
    ],
)
def test_principal_patterns(patterns, principal, expected):
    signers = sshsig.parse_allowed_signers(f"{patterns} {K1}\n")
    assert sshsig.allowed(signers, principal, K1, NS) is expected
    assert sshsig.allowed(signers, principal, K2, NS) is False


def test_namespaces_and_principals_for():
    signers = sshsig.parse_allowed_signers(f"""
alice,bob namespaces="gitlease" {K1}
carol namespaces="git*,!git-internal" {K1}
dave {K1} any namespace
alice namespaces="" {K1}
ca cert-authority {K1}
erin {K2}
""")
    assert sshsig.principals_for(signers, K1, NS) == ["alice", "bob", "carol", "dave"]
    assert sshsig.principals_for(signers, K1 + " with comment", "file") == ["dave"]
    assert sshsig.principals_for(signers, K1, "git-internal") == ["dave"]
    assert sshsig.principals_for(signers, K2, NS) == ["erin"]
    assert sshsig.principals_for(signers, "not a key", NS) == []
    assert sshsig.allowed(signers, "bob", K1, NS) and not sshsig.allowed(signers, "bob", K1, "file")
    assert sshsig.allowed(signers, "carol", K1, "gitx") and not sshsig.allowed(signers, "carol", K1, "git-internal")
    assert not sshsig.allowed(signers, "ca", K1, NS)  # a CA key never matches a plain key signature
    assert not sshsig.allowed(signers, "erin", K1, NS)
    assert not sshsig.allowed(signers, "bob", "garbage", NS)


def test_validity_window():
    signers = sshsig.parse_allowed_signers(f'alice valid-after="20300101Z",valid-before="20300201000000Z" {K1}\n')
    start = datetime(2030, 1, 1, tzinfo=UTC)
    end = datetime(2030, 2, 1, tzinfo=UTC)
    assert not sshsig.allowed(signers, "alice", K1, NS, start - timedelta(seconds=1))
    assert sshsig.allowed(signers, "alice", K1, NS, start)
    assert sshsig.allowed(signers, "alice", K1, NS, end)
    assert sshsig.allowed(signers, "alice", K1, NS, end + timedelta(microseconds=500))  # whole seconds
    assert not sshsig.allowed(signers, "alice", K1, NS, end + timedelta(seconds=1))
    assert sshsig.principals_for(signers, K1, NS, start.timestamp() + 60) == ["alice"]
    assert sshsig.principals_for(signers, K1, NS) == []  # now (before 2030)
    assert not sshsig.allowed(signers, "alice", K1, NS)


_GLOB = st.text(alphabet="ab*?", max_size=8)


@given(_GLOB, st.text(alphabet="ab", max_size=8))
def test_match_pattern_agrees_with_a_regex(pattern, text):
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    assert patterns._match_pattern(text.encode(), pattern.encode()) == bool(re.fullmatch(regex, text, re.S))


@settings(deadline=None, max_examples=300)
@given(st.text(max_size=200))
def test_fuzz_allowed_signers(text):
    try:
        sshsig.parse_allowed_signers(text)
    except InvalidRecord as exc:
        assert str(exc).startswith("allowed signers line ")


@needs_ssh_keygen
@pytest.mark.parametrize(
    "options,principal,namespace,verify_time",
    [
        ("", "alice@example.com", NS, None),
        ('namespaces="gitlease"', "alice@example.com", NS, None),
        ('namespaces="file"', "alice@example.com", NS, None),
        ('namespaces="git*,!gitlease"', "alice@example.com", NS, None),
        ('namespaces="git?ease"', "alice@example.com", NS, None),
        ("", "bob@example.com", NS, None),
        ('valid-after="20300101"', "alice@example.com", NS, None),
        ('valid-before="20200101Z"', "alice@example.com", NS, None),
        ('valid-after="20200101",valid-before="20990101"', "alice@example.com", NS, None),
        ('valid-after="20300101Z"', "alice@example.com", NS, "20300102"),
        ("cert-authority", "alice@example.com", NS, None),
    ],
)
def test_allowed_agrees_with_ssh_keygen(tmp_path, options, principal, namespace, verify_time):
    key = sshsig.generate_key(tmp_path / "k", "")
    armored = sshsig.sign(key, b"data", namespace)
    line = f"*@example.com,!bob@example.com {options} {key.public_key()}\n".replace("  ", " ")
    opts = [f"verify-time={verify_time}"] if verify_time else []
    ours = sshsig.allowed(
        sshsig.parse_allowed_signers(line),
        principal,
        key.public_key(),
        namespace,
        datetime(int(verify_time[:4]), int(verify_time[4:6]), int(verify_time[6:])).astimezone()
        if verify_time
        else None,
    )
    theirs = ssh_verify(tmp_path, line, principal, armored, b"data", namespace, *opts).returncode == 0
    assert ours == theirs
