"""Group commit for pushes: the plain pushes (atomic, lease refs only) that several threads of one process make
to one store, pushed together when they meet.

A push that finds none under way goes at once. Those that come while one is under way wait for it, then go
together in one atomic push (their updates side by side; a ref two of them update waits for the next group).
When that push lands, each of them landed. When it is refused, none of it landed (the push is atomic), and each
goes again on its own: a push in a group lands exactly when it would have landed alone, and hears its own
refusal. When its outcome is unclear (a timeout, a lost connection), each hears that and settles it by reading
the store, as it would after a push of its own. The group's push is bounded by the shortest bound among them.

A push that must go alone and first (``first()``: the runner's landing push, which releases leases and finishes
tasks) is never kept waiting; while it is under way, the group's pushes wait for it as for one of their own, and
go together when it ends. They do not then compete with it for the server.

Fewer pushes is what a group buys: ten workers of one runner claiming at about the same moment make two or three
pushes instead of ten (docs/work.md: 30 claims in 8 pushes), so the server and its hook judge fewer pushes and a
host's push budget counts fewer. The price: a push may wait for the one under way.

No printing; standard library only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gitlease.core.store import Outcome, RefUpdate, Transaction

PushFn = Callable[[Sequence["RefUpdate"], "Transaction"], "Outcome"]


@dataclass
class _Member:
    where: tuple[str, str]  # its store's repository and remote: only pushes to the same one share a group
    push: PushFn  # its store's own push (one git push)
    updates: list[RefUpdate]
    tx: Transaction
    ready: threading.Event = field(default_factory=threading.Event)
    group: list[_Member] | None = None  # set for the one that pushes a group (the first of it)
    out: Outcome | None = None  # its outcome; None once woken: push again alone

    @property
    def refs(self) -> set[str]:
        return {u.ref for u in self.updates}


class PushGroup:
    """See the module docstring. ``pushes``: the pushes made for members; ``members``: the pushes asked for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = False  # a group's push under way
        self._first = 0  # pushes that go first (first()) under way
        self._waiting: list[_Member] = []
        self.pushes = 0
        self.members = 0

    def push(self, where: tuple[str, str], push: PushFn, updates: Sequence[RefUpdate], tx: Transaction) -> Outcome:
        """``updates`` pushed by ``push`` (the own push of the store at ``where``: its repository and remote),
        alone or with others that meet them here."""
        me = _Member(where, push, list(updates), tx)
        with self._lock:
            self.members += 1
            if self._busy or self._first:
                self._waiting.append(me)
            else:
                self._busy = True
                me.group = [me]
        if me.group is None:
            me.ready.wait()
        if me.group is not None:
            self._push_group(me.group)
        if me.out is None:  # its group was refused: alone now, as it would have been
            with self._lock:
                self.pushes += 1
            return push(me.updates, tx)
        return me.out

    def _push_group(self, group: list[_Member]) -> None:
        from gitlease.core.store import Outcome, Transaction

        try:
            with self._lock:
                self.pushes += 1
            if len(group) == 1:
                group[0].out = group[0].push(group[0].updates, group[0].tx)
                return
            first = group[0]
            timeout = min(m.tx.timeout for m in group)
            merged = first.push([u for m in group for u in m.updates], Transaction(timeout))
            if merged.ok or merged.ambiguous:
                for m in group:
                    mine = m.refs
                    m.out = Outcome(
                        ok=merged.ok,
                        ambiguous=merged.ambiguous,
                        statuses={r: s for r, s in merged.statuses.items() if r in mine},
                        message=merged.message,
                        server=list(merged.server),
                        connected=merged.connected,
                    )
            # refused: every m.out stays None, each pushes again alone
        finally:
            self._next(group_ended=True)
            for m in group[1:]:
                m.ready.set()

    @contextlib.contextmanager
    def first(self) -> Iterator[None]:
        """Around a push that goes alone and first: it waits for nothing here, and the group's pushes that come
        meanwhile wait for its end (then they go together)."""
        with self._lock:
            self._first += 1
        try:
            yield
        finally:
            self._next(first_ended=True)

    def _next(self, *, group_ended: bool = False, first_ended: bool = False) -> None:
        """A push under way ended: the next group, from those waiting (in arrival order; one whose refs meet the
        group's, or that pushes elsewhere, waits for the one after), handed to its first member to push, once
        no push is under way."""
        with self._lock:
            if group_ended:
                self._busy = False
            if first_ended:
                self._first -= 1
            if self._busy or self._first:
                return  # the push under way starts the next group when it ends
            group: list[_Member] = []
            refs: set[str] = set()
            rest: list[_Member] = []
            for m in self._waiting:
                if m.refs & refs or (group and m.where != group[0].where):
                    rest.append(m)
                else:
                    group.append(m)
                    refs |= m.refs
            self._waiting = rest
            if not group:
                return
            self._busy = True
            group[0].group = group
        group[0].ready.set()


def plain(tx: Transaction) -> bool:
    """Whether a push may share a group with others: atomic, lease refs only, no client hook."""
    return tx.atomic and not tx.extra_refspecs and not tx.run_hooks


__all__ = ["PushGroup", "plain"]
