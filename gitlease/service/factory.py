"""Opening the service: the repository at a path, its settings (git config, then environment, then the
arguments), and the signer they name. The Python API (``gitlease.open_service``), the CLI, ``hold()`` and
the renewal agent all open the service here."""

from __future__ import annotations

from typing import Any

from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.config import Settings, resolve
from gitlease.core.repo import Repo
from gitlease.identity.signer import UNSIGNED, Signer
from gitlease.service.leases import LeaseService


def signer_for(settings: Settings) -> Signer:
    """UNSIGNED, or the SSHSIG signer of ``lease.signingKey``, loaded when first needed (signer.KeySigner: a read
    that verifies nothing new never reads the key nor imports cryptography; a key that cannot be loaded is a
    ConfigError where it is needed)."""
    if settings.signing_key:
        from gitlease.identity.signer import KeySigner

        return KeySigner(settings.signing_key)
    return UNSIGNED


def open_service(
    path: str = ".",
    *,
    remote: str | None = None,
    clock: Clock | None = None,
    signer: Signer | None = None,
    **flags: Any,
) -> LeaseService:
    """A LeaseService for the repository (worktree) at ``path``, settings resolved as the CLI does."""
    repo = Repo.discover(path)
    settings = resolve(repo.config, remote=remote, **flags)
    return LeaseService(
        repo, settings, clock=clock or SYSTEM, signer=signer_for(settings) if signer is None else signer
    )
