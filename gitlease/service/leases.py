"""The lease service: acquire, renew, release, status, show, can-start.

It owns the protocol (docs/protocol.md): which refs a lease has, how each change is one compare-and-swap
transaction, how ambiguous outcomes are resolved by re-reading, and when an expired blocker may be cleared.
It prints nothing and never exits; the CLI renders what it returns.

``LeaseService`` is one object for its callers, made of one module per role:

* ``base.py``: what the roles share (the repository, settings, store, clock, signer, held state; writing a
  version; settling an unclear outcome);
* ``authority.py``: the trust file, and whether this writer may write what it is about to;
* ``reader.py``: reading the store (``snapshot``, ``status``, ``can_start``, ``show``);
* ``grants.py``: taking and giving back (``acquire``, ``release``) for one worktree;
* ``renewals.py``: keeping (``renew``, ``prepare_renewal``/``settle_renewal``, ``extend``, ``narrow``);
* ``reclaims.py``: reclaiming stale leases, audited;
* ``fencing.py``: the fenced push (branches and the renewal in one atomic push).

What the operations return is in ``results.py``.
"""

from __future__ import annotations

from gitlease.core.refnames import id_ref, scope_ref
from gitlease.service.authority import Authority
from gitlease.service.base import _RefsCache
from gitlease.service.fencing import Fencing
from gitlease.service.grants import Grants
from gitlease.service.reader import Reader
from gitlease.service.reclaims import Reclaims
from gitlease.service.renewals import Renewals
from gitlease.service.results import Acquired, Busy, Listing, PreparedRenewal, Released, Renewed
from gitlease.service.views import HistoryEntry, LeaseView, Snapshot, build_views, held_error


class LeaseService(Reader, Grants, Renewals, Reclaims, Fencing, Authority):
    """The lease service (module docstring): its roles composed; constructed as ``ServiceBase`` is."""


__all__ = [
    "LeaseService",
    "LeaseView",
    "Snapshot",
    "Acquired",
    "Renewed",
    "PreparedRenewal",
    "Busy",
    "Released",
    "Listing",
    "HistoryEntry",
    "id_ref",
    "scope_ref",
    "build_views",
    "held_error",
    "_RefsCache",
]
