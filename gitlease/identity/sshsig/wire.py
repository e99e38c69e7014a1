"""SSH wire encoding (RFC 4251 uint32 and string), base64 armor, Ed25519 public key blobs and fingerprints.
Part of gitlease.identity.sshsig."""

from __future__ import annotations

import binascii
import os
from typing import TYPE_CHECKING

from gitlease.core.errors import InvalidRecord

if TYPE_CHECKING:  # pragma: no cover
    pass

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


def _show_path(path: object) -> str:
    try:
        text = os.fspath(path)  # type: ignore[call-overload]
    except TypeError:
        return repr(path)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    return text if text.isprintable() else repr(text)


# --- what a signature signs ---------------------------------------------------------------------------


def _check_namespace(namespace: str) -> bytes:
    if not isinstance(namespace, str):
        raise TypeError("namespace must be a str")
    if not namespace or "\0" in namespace:
        raise ValueError("namespace must be a non-empty string without NUL")
    return namespace.encode("utf-8")


def _hash(alg: str, data: bytes) -> bytes:
    import hashlib

    digest: bytes = hashlib.new(alg, data).digest()
    return digest


def _signed_data(namespace: bytes, reserved: bytes, hash_alg: bytes, digest: bytes) -> bytes:
    return _SIG_MAGIC + _string(namespace) + _string(reserved) + _string(hash_alg) + _string(digest)
