"""The lease service as the trust authority: which trust file applies, whether this writer's key may write what
it is about to write (an owner's, an admin's), refused before anything is written.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gitlease.core.errors import (
    Forbidden,
    RemoteUnavailable,
    UntrustedWriter,
)
from gitlease.core.record import Record
from gitlease.identity.signer import ADMIN_NAMESPACE
from gitlease.service.base import ServiceBase
from gitlease.service.reader import _unsigned_cache

if TYPE_CHECKING:
    from gitlease.identity.trust import Trust


class Authority(ServiceBase):
    """A role of ``LeaseService`` (gitlease/service/leases.py): see this module's docstring."""

    def trust(self, *, offline: bool = False) -> Trust:
        """The trust file of this store (read once per service; see trust.load_trust). With a signing key
        configured a missing trust file is an error (InvalidRecord, exit 5); an unparsable one always is."""
        if self._trust is not None:
            return self._trust
        from gitlease.identity.trust import load_trust

        trust = load_trust(
            self.store,
            self.settings.allowed_signers,
            cache_dir=self.repo.shared_dir(),
            required=self.signer.configured,  # known without loading the key (signer.KeySigner)
            offline=offline,
        )
        if not offline:
            self._trust = trust
        return trust

    def _needs_trust_file(self) -> bool:
        """Whether the next read of the trust file will ask the store (its default branch's HEAD): not once
        read by this service, nor when the trust file is a local path."""
        return self._trust is None and not os.path.isabs(os.path.expanduser(self.settings.allowed_signers))

    def check_writer(self) -> None:
        """Refuse (UntrustedWriter, exit 5) to write what every reader would report INVALID: on a store whose
        trust file does not trust this client's key (or its lack of one) for its agent id, a lease blocks its
        scope until an admin clears it. Judged by the trust file this clone last read (no network when that
        says yes); a "no" is confirmed by reading the trust file again (the key may have been added since).
        Unsigned and never having read a trust file: nothing to judge, nothing is read."""
        from gitlease.core.cachenames import cache_path

        key = self.signer.public_key
        path = cache_path(self.repo.shared_dir(), "trust", self.store.name)
        cached = os.path.exists(path)
        if key is None and not os.path.isabs(os.path.expanduser(self.settings.allowed_signers)):
            if not cached or _unsigned_cache(path):
                return  # unsigned, and no trust file known: nothing to judge (and no verification code loaded)
        from gitlease.identity.trust import TrustCache, load_trust

        def fresh() -> Trust:
            return load_trust(
                self.store, self.settings.allowed_signers, cache_dir=self.repo.shared_dir(), required=False
            )

        cache = TrustCache(self.repo.shared_dir(), self.store.name)
        trust = self._trust or (cache.load(label=False) if cached else None)
        if os.path.isabs(os.path.expanduser(self.settings.allowed_signers)) or trust is None:
            trust = fresh()
        now = self.clock.now()
        problem = trust.writer_problem(self.settings.agent, key, now)
        if problem and trust is not self._trust:
            try:
                trust = fresh()
            except RemoteUnavailable:
                pass  # the store is unreachable: the write fails there anyway; judge by what was read
            else:
                problem = trust.writer_problem(self.settings.agent, key, now)
        if problem:
            raise UntrustedWriter(
                f"{problem}: every reader would report this lease INVALID and its scope would stay blocked "
                "until an admin clears it; nothing was written",
                agent=self.settings.agent,
                key=self.signer.fingerprint,
                trust=trust.source,
            )

    def require_admin(self, action: str) -> str:
        """The identity allowed to ``action`` (a forced release, a reclaim of a live lease), or Forbidden.

        Unsigned mode (no key, no trust file) has no identities to tell apart: anyone may, and the returned
        name says it was unsigned. Signed mode: only a key the trust file allows namespace ``gitlease-admin``
        (returned as "<principal> (<fingerprint>)"); a store with a trust file refuses a client without a key."""
        trust = self.trust()
        key = self.signer.public_key
        if key is None:
            if trust.signed:
                raise Forbidden(
                    f"{action} needs a {ADMIN_NAMESPACE} key: this store is signed ({trust.source}) "
                    "and lease.signingKey is not set"
                )
            return f"unsigned:{self.settings.agent}"
        principals = trust.admin_principals(key, self.clock.now())
        if not principals:
            raise Forbidden(
                f"{action} needs a {ADMIN_NAMESPACE} key: key {self.signer.fingerprint} is not allowed "
                f"namespace {ADMIN_NAMESPACE} in {trust.source}"
            )
        from gitlease.identity.sshsig import allowed

        name = (
            self.settings.agent
            if allowed(trust.signers or (), self.settings.agent, key, ADMIN_NAMESPACE, when=self.clock.now())
            else principals[0]
        )
        return f"{name} ({self.signer.fingerprint})"

    def require_trusted(self, action: str) -> str:
        """This agent's id, when its key is trusted for it (namespace ``gitlease``), for what an ordinary agent
        may do to another's lease (a same-host dead-holder reclaim); or Forbidden. Unsigned stores: anyone."""
        trust = self.trust()
        key = self.signer.public_key
        agent = self.settings.agent
        if key is None:
            if trust.signed:
                raise Forbidden(
                    f"{action} needs a key trusted for agent {agent!r}: this store is signed ({trust.source}) "
                    "and lease.signingKey is not set"
                )
            return agent
        if not trust.trusted_for(agent, key, self.clock.now()):
            raise Forbidden(
                f"{action} needs a key trusted for agent {agent!r} (or a {ADMIN_NAMESPACE} key): key "
                f"{self.signer.fingerprint} is not, in {trust.source}"
            )
        return agent

    def _require_owner_key(self, rec: Record, action: str) -> None:
        """Owner binding on the writer's side: a lease is renewed or released only with the key that signed
        its version 1 (or, unsigned, only without a key)."""
        if rec.owner.key == self.signer.public_key:
            return
        if rec.owner.key is None:
            raise Forbidden(
                f"cannot {action} {rec.lease_id}: it was acquired unsigned, and lease.signingKey is "
                "now set (unset it to renew or release this lease)"
            )
        from gitlease.identity.sshsig import fingerprint_of

        mine = self.signer.fingerprint or "no key (lease.signingKey is not set)"
        raise Forbidden(
            f"cannot {action} {rec.lease_id}: it is owned by key {fingerprint_of(rec.owner.key)}, "
            f"and this client signs with {mine}"
        )
