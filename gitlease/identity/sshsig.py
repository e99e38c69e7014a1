"""OpenSSH SSHSIG signatures for Ed25519 keys, made and checked in-process (no ssh-keygen), or made by ssh-agent.

The formats are OpenSSH's own, so the other tools interoperate:

* ``sign`` writes exactly what ``ssh-keygen -Y sign`` writes (hash sha512; Ed25519 is deterministic, so for
  the same key, data and namespace the armored text is byte-identical), and ``ssh-keygen -Y verify`` accepts it;
* ``verify`` accepts what ``ssh-keygen -Y sign`` writes (hash sha512 or sha256) and refuses everything else
  with ``InvalidRecord``, whatever the input;
* ``SigningKey.load`` reads an unencrypted ``-----BEGIN OPENSSH PRIVATE KEY-----`` file and ``generate_key``
  writes one (plus ``.pub``) that ssh-keygen reads; ``AgentKey`` signs with a key held by ssh-agent;
* ``parse_allowed_signers``, ``principals_for`` and ``allowed`` read and apply an ``allowed_signers`` file
  (ssh-keygen(1), ALLOWED SIGNERS) the way ``ssh-keygen -Y verify`` does, principal and namespace patterns
  included (OpenSSH ``match_pattern_list``).

References: PROTOCOL.sshsig and PROTOCOL.key in openssh-portable; sshsig.c, match.c, misc.c for the details
(armor wrapping at 70 columns, option syntax, time formats).

Importing this module is cheap: ``cryptography`` (and hashlib) are imported inside the functions that need
them. Errors: every verification failure is ``InvalidRecord``; every key-file problem is ``ConfigError``;
messages are one line and never carry key material. Passing the wrong Python types or an empty namespace is
a programming error (``TypeError``/``ValueError``).
"""

from __future__ import annotations

import binascii
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING

from gitlease.core.errors import ConfigError, InvalidRecord

if TYPE_CHECKING:  # pragma: no cover
    from datetime import datetime

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "KEY_TYPE",
    "HASH_ALG",
    "SigningKey",
    "AgentKey",
    "generate_key",
    "sign",
    "verify",
    "fingerprint_of",
    "AllowedSigner",
    "parse_allowed_signers",
    "principals_for",
    "allowed",
]

KEY_TYPE = "ssh-ed25519"
HASH_ALG = "sha512"  # what sign() uses (ssh-keygen's default); verify() also takes sha256

_SIG_MAGIC = b"SSHSIG"
_SIG_VERSION = 1
_SIG_BEGIN = "-----BEGIN SSH SIGNATURE-----"
_SIG_END = "-----END SSH SIGNATURE-----"
_KEY_BEGIN = "-----BEGIN OPENSSH PRIVATE KEY-----"
_KEY_END = "-----END OPENSSH PRIVATE KEY-----"
_KEY_MAGIC = b"openssh-key-v1\0"
_WRAP = 70  # ssh-keygen wraps both armors at 70 columns
_HASH_ALGS = ("sha256", "sha512")
_MAX_ARMOR = 16 * 1024  # an Ed25519 SSHSIG is about 300 characters
_MAX_KEY_FILE = 64 * 1024
_KEY_TYPE_B = KEY_TYPE.encode()
_WS = " \t\r\n"


# --- SSH wire encoding (RFC 4251: uint32, string) -------------------------------------------------------------


class _Malformed(Exception):
    """Internal: a wire-format problem; callers turn it into InvalidRecord or ConfigError."""


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


