"""Ed25519 private keys in OpenSSH's file format: load (SigningKey.load), generate (generate_key).
Part of gitlease.identity.sshsig."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gitlease.core.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gitlease.identity.sshsig.wire import (
    _KEY_BEGIN,
    _KEY_END,
    _KEY_MAGIC,
    _KEY_TYPE_B,
    _MAX_KEY_FILE,
    _WS,
    KEY_TYPE,
    _b64,
    _ed25519_blob,
    _ed25519_pub,
    _fingerprint,
    _Malformed,
    _Reader,
    _show,
    _show_path,
    _string,
    _u32,
    _unb64,
    _wrap,
)

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
