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

The package's modules: wire (encoding, armor, fingerprints), keys (private key files), signatures (sign,
verify), agent (ssh-agent), allowed (allowed_signers), patterns (match.c).

Importing this package is cheap: ``cryptography`` (and hashlib) are imported inside the functions that need
them. Errors: every verification failure is ``InvalidRecord``; every key-file problem is ``ConfigError``;
messages are one line and never carry key material. Passing the wrong Python types or an empty namespace is
a programming error (``TypeError``/``ValueError``).
"""

from __future__ import annotations

from gitlease.identity.sshsig.agent import AgentKey
from gitlease.identity.sshsig.allowed import AllowedSigner, allowed, parse_allowed_signers, principals_for
from gitlease.identity.sshsig.keys import SigningKey, generate_key
from gitlease.identity.sshsig.signatures import sign, verify
from gitlease.identity.sshsig.wire import HASH_ALG, KEY_TYPE, fingerprint_of

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
