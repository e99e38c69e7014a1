"""Signing with a key held by ssh-agent (AgentKey), over the agent's socket protocol.
Part of gitlease.identity.sshsig."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gitlease.core.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import socket

from gitlease.identity.sshsig.wire import (
    _KEY_TYPE_B,
    KEY_TYPE,
    _b64,
    _ed25519_pub,
    _fingerprint,
    _Malformed,
    _parse_public_key,
    _Reader,
    _show_path,
    _string,
    _u32,
)

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


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConfigError("ssh-agent closed the connection")
        buf += chunk
    return buf
