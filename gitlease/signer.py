"""Who signs lease versions. The service sees only this small interface; SSHSIG lives in sshsig.py and
``cryptography`` is imported only when a key is configured (``load_signer``), so it is not a start-up cost of
unsigned commands."""
from __future__ import annotations

import os

NAMESPACE = "gitlease"  # SSHSIG namespace of every lease version
ADMIN_NAMESPACE = "gitlease-admin"  # allowed_signers namespace of keys that may force-release and reclaim


class Signer:
    """Unsigned mode: for a single machine with a local store and no trust file."""

    public_key: str | None = None
    fingerprint: str | None = None

    def sign(self, data: bytes) -> bytes | None:
        return None


UNSIGNED = Signer()


class SshSigner(Signer):
    """SSHSIG (``ssh-keygen -Y sign -n gitlease``) with an Ed25519 OpenSSH private key file, in-process."""

    def __init__(self, key: object) -> None:  # key: sshsig.SigningKey
        from .sshsig import SigningKey

        if not isinstance(key, SigningKey):
            raise TypeError("SshSigner needs a sshsig.SigningKey")
        self._key = key
        self.public_key = key.public_key()
        self.fingerprint = key.fingerprint()
        self.path = key.path

    def sign(self, data: bytes) -> bytes:
        from .sshsig import sign

        return sign(self._key, data, NAMESPACE).encode("ascii")

    def __repr__(self) -> str:
        return f"SshSigner({self.fingerprint})"


def load_signer(path: str) -> SshSigner:
    """The signer of ``lease.signingKey`` (a private key file; ``~`` is expanded). ConfigError on any problem.

    ssh-agent keys are not supported: the key must be an unencrypted OpenSSH Ed25519 private key file."""
    from .sshsig import SigningKey

    return SshSigner(SigningKey.load(os.path.expanduser(path)))
