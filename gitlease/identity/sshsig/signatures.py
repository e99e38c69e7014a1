"""SSHSIG signatures: sign (as ``ssh-keygen -Y sign``) and verify (what ``ssh-keygen -Y sign`` writes).
Part of gitlease.identity.sshsig."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gitlease.core.errors import InvalidRecord
from gitlease.core.procs import site_packages

if TYPE_CHECKING:  # pragma: no cover
    pass

from gitlease.identity.sshsig.agent import AgentKey
from gitlease.identity.sshsig.keys import SigningKey
from gitlease.identity.sshsig.wire import (
    _HASH_ALGS,
    _KEY_TYPE_B,
    _MAX_ARMOR,
    _SIG_BEGIN,
    _SIG_END,
    _SIG_MAGIC,
    _SIG_VERSION,
    _WS,
    HASH_ALG,
    KEY_TYPE,
    _b64,
    _check_namespace,
    _ed25519_pub,
    _hash,
    _Malformed,
    _Reader,
    _show,
    _signed_data,
    _string,
    _u32,
    _unb64,
    _wrap,
)

# --- signatures -------------------------------------------------------------------------------------------


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


def verify(armored: str | bytes, data: bytes, namespace: str) -> str:
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

    site_packages()  # a hook started with python -S
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(pub).verify(raw_sig, _signed_data(ns, b"", hash_alg, _hash(alg, data)))
    except (InvalidSignature, ValueError):
        raise InvalidRecord("signature does not verify") from None
    return KEY_TYPE + " " + _b64(public)
