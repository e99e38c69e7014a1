"""What the lease service's operations return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from gitlease.core.errors import GitLeaseError
from gitlease.core.record import Record
from gitlease.core.store import RefUpdate

if TYPE_CHECKING:
    from gitlease.identity.replay import Memory


@dataclass(frozen=True)
class Acquired:
    lease_id: str
    record: Record
    oid: str
    cleared: tuple[str, ...] = ()  # expired leases cleared on the way
    piggybacked: bool = False  # the ``piggyback`` updates landed in the same push


@dataclass(frozen=True)
class Renewed:
    lease_id: str
    record: Record
    oid: str


class _RenewLockHolder:
    """A prepared write holding its lease's renew lock (``lock``, a file with an flock) until ``close``."""

    lock: IO | None

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()  # closing the file drops the flock
            self.lock = None


@dataclass
class PreparedRenewal(_RenewLockHolder):
    """A renewal ready to push (``LeaseService.prepare_renewal``): the id-ref update and the new record; and,
    when it took one, the lease's renew lock (held until ``settle_renewal`` or ``close``)."""

    lease_id: str
    update: RefUpdate
    record: Record
    lock: IO | None = None


@dataclass
class PreparedRelease(_RenewLockHolder):
    """A release ready to push with other updates (``LeaseService.prepare_release``): the deletes of the lease's
    refs, its audit entry's fields and the version it points at; the lease's renew lock, held until ``close``."""

    lease_id: str
    updates: list[RefUpdate]
    fields: dict[str, Any]
    pointer: str | None
    lock: IO | None = None


class Busy(GitLeaseError):
    """The lease is being renewed or released by its holder right now: not renewed this time."""

    kind = "busy"


@dataclass(frozen=True)
class Listing:
    """The store's refs from one ``ls-remote`` that also answered the remote's HEAD (``LeaseService.listing``),
    with the replay memory as it was before that listing began: what a snapshot of it is judged against."""

    refs: dict[str, str]
    head: str | None  # the commit of the remote's HEAD, or None
    before: Memory


@dataclass(frozen=True)
class Released:
    """What ``release`` did (always true as a value). ``already``: the lease was gone before this call (released
    earlier, or reclaimed), and ``note`` says how; ``piggybacked``: the ``piggyback`` updates landed in the same
    push; ``audit``: the commit of the audit entry that records the release."""

    lease_id: str
    already: bool = False
    piggybacked: bool = False
    audit: str | None = None
    note: str = ""
