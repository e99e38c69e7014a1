"""A holder's side of the renewal agent (issue 11): ``hold()`` and ``git lease run`` hand their lease to the
per-host agent (gitlease/liveness/agent.py) instead of pushing a renewal each, and fall back to renewing by themselves
when the agent is gone.

* ``AgentLink.connect`` starts the agent on demand (``AgentClient.ensure_running``) unless the holder opted out
  (``renew_agent=False``, ``--no-renew-agent``, git config ``lease.renewAgent false``, or
  ``GITLEASE_RENEW_AGENT=0``) or the leases are in the repository's own refs (no pushes to save).
* ``acquire`` / ``release`` go through the agent, so due renewals of other local leases ride in the same push;
  when the agent cannot be reached the holder does them itself (after checking its held state, when a request
  was sent but unanswered, so nothing is done twice).
* ``AgentAttempt`` is the heartbeat's Attempt (gitlease/liveness/heartbeat.py): it asks the agent for the lease's state.
  ``lost`` is a refused renewal (LeaseLost: the stop signal). A newer expiry is a confirmed renewal. An agent
  late enough that waiting one more interval would leave no time for a renewal of its own: the holder renews
  itself this once. An agent that does not answer, or no longer knows the lease: the holder renews itself
  from then on (``fallen``), within the same attempt's budget, so no deadline is missed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from gitlease.core import record as records
from gitlease.core.clock import parse_iso
from gitlease.core.errors import LeaseLost, RemoteUnavailable
from gitlease.liveness.agent import AgentClient, AgentNoAnswer, AgentRefused, AgentUnreachable, raise_refusal
from gitlease.liveness.heartbeat import MIN_ATTEMPT, Attempt, Confirmed, Timing


def wanted(svc, renew_agent: bool | None) -> bool:
    if renew_agent is not None:
        return bool(renew_agent)
    if not svc.store.capabilities.network:  # no pushes to save
        return False
    return svc.settings.renew_agent


class AgentLink:
    """One holder's connection to the agent: its service (for identity and falling back) and the client."""

    def __init__(self, svc, client: AgentClient, log: Callable[[str], None] | None = None) -> None:
        self.svc, self.client = svc, client
        self.log = log or (lambda line: None)

    @classmethod
    def connect(
        cls,
        svc,
        renew_agent: bool | None = None,
        *,
        client: AgentClient | None = None,
        log: Callable[[str], None] | None = None,
    ) -> AgentLink | None:
        if not wanted(svc, renew_agent):
            return None
        client = client or AgentClient()
        try:
            up = client.ensure_running()
        except OSError:
            up = False
        if not up:
            (log or (lambda line: None))(f"renewal agent: none answers on {client.path}; renewing by itself")
            return None
        return cls(svc, client, log)

    # ------------------------------------------------------------------ requests
    def _who(self) -> dict:
        """The holder's identity for the agent: ids, its public key, and where that key is (``keyRef``: an
        absolute key file, or ``key::<public key>`` for a key in ssh-agent), so the agent signs exactly as the
        holder would, whatever its own working directory and configuration (or refuses, and the holder renews
        by itself)."""
        s, signer = self.svc.settings, self.svc.signer
        ref = None
        if signer.public_key:
            path = getattr(signer, "path", None)
            ref = os.path.abspath(os.path.expanduser(str(path))) if path else f"key::{signer.public_key}"
        return {"agent": s.agent, "task": s.task, "workspace": s.workspace, "key": signer.public_key, "keyRef": ref}

    def _long(self) -> float:
        return max(self.client.timeout, float(self.svc.settings.timeout) * 4)

    def _call(self, op: str, **kw) -> dict:
        ans = self.client.request(
            op, timeout=self._long(), repo=self.svc.repo.cwd, remote=self.svc.settings.remote, who=self._who(), **kw
        )
        if not ans.get("ok"):
            raise_refusal(ans)
        return ans

    # LeaseService.acquire's keyword arguments the agent takes, and their names on the wire
    _WIRE = {
        "ttl": "ttl",
        "holder_pid": "pid",
        "renew_every": "renewEvery",
        "replace": "replace",
        "stop_after": "stopAfter",
    }

    def acquire(self, raw_scopes: Sequence[str], **kw: Any):
        """``LeaseService.acquire(raw_scopes, **kw)`` through the agent (due renewals ride along); by itself when
        the agent is gone or refuses. ``kw``: the arguments in ``_WIRE`` only."""
        from gitlease.core import scope as scopes
        from gitlease.service.leases import Acquired

        unknown = set(kw) - set(self._WIRE)
        if unknown:
            raise TypeError(f"the renewal agent does not take {sorted(unknown)}")
        before = set(self.svc.held_here())
        try:
            ans = self._call("acquire", scope=list(raw_scopes), **{self._WIRE[k]: v for k, v in kw.items()})
        except (AgentUnreachable, AgentRefused):
            return self.svc.acquire(raw_scopes, **kw)
        except AgentNoAnswer:  # it may have acquired: adopt what it wrote into this worktree's held state
            paths = set(scopes.normalize_all(raw_scopes))
            for lid, h in self.svc.held_here().items():
                if lid not in before and set(h.paths) == paths:
                    return Acquired(lid, records.parse(h.record.encode("utf-8")), h.current)
            return self.svc.acquire(raw_scopes, **kw)
        return Acquired(
            ans["lease"], records.parse(ans["record"].encode("utf-8")), ans["oid"], tuple(ans.get("cleared") or ())
        )

    def release(self, lease_id: str) -> None:
        """``LeaseService.release`` through the agent; by itself when the agent is gone."""
        try:
            self._call("release", lease=lease_id)
            return
        except (AgentUnreachable, AgentRefused):
            pass
        except AgentNoAnswer:
            if lease_id not in self.svc.held_here():
                return  # the agent released it
        self.unregister(lease_id)
        self.svc.release(lease_id)

    def unregister(self, lease_id: str) -> None:
        try:
            self.client.request("unregister", timeout=0.5, lease=lease_id)
        except OSError:
            pass

    def register(self, lease_id: str, pid: int, timing: Timing | None = None) -> bool:
        """Hand ``lease_id`` to the agent for ``pid``, which checks in (polls) every ``timing.renew_every``: the
        agent renews it only while it does. False: the agent refused (it cannot sign as this holder) or is gone;
        the holder renews by itself."""
        extra = {} if timing is None else {"every": timing.renew_every, "stopAfter": timing.stop_after}
        try:
            ans = self.client.request(
                "register",
                timeout=self._long(),
                repo=self.svc.repo.cwd,
                remote=self.svc.settings.remote,
                lease=lease_id,
                pid=pid,
                who=self._who(),
                **extra,
            )
        except OSError:
            return False
        if not ans.get("ok"):
            self.log(f"renewal agent: {ans.get('error') or 'it refused'}; renewing {lease_id} by itself")
            self.unregister(lease_id)  # an acquire through the agent registered it already
        return bool(ans.get("ok"))

    def attempt(
        self, lease_id: str, timing: Timing, expires: float, self_attempt: Attempt, stop_by: float | None = None
    ) -> AgentAttempt:
        return AgentAttempt(self, lease_id, timing, expires, self_attempt, stop_by)


