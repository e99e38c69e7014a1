"""What every role of the lease service shares: the repository, its settings, the store, the clock, the signer,
the object writer and this worktree's held state; how a version is written; how an unclear outcome is
settled by re-reading; the last listing kept for the hooks (``_RefsCache``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING

from gitlease.core.clock import SYSTEM, Clock
from gitlease.core.config import NO_STORE, Settings
from gitlease.core.errors import (
    RemoteUnavailable,
    UsageError,
)
from gitlease.core.objects import ObjectWriter, ident_for
from gitlease.core.record import Record
from gitlease.core.repo import Repo
from gitlease.core.state import Held, HeldState
from gitlease.core.store import (
    Outcome,
    RefUpdate,
    Store,
    open_store,
)
from gitlease.identity.signer import UNSIGNED, Signer

if TYPE_CHECKING:
    import contextlib

    from gitlease.identity.trust import Trust
    from gitlease.service.audit import AuditLog
    from gitlease.service.results import Renewed
    from gitlease.service.views import LeaseView, Snapshot


class ServiceBase:
    """A role of ``LeaseService`` (gitlease/service/leases.py): see this module's docstring."""

    def __init__(
        self,
        repo: Repo,
        settings: Settings,
        *,
        store: Store | None = None,
        clock: Clock = SYSTEM,
        signer: Signer = UNSIGNED,
    ) -> None:
        self.repo = repo
        self.settings = settings
        self.store = store or open_store(repo.cwd, settings.remote, timeout=settings.timeout)
        self.clock = clock
        self.signer = signer
        self.objects = ObjectWriter(repo.objects_dir, repo.object_format)
        self.held = HeldState(repo.private_dir())
        self._trust: Trust | None = None
        self.warnings: list[str] = []  # said once per service, not printed (verdict.doctor_gate)
        if self.store.capabilities.network and self.store.on_applied is None:
            # what lands is written into the last listing the hooks and the edit guard read (no network there):
            # a lease released here stops blocking at once, a new one blocks at once
            self.store.on_applied = _RefsCache(repo.shared_dir(), self.store.name).patch

    def _write_version(self, rec: Record, parent: str | None, action: str) -> str:
        data = rec.canonical()
        sig = self.signer.sign(data)
        msg = f"{action} {rec.lease_id} v{rec.version}\n\nscope: {' '.join(rec.paths)}\nexpires: {rec.expires_at}"
        return self.objects.lease_commit(
            data,
            sig,
            (parent,) if parent else (),
            ident_for(rec.owner.agent_id, rec.owner.host),
            int(self.clock.now()),
            msg,
        )

    def _repo_name(self) -> str:
        if self.settings.repo_name:
            return self.settings.repo_name
        if self.settings.remote:
            return _strip_userinfo(self.settings.remote)
        return "local:" + os.path.basename(self.repo.worktree or self.repo.common_dir.rstrip("/"))

    def _workspace(self) -> str:
        if self.settings.workspace:
            return self.settings.workspace
        return os.path.basename(self.repo.worktree or self.repo.git_dir.rstrip("/")) or "workspace"

    def require_store(self) -> None:
        """Writes, and the reads a user acts on (status, show, can-start, plan, log), need a store chosen on
        purpose: with no ``lease.remote`` in a repository that has remotes, a lease written to this clone's own
        refs would exclude nobody, and a read of them would answer "free" while the scope is held on the shared
        store (UsageError, exit 2)."""
        if self.settings.store_unset and self.repo.remotes and self.store.kind == "local":
            raise UsageError(NO_STORE)

    def held_here(self) -> dict[str, Held]:
        return self.held.load()

    def _resolve(self, updates: Sequence[RefUpdate], out: Outcome, what: str = "write") -> Outcome:
        """After an unclear outcome, re-read and compare with what we meant to write (a delete landed when
        the ref is absent). Never retry blindly."""
        return self._settled(updates, out, self._reread(out, what))

    def _reread(self, out: Outcome, what: str) -> dict[str, str]:
        """The store's refs after an unclear outcome; RemoteUnavailable (nothing assumed) when it cannot be read."""
        out.check_reached()
        try:
            return self.store.list_refs()
        except RemoteUnavailable as exc:
            raise RemoteUnavailable(
                f"outcome of the {what} unknown: {out.message or 'no answer'}; and the store "
                f"cannot be re-read ({exc}); nothing is assumed"
            ) from None

    @staticmethod
    def _settled(updates: Sequence[RefUpdate], out: Outcome, refs: dict[str, str]) -> Outcome:
        landed = all(refs.get(u.ref) == u.new for u in updates)
        return Outcome(
            ok=landed,
            statuses={u.ref: "ok" if refs.get(u.ref) == u.new else "rejected:not landed" for u in updates},
            message=out.message,
        )

    if TYPE_CHECKING:  # what the roles ask of one another: each is defined by the role named above it
        # reader.py: snapshot(*, use_cache, paths, keep, listing)
        snapshot: Callable[..., Snapshot]

        # renewals.py
        def forget(self, lease_id: str) -> None: ...

        # authority.py
        def trust(self, *, offline: bool = False) -> Trust: ...

        # renewals.py
        def held_lease(self, lease_id: str) -> Held: ...

        # renewals.py
        def _settle_pending(self, h: Held) -> Held: ...

        # renewals.py
        def _take_renew_lock(self, lease_id: str) -> IO[str]: ...

        # authority.py
        def _require_owner_key(self, rec: Record, action: str) -> None: ...

        # renewals.py: renew(lease_id, *, ttl, progress, extra_refspecs, stop_after)
        renew: Callable[..., Renewed]

        # reader.py
        def gone_note(self, lease_id: str) -> str | None: ...

        # authority.py
        def check_writer(self) -> None: ...

        # reclaims.py
        @property
        def audit(self) -> AuditLog: ...

        # reader.py
        def _where_held(self, view: LeaseView) -> str: ...

        # renewals.py
        def _renewing(self, lease_id: str) -> contextlib.AbstractContextManager[None]: ...

        # authority.py
        def _needs_trust_file(self) -> bool: ...

        # grants.py
        def _undo_partial(self, attempts: dict[str, tuple[Record, str]], snap: Snapshot | None = None) -> list[str]: ...

        # reclaims.py
        def _clear(self, view: LeaseView) -> bool: ...


def _strip_userinfo(url: str) -> str:
    if "://" in url:
        scheme, rest = url.split("://", 1)
        host, sep, path = rest.partition("/")
        return f"{scheme}://{host.rpartition('@')[2]}{sep}{path}"
    return url


class _RefsCache:
    """The last listing of a store, so reads still answer (marked stale) when the store is unreachable
    (core/listingfile.py)."""

    def __init__(self, folder: str, store_name: str) -> None:
        from gitlease.core import listingfile

        self.path = listingfile.path_in(folder, store_name)

    def save(self, refs: dict[str, str], fetched_at: float) -> None:
        from gitlease.core import listingfile

        try:
            listingfile.write(self.path, refs, fetched_at)
        except OSError:
            pass  # a cache that cannot be written only costs freshness

    def patch(self, updates: Sequence[RefUpdate]) -> None:
        """The writes that just landed, applied to the kept listing (when there is one)."""
        got = self.load()
        if got is None:
            return
        refs, fetched_at = got
        for u in updates:
            if u.new is None:
                refs.pop(u.ref, None)
            else:
                refs[u.ref] = u.new
        self.save(refs, fetched_at)

    def load(self) -> tuple[dict[str, str], float] | None:
        from gitlease.core import listingfile

        return listingfile.read(self.path)
