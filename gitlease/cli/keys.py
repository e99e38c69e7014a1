"""Keys: ``git lease keygen`` makes an Ed25519 OpenSSH key for an agent and prints its allowed_signers line."""

from __future__ import annotations

import os
import re
from typing import Annotated

import typer

from gitlease.cli.common import command
from gitlease.cli.options import JsonOpt, make_app
from gitlease.core import errors

app = make_app()

_PRINCIPAL = re.compile(r"^[A-Za-z0-9._@+=:/-]{1,200}$")  # no pattern characters, commas, quotes or spaces


def _default_agent() -> str:
    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo

    try:
        config = Repo.discover(".").config
    except errors.GitLeaseError:
        config = {}
    return resolve(config).agent


@app.command()
@command("keygen")
def keygen(
    agent: Annotated[
        str | None, typer.Option(help="Agent id the key is for (default: $GITLEASE_AGENT, lease.agent).")
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            "--output", "-o", help="Private key file to write (and .pub next to it; default: ~/.ssh/gitlease_<agent>)."
        ),
    ] = None,
    admin: Annotated[
        bool,
        typer.Option(
            "--admin",
            help="Print a line that also allows namespace gitlease-admin (forced release, reclaim of live leases).",
        ),
    ] = False,
    as_json: JsonOpt = False,
):
    """Make an Ed25519 OpenSSH key for an agent; print the allowed_signers line to commit and the config to set."""
    from gitlease.identity.signer import ADMIN_NAMESPACE, NAMESPACE
    from gitlease.identity.sshsig import generate_key

    who = agent or _default_agent()
    if not _PRINCIPAL.match(who):
        raise errors.UsageError(
            f"agent id {who!r} cannot be an allowed_signers principal: use letters, digits and . _ @ + = : / - only"
        )
    path = output or os.path.join("~", ".ssh", "gitlease_" + re.sub(r"[^A-Za-z0-9._-]", "_", who))
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    key = generate_key(path, comment=who)
    namespaces = f"{NAMESPACE},{ADMIN_NAMESPACE}" if admin else NAMESPACE
    line = f'{who} namespaces="{namespaces}" {key.public_key()}'
    lines = [
        f"key written: {path} (public key: {path}.pub)",
        f"fingerprint: {key.fingerprint()}",
        "trust it (its own signer file on the default branch; --no-push to commit it through review):",
        f"  git lease trust add {re.sub(r'[^A-Za-z0-9._@+=-]', '_', who)} --key {path}.pub --agents {who}"
        + (" --admin" if admin else ""),
        f"(or add this line to .gitlease/allowed_signers there: {line})",
        "then, in the agent's repository:",
        f"  git config lease.signingKey {path}",
        f"  git config lease.agent {who}",
    ]
    return {
        "agent": who,
        "path": path,
        "publicKey": key.public_key(),
        "fingerprint": key.fingerprint(),
        "allowedSigners": line,
        "admin": admin,
    }, lines
