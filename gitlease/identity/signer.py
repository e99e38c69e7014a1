"""Who signs lease versions. The service sees only this small interface; SSHSIG lives in the sshsig package and
``cryptography`` is imported only when a key is loaded (``load_signer``). The configured key
(``lease.signingKey``) is loaded on first use (``KeySigner``): a read whose every version is already verified
(trust.VerifiedCache) never loads it, so it costs nothing there, and a key file that is missing or unreadable is
reported (ConfigError) by whatever needs the key: a write, a signature, the key's identity."""

from __future__ import annotations

import os

NAMESPACE = "gitlease"  # SSHSIG namespace of every lease version
ADMIN_NAMESPACE = "gitlease-admin"  # allowed_signers namespace of keys that may force-release and reclaim


class Signer:
    """Unsigned mode: for a single machine with a local store and no trust file."""

    public_key: str | None = None
    fingerprint: str | None = None

    @property
    def configured(self) -> bool:
        """Whether a key is configured (known without loading it: see KeySigner)."""
        return self.public_key is not None

    def sign(self, data: bytes) -> bytes | None:
        return None


UNSIGNED = Signer()


class SshSigner(Signer):
    """SSHSIG (``ssh-keygen -Y sign -n gitlease``) with an Ed25519 OpenSSH private key file, in-process."""

    def __init__(self, key: object) -> None:  # key: sshsig.SigningKey or sshsig.AgentKey
        from gitlease.identity.sshsig import AgentKey, SigningKey

        if not isinstance(key, (SigningKey, AgentKey)):
            raise TypeError("SshSigner needs a sshsig.SigningKey or sshsig.AgentKey")
        self._key = key
        self.public_key = key.public_key()
        self.fingerprint = key.fingerprint()
        self.path = key.path

    def sign(self, data: bytes) -> bytes:
        from gitlease.identity.sshsig import sign

        return sign(self._key, data, NAMESPACE).encode("ascii")

    def __repr__(self) -> str:
        return f"SshSigner({self.fingerprint})"


class KeySigner(Signer):
    """The signer of a ``lease.signingKey`` value, loaded (``load_signer``) the first time something needs it:
    its public key, its fingerprint, a signature. Until then nothing is read and ``cryptography`` is not
    imported; ``configured`` is true without loading. A key that cannot be loaded raises ConfigError at each
    use (the same message as an eager load), so every command that needs it fails with that one line."""

    def __init__(self, value: str) -> None:
        self.value = value
        self._loaded: SshSigner | None = None

    @property
    def configured(self) -> bool:
        return True

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def load(self) -> SshSigner:
        if self._loaded is None:
            self._loaded = load_signer(self.value)
        return self._loaded

    @property
    def public_key(self) -> str | None:  # type: ignore[override]
        return self.load().public_key

    @property
    def fingerprint(self) -> str | None:  # type: ignore[override]
        return self.load().fingerprint

    @property
    def path(self) -> str | None:
        return self.load().path

    def sign(self, data: bytes) -> bytes:
        return self.load().sign(data)

    def __repr__(self) -> str:
        return f"KeySigner({self._loaded.fingerprint if self._loaded else self.value!r})"


def load_signer(value: str) -> SshSigner:
    """The signer of ``lease.signingKey``. ConfigError on any problem. Like git's ``user.signingKey`` for ssh:

    * a private key file (``~`` expanded): an unencrypted OpenSSH Ed25519 key, used in-process;
    * a public key file (``.pub`` content), or a literal ``key::ssh-ed25519 AAAA...``: the key is in ssh-agent
      (``SSH_AUTH_SOCK``), which signs."""
    from gitlease.core.errors import ConfigError
    from gitlease.identity.sshsig import AgentKey, SigningKey

    literal = value[len("key::") :] if value.startswith("key::") else None
    if literal is None and value.startswith("ssh-"):
        literal = value
    path = os.path.expanduser(value)
    if literal is None:
        try:
            with open(path, "rb") as fh:
                head = fh.read(8192)
        except OSError:
            head = b""  # SigningKey.load says what is wrong with the file
        if head.startswith(b"ssh-"):
            try:
                literal = head.decode("ascii").splitlines()[0]
            except (UnicodeDecodeError, IndexError):
                raise ConfigError(f"signing key {value}: not a public key file") from None
    if literal is not None:
        return SshSigner(AgentKey(literal))
    return SshSigner(SigningKey.load(path))


def commit_signing_config(signing_key: str | None) -> list[tuple[str, str]]:
    """The git config that makes ``git commit`` sign with the lease's own key (git's SSH commit signing,
    ``gpg.format=ssh``), so that a ``Lease:`` trailer or ``-o lease=`` claim in those commits is honoured on a
    signed store (gitlease/enforce/claims.py). ``git lease run`` puts it in its command's environment, the
    worktree manager in an attached worktree's own config. Empty when no key is configured."""
    if not signing_key:
        return []
    value = signing_key
    if value.startswith("ssh-"):
        value = "key::" + value
    elif not value.startswith("key::"):
        value = os.path.abspath(os.path.expanduser(value))
    return [("gpg.format", "ssh"), ("user.signingKey", value), ("commit.gpgSign", "true")]


def config_env(pairs: list[tuple[str, str]], env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``pairs`` added as git configuration (GIT_CONFIG_COUNT/KEY_n/VALUE_n, after any already
    there): what git reads for every command run with that environment."""
    if not pairs:
        return env
    out = dict(env)
    count = out.get("GIT_CONFIG_COUNT", "")
    n = int(count) if count.isdigit() else 0
    for i, (key, value) in enumerate(pairs, n):
        out[f"GIT_CONFIG_KEY_{i}"] = key
        out[f"GIT_CONFIG_VALUE_{i}"] = value
    out["GIT_CONFIG_COUNT"] = str(n + len(pairs))
    return out