class AgentAttempt:
    """A heartbeat Attempt backed by the agent, falling back to ``self_attempt`` (the holder renewing by itself:
    ``Holding._renew_by_itself``)."""

    def __init__(
        self,
        link: AgentLink,
        lease_id: str,
        timing: Timing,
        expires: float,
        self_attempt: Attempt,
        stop_by: float | None = None,
    ):
        self.link, self.lease_id, self.timing = link, lease_id, timing
        self.expires = expires  # the newest expiry known to this holder, and its version's stop deadline
        self.stop_by = expires if stop_by is None else stop_by
        self.self_attempt = self_attempt
        self.fallen: str | None = None  # why the holder renews by itself from now on
        self.self_renewals = 0

    def __call__(self, budget: float, progress: str | None) -> Confirmed:
        if self.fallen:
            return self._self(budget, progress)
        clock = self.link.svc.clock
        start = clock.monotonic()
        try:
            ans = self.link.client.request(
                "status",
                timeout=max(0.05, min(self.link.client.timeout, budget / 4)),
                lease=self.lease_id,
                progress=progress,
            )
        except OSError as exc:
            return self._fall_back(f"it does not answer ({exc})", budget - (clock.monotonic() - start), progress)
        left = budget - (clock.monotonic() - start)
        state = ans.get("state")
        if state == "lost":
            raise LeaseLost.of(self.lease_id, ans.get("error") or "the renewal agent reports it lost")
        if not ans.get("ok") or state != "held":
            return self._fall_back(
                f"it does not renew {self.lease_id} ({state or 'error'}: {ans.get('error') or 'unknown lease'})",
                left,
                progress,
            )
        expires = parse_iso(ans["expiresAt"])
        stop_by = parse_iso(ans["stopBy"]) if ans.get("stopBy") else expires
        if expires > self.expires:
            self.expires, self.stop_by = expires, stop_by
        t = self.timing
        if clock.now() + t.timeout + MIN_ATTEMPT >= self.stop_by - t.grace - t.margin:
            # the agent is late: waiting any longer would leave no time for a renewal of our own
            return self._self(left, progress)
        return Confirmed(self.expires, self.stop_by)

    def _self(self, budget: float, progress: str | None) -> Confirmed:
        if budget < MIN_ATTEMPT / 2:
            raise RemoteUnavailable("no time left in this attempt for a renewal")
        got = self.self_attempt(budget, progress)
        if not isinstance(got, Confirmed):
            got = Confirmed(float(got))
        self.self_renewals += 1
        if got.expires >= self.expires:
            self.expires, self.stop_by = got.expires, got.stop_by if got.stop_by is not None else got.expires
        return got

    def _fall_back(self, why: str, budget: float, progress: str | None) -> Confirmed:
        self.fallen = why
        self.link.log(f"renewal agent: {why}; renewing {self.lease_id} by itself from now on")
        try:
            return self._self(budget, progress)
        finally:  # after the renewal, so a hung agent does not eat its budget
            self.link.unregister(self.lease_id)


__all__ = ["AgentLink", "AgentAttempt", "wanted"]