def _string(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def raw(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _Malformed(f"truncated {what}")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def u32(self, what: str) -> int:
        return int.from_bytes(self.raw(4, what), "big")

    def string(self, what: str) -> bytes:
        return self.raw(self.u32(what), what)

    def rest(self) -> bytes:
        out = self.buf[self.pos :]
        self.pos = len(self.buf)
        return out

    def at_end(self) -> bool:
        return self.pos == len(self.buf)


def _b64(b: bytes) -> str:
    return binascii.b2a_base64(b, newline=False).decode("ascii")


def _unb64(text: str) -> bytes:
    """Strict, canonical base64 (no stray characters, exact padding, zero trailing bits) or _Malformed."""
    try:
        out = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise _Malformed("bad base64") from None
    if _b64(out) != text:
        raise _Malformed("non-canonical base64")
    return out


def _wrap(b64: str) -> str:
    return "\n".join(b64[i : i + _WRAP] for i in range(0, len(b64), _WRAP))


def _show(value: str | bytes, limit: int = 64) -> str:
    """A short, one-line, quoted rendering of untrusted text for an error message."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    if len(value) > limit:
        return repr(value[:limit]) + "..."
    return repr(value)


def _ed25519_blob(pub: bytes) -> bytes:
    return _string(_KEY_TYPE_B) + _string(pub)


def _ed25519_pub(blob: bytes, what: str) -> bytes:
    """The 32-byte key of an ssh-ed25519 public key blob; _Malformed if it is another type or malformed."""
    r = _Reader(blob)
    ktype = r.string(what)
    if ktype != _KEY_TYPE_B:
        raise _Malformed(f"unsupported key type {_show(ktype)} (only {KEY_TYPE})")
    pub = r.string(what)
    if len(pub) != 32 or not r.at_end():
        raise _Malformed(f"malformed {KEY_TYPE} {what}")
    return pub


def _fingerprint(blob: bytes) -> str:
    import hashlib

    return "SHA256:" + _b64(hashlib.sha256(blob).digest()).rstrip("=")


def _parse_key_words(ktype: str, b64: str) -> bytes:
    """The blob of '<type> <base64>', checking that the blob names the same type; _Malformed if not."""
    if not ktype or not ktype.isascii() or not ktype.isprintable():
        raise _Malformed("bad key type")
    blob = _unb64(b64)
    try:
        inner = _Reader(blob).string("public key")
    except _Malformed:
        raise _Malformed("bad public key blob") from None
    if inner != ktype.encode("ascii"):
        raise _Malformed(f"key type {_show(ktype)} does not match its blob")
    if ktype == KEY_TYPE:
        _ed25519_pub(blob, "public key")
    return blob


def _parse_public_key(text: str) -> bytes:
    words = text.split() if isinstance(text, str) else []
    if len(words) < 2:
        raise _Malformed("expected '<type> <base64> [comment]'")
    return _parse_key_words(words[0], words[1])


def fingerprint_of(public_key: str) -> str:
    """``SHA256:<base64, unpadded>`` of a ``"<type> <base64> [comment]"`` key, as ``ssh-keygen -lf`` prints it.

    Any well-formed key type is accepted (the fingerprint is a hash of the blob); a malformed key string
    raises ``InvalidRecord``."""
    try:
        return _fingerprint(_parse_public_key(public_key))
    except _Malformed as exc:
        raise InvalidRecord(f"malformed public key: {exc}") from None


# --- keys -------------------------------------------------------------------------------------------------


class SigningKey:
    """An Ed25519 private key (with its public half and comment). ``repr`` shows only the fingerprint."""

    __slots__ = ("_private", "_pub", "comment", "path")

    def __init__(self, private: Ed25519PrivateKey, comment: str = "", path: str | None = None) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        if not isinstance(private, Ed25519PrivateKey):
            raise TypeError("SigningKey needs a cryptography Ed25519PrivateKey")
        self._private = private
        self._pub = private.public_key().public_bytes_raw()
        self.comment = comment
        self.path = path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        """Read an unencrypted OpenSSH-format ssh-ed25519 private key file; ``ConfigError`` on any problem."""
        shown = _show_path(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(_MAX_KEY_FILE + 1)
        except FileNotFoundError:
            raise ConfigError(f"signing key {shown}: no such file") from None
        except IsADirectoryError:
            raise ConfigError(f"signing key {shown}: is a directory, not a key file") from None
        except OSError as exc:
            raise ConfigError(f"signing key {shown}: cannot read ({exc.strerror or type(exc).__name__})") from None
        except (ValueError, TypeError):  # a NUL in the path, or not a path at all
            raise ConfigError(f"signing key {shown}: cannot read (invalid path)") from None
        if len(raw) > _MAX_KEY_FILE:
            raise ConfigError(f"signing key {shown}: file too large to be a private key")
        try:
            seed, pub, comment = _parse_private_file(raw)
        except _Malformed as exc:
            raise ConfigError(f"signing key {shown}: {exc}") from None
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = cls(Ed25519PrivateKey.from_private_bytes(seed), comment, os.fspath(path))
        if key._pub != pub:
            raise ConfigError(f"signing key {shown}: corrupt key file (public key does not match private key)")
        return key

    @property
    def public_blob(self) -> bytes:
        """The SSH wire form of the public key (what fingerprints hash and signatures embed)."""
        return _ed25519_blob(self._pub)

    def public_key(self) -> str:
        """``"ssh-ed25519 <base64>"`` (authorized_keys / allowed_signers form, no comment)."""
        return KEY_TYPE + " " + _b64(self.public_blob)

    def public_line(self) -> str:
        """``"ssh-ed25519 <base64> comment"``, the ``.pub`` file line (without comment if there is none)."""
        return f"{self.public_key()} {self.comment}" if self.comment else self.public_key()

    def fingerprint(self) -> str:
        """``SHA256:...`` exactly as ``ssh-keygen -lf`` prints it."""
        return _fingerprint(self.public_blob)

    def __repr__(self) -> str:
        return f"SigningKey({self.fingerprint()}, comment={self.comment!r})"


def _show_path(path: object) -> str:
    try:
        text = os.fspath(path)  # type: ignore[arg-type]
    except TypeError:
        return repr(path)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    return text if text.isprintable() else repr(text)


class _KeyProblem(_Malformed):
    """Internal: a readable key file that gitlease cannot use (its message stands alone)."""


def _parse_private_file(raw: bytes) -> tuple[bytes, bytes, str]:
    """(seed, public key, comment) of an unencrypted OpenSSH ed25519 private key file (PROTOCOL.key)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise _KeyProblem("not an OpenSSH private key (binary data)") from None
    lines = [line for line in (line.strip(_WS) for line in text.split("\n")) if line]
    first = lines[0] if lines else ""
    if first != _KEY_BEGIN:
        if first.startswith(("ssh-", "ecdsa-", "sk-")):
            raise _KeyProblem("this is a public key; give the private key file")
        if first.startswith("-----BEGIN ") and "PRIVATE KEY" in first:
            raise _KeyProblem(
                f"not an OpenSSH-format private key ({first.strip('-').strip()}); "
                f"only OpenSSH-format {KEY_TYPE} keys are supported"
            )
        raise _KeyProblem(f"not an OpenSSH private key (no '{_KEY_BEGIN}' line)")
    try:
        return _parse_private_blob(lines)
    except _KeyProblem:
        raise
    except _Malformed as exc:
        raise _KeyProblem(f"corrupt key file ({exc})") from None


def _parse_private_blob(lines: list[str]) -> tuple[bytes, bytes, str]:
    if _KEY_END not in lines:
        raise _Malformed("no END line")
    blob = _unb64("".join(lines[1 : lines.index(_KEY_END)]))
    r = _Reader(blob)
    if r.raw(len(_KEY_MAGIC), "header") != _KEY_MAGIC:
        raise _Malformed("bad magic")
    cipher = r.string("header")
    kdf = r.string("header")
    r.string("header")  # kdf options
    nkeys = r.u32("header")
    if nkeys != 1:
        raise _Malformed(f"{nkeys} keys, expected 1")
    public = r.string("public key")
    ktype = _Reader(public).string("public key")
    if ktype != _KEY_TYPE_B:
        raise _KeyProblem(f"unsupported key type {_show(ktype)} (only {KEY_TYPE} keys are supported)")
    if cipher != b"none":
        raise _KeyProblem(
            "key is encrypted with a passphrase; gitlease needs an unencrypted key "
            "(remove it with ssh-keygen -p, or make a dedicated key)"
        )
    if kdf != b"none":
        raise _Malformed("kdf without cipher")
    pub = _ed25519_pub(public, "public key")
    private = r.string("private section")
    if not r.at_end():
        raise _Malformed("trailing data")
    if len(private) % 8:
        raise _Malformed("private section not padded")
    p = _Reader(private)
    if p.u32("private section") != p.u32("private section"):
        raise _Malformed("check bytes differ")
    if p.string("private section") != _KEY_TYPE_B or p.string("private section") != pub:
        raise _Malformed("private part does not match public key")
    secret = p.string("private section")
    if len(secret) != 64 or secret[32:] != pub:
        raise _Malformed(f"bad {KEY_TYPE} private key")
    comment = p.string("private section").decode("utf-8", "replace")
    padding = p.rest()
    if padding != bytes(range(1, len(padding) + 1)):
        raise _Malformed("bad padding")
    return secret[:32], pub, comment


def _private_file(seed: bytes, pub: bytes, comment: str) -> bytes:
    """The OpenSSH private key file ssh-keygen writes for an unencrypted ed25519 key."""
    check = os.urandom(4)
    private = (
        check + check + _string(_KEY_TYPE_B) + _string(pub) + _string(seed + pub) + _string(comment.encode("utf-8"))
    )
    private += bytes(range(1, (-len(private) % 8) + 1))
    blob = (
        _KEY_MAGIC
        + _string(b"none")
        + _string(b"none")
        + _string(b"")
        + _u32(1)
        + _string(_ed25519_blob(pub))
        + _string(private)
    )
    return f"{_KEY_BEGIN}\n{_wrap(_b64(blob))}\n{_KEY_END}\n".encode("ascii")


def generate_key(path: str | os.PathLike[str], comment: str = "") -> SigningKey:
    """Write a new unencrypted ed25519 key: ``path`` (OpenSSH format, mode 0600) and ``path + ".pub"``.

    Refuses (``ConfigError``) to overwrite either file."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not isinstance(comment, str) or not comment.isprintable():
        raise ConfigError("key comment must be one line of printable text")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError("generate_key needs a str path")
    pub_path = path + ".pub"
    for target in (path, pub_path):
        if os.path.lexists(target):
            raise ConfigError(f"refusing to overwrite existing {_show_path(target)}")
    private = Ed25519PrivateKey.generate()
    key = SigningKey(private, comment, path)
    content = _private_file(private.private_bytes_raw(), key._pub, comment)
    _write_new(path, content, 0o600)
    try:
        _write_new(pub_path, (key.public_line() + "\n").encode("utf-8"), 0o644)
    except BaseException:
        os.unlink(path)
        raise
    return key


def _write_new(path: str, content: bytes, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise ConfigError(f"refusing to overwrite existing {_show_path(path)}") from None
    except OSError as exc:
        raise ConfigError(f"cannot write {_show_path(path)}: {exc.strerror or type(exc).__name__}") from None
    except ValueError:  # a NUL in the path
        raise ConfigError(f"cannot write {_show_path(path)}: invalid path") from None
    try:
        os.fchmod(fd, mode)  # exact mode, whatever the umask
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException as exc:
        os.close(fd)
        os.unlink(path)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write {_show_path(path)}: {exc.strerror or type(exc).__name__}") from None
        raise
    os.close(fd)


# --- signatures -------------------------------------------------------------------------------------------


def _check_namespace(namespace: str) -> bytes:
    if not isinstance(namespace, str):
        raise TypeError("namespace must be a str")
    if not namespace or "\0" in namespace:
        raise ValueError("namespace must be a non-empty string without NUL")
    return namespace.encode("utf-8")


def _hash(alg: str, data: bytes) -> bytes:
    import hashlib

    return getattr(hashlib, alg)(data).digest()


def _signed_data(namespace: bytes, reserved: bytes, hash_alg: bytes, digest: bytes) -> bytes:
    return _SIG_MAGIC + _string(namespace) + _string(reserved) + _string(hash_alg) + _string(digest)


def sign(key: SigningKey | AgentKey, data: bytes, namespace: str) -> str:
    """The armored SSHSIG of ``data`` in ``namespace`` (hash sha512), as ``ssh-keygen -Y sign`` writes it."""
    if not isinstance(key, (SigningKey, AgentKey)):
        raise TypeError("sign needs a SigningKey or an AgentKey")
    ns = _check_namespace(namespace)
    alg = HASH_ALG.encode()
    to_sign = _signed_data(ns, b"", alg, _hash(HASH_ALG, data))
    if isinstance(key, AgentKey):
        sig_blob = key._agent_sign(to_sign)
    else:
        sig_blob = _string(_KEY_TYPE_B) + _string(key._private.sign(to_sign))
    blob = (
        _SIG_MAGIC
        + _u32(_SIG_VERSION)
        + _string(key.public_blob)
        + _string(ns)
        + _string(b"")
        + _string(alg)
        + _string(sig_blob)
    )
    return f"{_SIG_BEGIN}\n{_wrap(_b64(blob))}\n{_SIG_END}\n"


# --- ssh-agent --------------------------------------------------------------------------------------------

_AGENT_FAILURE, _AGENTC_REQUEST_IDENTITIES, _AGENT_IDENTITIES_ANSWER = 5, 11, 12
_AGENTC_SIGN_REQUEST, _AGENT_SIGN_RESPONSE = 13, 14
_AGENT_TIMEOUT = 10.0
_MAX_AGENT_REPLY = 256 * 1024


class AgentKey:
    """An Ed25519 key whose private half is held by ssh-agent (``SSH_AUTH_SOCK``), named by its public key.

    The agent signs the SSHSIG signed-data blob (PROTOCOL.agent, SSH_AGENTC_SIGN_REQUEST), exactly the bytes
    that ``SigningKey`` signs in-process; Ed25519 is deterministic, so the armored result is the same. Every
    problem (no agent, key not in it, agent refuses) is ``ConfigError``."""

    __slots__ = ("public_blob", "comment", "sock", "path")

    def __init__(self, public_key: str, sock: str | None = None, comment: str = "") -> None:
        try:
            blob = _parse_public_key(public_key)
            _ed25519_pub(blob, "public key")
        except _Malformed as exc:
            raise ConfigError(f"signing key: {exc} (ssh-agent keys must be {KEY_TYPE})") from None
        self.public_blob = blob
        self.comment = comment
        self.path = None
        self.sock = sock if sock is not None else os.environ.get("SSH_AUTH_SOCK", "")
        if not self.sock:
            raise ConfigError(
                "signing key names a public key, so its private half must be in ssh-agent, but SSH_AUTH_SOCK is not set"
            )
        if blob not in self._identities():
            raise ConfigError(
                f"signing key {self.fingerprint()} is not in the ssh-agent at {_show_path(self.sock)} "
                "(ssh-add it, or set lease.signingKey to the private key file)"
            )

    def public_key(self) -> str:
        return KEY_TYPE + " " + _b64(self.public_blob)

    def fingerprint(self) -> str:
        return _fingerprint(self.public_blob)

    def __repr__(self) -> str:
        return f"AgentKey({self.fingerprint()})"

    def _request(self, kind: int, payload: bytes) -> tuple[int, _Reader]:
        import socket

        msg = bytes([kind]) + payload
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(_AGENT_TIMEOUT)
                s.connect(self.sock)
                s.sendall(_u32(len(msg)) + msg)
                head = _recv_exact(s, 4)
                size = int.from_bytes(head, "big")
                if not 1 <= size <= _MAX_AGENT_REPLY:
                    raise ConfigError("ssh-agent sent a malformed reply")
                reply = _recv_exact(s, size)
        except OSError as exc:
            raise ConfigError(
                f"cannot talk to ssh-agent at {_show_path(self.sock)}: {exc.strerror or type(exc).__name__}"
            ) from None
        return reply[0], _Reader(reply[1:])

    def _identities(self) -> list[bytes]:
        kind, r = self._request(_AGENTC_REQUEST_IDENTITIES, b"")
        if kind != _AGENT_IDENTITIES_ANSWER:
            raise ConfigError("ssh-agent refused to list its keys")
        keys = []
        try:
            for _ in range(r.u32("count")):
                keys.append(r.string("key"))
                r.string("comment")
        except _Malformed:
            raise ConfigError("ssh-agent sent a malformed key list") from None
        return keys

    def _agent_sign(self, data: bytes) -> bytes:
        kind, r = self._request(_AGENTC_SIGN_REQUEST, _string(self.public_blob) + _string(data) + _u32(0))
        if kind != _AGENT_SIGN_RESPONSE:
            raise ConfigError(
                f"ssh-agent refused to sign with key {self.fingerprint()}"
                + (" (it may need confirmation, or the key was removed)" if kind == _AGENT_FAILURE else "")
            )
        try:
            sig_blob = r.string("signature")
            s = _Reader(sig_blob)
            if s.string("signature") != _KEY_TYPE_B or len(s.string("signature")) != 64 or not s.at_end():
                raise _Malformed("not an ssh-ed25519 signature")
        except _Malformed as exc:
            raise ConfigError(f"ssh-agent sent a malformed signature: {exc}") from None
        return sig_blob


def _recv_exact(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConfigError("ssh-agent closed the connection")
        buf += chunk
    return buf


def _dearmor(armored: object) -> bytes:
    if isinstance(armored, (bytes, bytearray, memoryview)):
        try:
            armored = bytes(armored).decode("ascii")
        except UnicodeDecodeError:
            raise InvalidRecord("malformed signature: not ASCII text") from None
    if not isinstance(armored, str):
        raise InvalidRecord("malformed signature: not text")
    if len(armored) > _MAX_ARMOR:
        raise InvalidRecord("malformed signature: too long")
    lines = [line.strip(_WS) for line in armored.strip(_WS).split("\n")]
    if not lines or lines[0] != _SIG_BEGIN:
        raise InvalidRecord(f"malformed signature: missing '{_SIG_BEGIN}' line")
    if len(lines) < 2 or lines[-1] != _SIG_END:
        raise InvalidRecord(f"malformed signature: missing '{_SIG_END}' line")
    body = "".join(lines[1:-1])
    try:
        return _unb64(body)
    except _Malformed as exc:
        raise InvalidRecord(f"malformed signature: {exc}") from None


def verify(armored: str, data: bytes, namespace: str) -> str:
    """Check an armored SSHSIG over ``data`` in ``namespace``; return the signer's ``"ssh-ed25519 <base64>"``.

    The caller decides whether that key is trusted (compare it, or look it up with ``allowed``). Any problem
    with the signature text raises ``InvalidRecord``, never anything else."""
    ns = _check_namespace(namespace)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("data must be bytes")
    blob = _dearmor(armored)
    r = _Reader(blob)
    try:
        if r.raw(len(_SIG_MAGIC), "magic") != _SIG_MAGIC:
            raise _Malformed("not an SSH signature (bad magic)")
        version = r.u32("version")
        if version != _SIG_VERSION:
            raise _Malformed(f"unsupported signature version {version}")
        public = r.string("public key")
        got_ns = r.string("namespace")
        reserved = r.string("reserved field")
        hash_alg = r.string("hash algorithm")
        sig_blob = r.string("signature")
        if not r.at_end():
            raise _Malformed("trailing bytes after signature")
        if reserved:  # ssh-keygen ignores it (and does not sign it): refuse rather than accept malleable blobs
            raise _Malformed("reserved field is not empty")
    except _Malformed as exc:
        raise InvalidRecord(f"malformed signature: {exc}") from None
    try:
        key_type = _Reader(public).string("public key")
        if key_type != _KEY_TYPE_B:
            raise InvalidRecord(f"unsupported signature key type {_show(key_type)} (only {KEY_TYPE})")
        pub = _ed25519_pub(public, "public key")
    except _Malformed as exc:
        raise InvalidRecord(f"malformed signature: {exc}") from None
    if got_ns != ns:
        raise InvalidRecord(f"wrong signature namespace {_show(got_ns)} (expected {_show(namespace)})")
    alg = hash_alg.decode("ascii", "replace")
    if alg not in _HASH_ALGS:
        raise InvalidRecord(f"unsupported signature hash algorithm {_show(hash_alg)}")
    s = _Reader(sig_blob)
    try:
        sig_type = s.string("signature")
        if sig_type != _KEY_TYPE_B:
            raise _Malformed(f"signature type {_show(sig_type)} does not match key type {KEY_TYPE}")
        raw_sig = s.string("signature")
        if len(raw_sig) != 64 or not s.at_end():
            raise _Malformed(f"bad {KEY_TYPE} signature length")
    except _Malformed as exc:
        raise InvalidRecord(f"malformed signature: {exc}") from None

    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(pub).verify(raw_sig, _signed_data(ns, b"", hash_alg, _hash(alg, data)))
    except (InvalidSignature, ValueError):
        raise InvalidRecord("signature does not verify") from None
    return KEY_TYPE + " " + _b64(public)


# --- allowed signers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllowedSigner:
    """One line of an ``allowed_signers`` file.

    ``principals`` and ``namespaces`` are OpenSSH pattern lists (``*``, ``?``, ``!negation``), split at commas.
    ``key`` is ``"<type> <base64>"`` (any type is kept; only ssh-ed25519 can match our signatures).
    ``namespaces`` None means every namespace. ``valid_after``/``valid_before`` are aware datetimes or None.
    """

    principals: tuple[str, ...]
    key: str
    namespaces: tuple[str, ...] | None = None
    cert_authority: bool = False
    valid_after: datetime | None = None
    valid_before: datetime | None = None

    def allows_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or _match_pattern_list(namespace, ",".join(self.namespaces)) == 1

    def valid_at(self, when: datetime | float | int | None = None) -> bool:
        now = _verify_time(when)
        if self.valid_after is not None and now < self.valid_after:
            return False
        return not (self.valid_before is not None and now > self.valid_before)

    def matches_principal(self, principal: str) -> bool:
        return _match_pattern_list(principal, ",".join(self.principals)) == 1


def parse_allowed_signers(text: str) -> list[AllowedSigner]:
    """Parse ``allowed_signers`` text: ``principals [options] keytype base64 [comment]`` per line.

    Blank lines and ``#`` comments are skipped. Options (comma-separated, values in double quotes):
    ``cert-authority``, ``namespaces="a,b"``, ``valid-after="YYYYMMDD[HHMM[SS]][Z]"``, ``valid-before=...``.
    A line that does not parse raises ``InvalidRecord("allowed signers line N: ...")``."""
    if not isinstance(text, str):
        raise TypeError("allowed signers text must be a str")
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip(_WS)
        if not line or line.startswith("#"):
            continue
        try:
            out.append(_parse_signer_line(line))
        except _Malformed as exc:
            raise InvalidRecord(f"allowed signers line {number}: {exc}") from None
    return out


def _parse_signer_line(line: str) -> AllowedSigner:
    # principals: one word, or a double-quoted string (ssh-keygen's strdelimw)
    if line.startswith('"'):
        close = line.find('"', 1)
        if close < 0:
            raise _Malformed("unterminated quote in principals")
        principals, rest = line[1:close], line[close + 1 :]
        if rest and rest[0] not in _WS:
            raise _Malformed("text after the quoted principals")
    else:
        cut = _first_of(line, _WS)
        principals, rest = line[:cut], line[cut:]
        if '"' in principals:
            raise _Malformed("stray quote in principals")
    if not principals:
        raise _Malformed("empty principals")
    rest = rest.lstrip(_WS)
    if not rest:
        raise _Malformed("missing public key")
    options = ""
    words = rest.split(None, 2)
    try:
        blob = _parse_key_words(words[0], words[1]) if len(words) >= 2 else None
    except _Malformed as exc:
        if words[0].startswith(("ssh-", "ecdsa-", "sk-")):  # a key type, not an option: say what is wrong
            raise _Malformed(f"invalid public key ({exc})") from None
        blob = None
    if blob is None:  # not a key: options first
        cut = _options_end(rest)
        options, rest = rest[:cut], rest[cut:].lstrip(_WS)
        words = rest.split(None, 2)
        if len(words) < 2:
            raise _Malformed("missing public key")
        try:
            blob = _parse_key_words(words[0], words[1])
        except _Malformed as exc:
            raise _Malformed(f"invalid public key ({exc})") from None
    return _apply_options(tuple(principals.split(",")), words[0] + " " + _b64(blob), options)


def _first_of(s: str, chars: str) -> int:
    for i, c in enumerate(s):
        if c in chars:
            return i
    return len(s)


def _options_end(s: str) -> int:
    """Index of the first unquoted space/tab (OpenSSH sshkey_advance_past_options); _Malformed if unbalanced."""
    quoted = False
    i = 0
    while i < len(s) and (quoted or s[i] not in " \t"):
        if s[i] == "\\" and s[i + 1 : i + 2] == '"':
            i += 1
        elif s[i] == '"':
            quoted = not quoted
        i += 1
    if quoted:
        raise _Malformed("unterminated quote in options")
    return i


def _apply_options(principals: tuple[str, ...], key: str, opts: str) -> AllowedSigner:
    """Parse the option list the way OpenSSH sshsigopt_parse does (names case-insensitive)."""
    ca = False
    namespaces: tuple[str, ...] | None = None
    after = before = None
    i = 0
    while i < len(opts):
        low = opts[i:].lower()
        if low.startswith("cert-authority"):
            ca = True
            i += len("cert-authority")
        else:
            for name in ("namespaces", "valid-after", "valid-before"):
                if low.startswith(name + "="):
                    break
            else:
                raise _Malformed(f"unknown option {_show(opts[i:].split(',', 1)[0])}")
            value, i = _dequote(opts, i + len(name) + 1, name)
            if name == "namespaces":
                if namespaces is not None:
                    raise _Malformed('multiple "namespaces" options')
                namespaces = tuple(value.split(",")) if value else ()
            elif name == "valid-after":
                if after is not None:
                    raise _Malformed('multiple "valid-after" options')
                after = _parse_time(value, name)
            else:
                if before is not None:
                    raise _Malformed('multiple "valid-before" options')
                before = _parse_time(value, name)
        if i == len(opts):
            break
        if opts[i] != ",":
            raise _Malformed(f"unknown option {_show(opts[i:].split(',', 1)[0])}")
        i += 1
        if i == len(opts):
            raise _Malformed("options end with a comma")
    if after is not None and before is not None and before <= after:
        raise _Malformed('"valid-before" is not after "valid-after"')
    return AllowedSigner(principals, key, namespaces, ca, after, before)


def _dequote(s: str, i: int, name: str) -> tuple[str, int]:
    """A double-quoted option value at s[i] (backslash may escape a quote) and the index after it."""
    if s[i : i + 1] != '"':
        raise _Malformed(f"{name} value must be in double quotes")
    i += 1
    out = []
    while i < len(s) and s[i] != '"':
        if s[i] == "\\" and s[i + 1 : i + 2] == '"':
            i += 1
        out.append(s[i])
        i += 1
    if i == len(s):
        raise _Malformed(f"{name} value has no closing quote")
    return "".join(out), i + 1


def _parse_time(value: str, name: str) -> datetime:
    """YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS, local time, or UTC with a ``Z``/``UTC`` suffix (OpenSSH)."""
    from datetime import datetime

    digits, utc = value, False
    if len(digits) > 1 and digits[-1] in "Zz":
        digits, utc = digits[:-1], True
    elif len(digits) > 3 and digits[-3:].upper() == "UTC":
        digits, utc = digits[:-3], True
    if len(digits) not in (8, 12, 14) or not (digits.isascii() and digits.isdigit()):
        raise _Malformed(f"invalid {name} time {_show(value)} (expected YYYYMMDD[HHMM[SS]][Z])")
    parts = [int(digits[:4]), int(digits[4:6]), int(digits[6:8])]
    parts += [int(digits[j : j + 2]) for j in range(8, len(digits), 2)]
    try:
        if utc:
            return datetime(*parts, tzinfo=UTC)
        return datetime(*parts).astimezone()
    except (ValueError, OverflowError, OSError):
        raise _Malformed(f"invalid {name} time {_show(value)}") from None


def _verify_time(when: datetime | float | int | None) -> datetime:
    """``when`` as an aware datetime in whole seconds (naive = local time; numbers = Unix time; None = now)."""
    from datetime import datetime

    if when is None:
        when = datetime.now(UTC)
    elif isinstance(when, (int, float)) and not isinstance(when, bool):
        when = datetime.fromtimestamp(when, UTC)
    elif not isinstance(when, datetime):
        raise TypeError("when must be a datetime, a Unix time or None")
    elif when.tzinfo is None:
        when = when.astimezone()
    return when.replace(microsecond=0)


def _canonical_key(key: str) -> str | None:
    try:
        blob = _parse_public_key(key)
    except _Malformed:
        return None
    return key.split()[0] + " " + _b64(blob)


def principals_for(
    signers: Iterable[AllowedSigner], key: str, namespace: str, when: datetime | float | int | None = None
) -> list[str]:
    """The principal patterns of every entry that lists ``key`` (plain, not cert-authority), allows
    ``namespace`` and is valid at ``when`` (default now), in file order without repeats."""
    wanted = _canonical_key(key)
    now = _verify_time(when)
    out: list[str] = []
    for s in signers:
        if (
            wanted is not None
            and not s.cert_authority
            and s.key == wanted
            and s.allows_namespace(namespace)
            and s.valid_at(now)
        ):
            out.extend(p for p in s.principals if p not in out)
    return out


def allowed(
    signers: Iterable[AllowedSigner],
    principal: str,
    key: str,
    namespace: str,
    when: datetime | float | int | None = None,
) -> bool:
    """Whether some entry matches ``principal`` (OpenSSH pattern list), lists ``key``, allows ``namespace`` and
    is valid at ``when`` (default now): what ``ssh-keygen -Y verify -I principal -n namespace`` checks."""
    wanted = _canonical_key(key)
    if wanted is None:
        return False
    now = _verify_time(when)
    return any(
        not s.cert_authority
        and s.key == wanted
        and s.matches_principal(principal)
        and s.allows_namespace(namespace)
        and s.valid_at(now)
        for s in signers
    )


# --- OpenSSH pattern matching (match.c) -------------------------------------------------------------------

_STAR, _QMARK, _BANG, _COMMA = b"*?!,"
_MAX_SUBPATTERN = 1023  # match.c: a longer sub-pattern makes the whole list fail


def _match_pattern(s: bytes, p: bytes) -> bool:
    """``*`` = any run, ``?`` = any one byte, everything else literal; linear-time backtracking."""
    si = pi = 0
    star = -1
    mark = 0
    while si < len(s):
        if pi < len(p) and p[pi] == _STAR:
            star, mark = pi, si
            pi += 1
        elif pi < len(p) and (p[pi] == _QMARK or p[pi] == s[si]):
            si += 1
            pi += 1
        elif star >= 0:
            pi = star + 1
            mark += 1
            si = mark
        else:
            return False
    while pi < len(p) and p[pi] == _STAR:
        pi += 1
    return pi == len(p)


def _match_pattern_list(string: str, patterns: str) -> int:
    """OpenSSH match_pattern_list (case-sensitive): 1 if some sub-pattern matches and no ``!``-negated one does,
    -1 if a negated one matches, 0 otherwise."""
    s = string.encode("utf-8", "surrogatepass")
    subs = patterns.encode("utf-8", "surrogatepass").split(b",")
    if subs[-1] == b"":  # match.c never sees an empty last sub-pattern ("" or a trailing comma)
        subs.pop()
    got_positive = 0
    for sub in subs:
        negated = sub[:1] == b"!"
        if negated:
            sub = sub[1:]
        if len(sub) >= _MAX_SUBPATTERN:
            return 0
        if _match_pattern(s, sub):
            if negated:
                return -1
            got_positive = 1
    return got_positive
