"""Who signs lease versions. The service sees only this small interface; SSHSIG lives in sshsig.py and is
imported only when a key is configured (cryptography is not a start-up cost)."""
from __future__ import annotations


class Signer:
    """Unsigned mode: for a single machine with a local store and no trust file."""

    public_key: str | None = None
    fingerprint: str | None = None

    def sign(self, data: bytes) -> bytes | None:
        return None


UNSIGNED = Signer()
