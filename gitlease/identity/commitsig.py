"""Who signed a commit: git's own SSH commit signatures (``gpg.format=ssh``), checked in-process.

git signs a commit by putting an armored SSHSIG (namespace ``git``) of the commit object without its
signature header into a ``gpgsig`` header (``gpgsig-sha256`` in a SHA-256 repository): each further line of
the header starts with one space. ``signer`` undoes exactly that and verifies the signature with
``gitlease.identity.sshsig`` (Ed25519, as gitlease's own keys), returning the signing key; the caller compares
it with the key it expects (a lease's owner key). Nothing here reads a trust file or runs git.
"""

from __future__ import annotations

from gitlease.core.errors import InvalidRecord

NAMESPACE = "git"  # what `git commit -S` signs in (ssh-keygen -Y sign -n git)
HEADERS = (b"gpgsig", b"gpgsig-sha256")


def split_signed(raw: bytes, object_format: str = "sha1") -> tuple[bytes, str] | None:
    """(the signed payload, the armored signature) of a raw commit object, or None when it is not signed for
    this object format. The payload is the object without any signature header (as git verifies it)."""
    wanted = b"gpgsig" if object_format == "sha1" else b"gpgsig-sha256"
    head, sep, body = raw.partition(b"\n\n")
    lines = head.split(b"\n")
    kept: list[bytes] = []
    sig: list[bytes] | None = None
    current: list[bytes] | None = None
    for line in lines:
        if line.startswith(b" ") and current is not None:
            current.append(line[1:])
            continue
        current = None
        name, _, value = line.partition(b" ")
        if name in HEADERS:
            current = [value]
            if name == wanted:
                if sig is not None:
                    return None  # two signatures of one kind: not what git writes
                sig = current
            continue
        kept.append(line)
    if sig is None:
        return None
    payload = b"\n".join(kept) + sep + body
    try:
        return payload, b"\n".join(sig).decode("ascii")
    except UnicodeDecodeError:
        return None


def signer(raw: bytes, object_format: str = "sha1") -> tuple[str | None, str | None]:
    """(``"ssh-ed25519 <base64>"`` of the key whose SSH signature of this commit verifies, or None; why not)."""
    split = split_signed(raw, object_format)
    if split is None:
        return None, "the commit is not signed"
    payload, armored = split
    if "BEGIN SSH SIGNATURE" not in armored:
        return None, "the commit is not signed with an SSH key (gpg.format=ssh)"
    from gitlease.identity import sshsig

    try:
        return sshsig.verify(armored, payload, NAMESPACE), None
    except InvalidRecord as exc:
        return None, f"its signature does not verify: {exc.message}"


def key_words(key: str | None) -> str | None:
    """'ssh-ed25519 <b64>' of a public key text (comment dropped), or None."""
    if not key:
        return None
    words = key.split()
    return " ".join(words[:2]) if len(words) >= 2 else None


__all__ = ["split_signed", "signer", "key_words", "NAMESPACE"]
