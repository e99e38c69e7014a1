"""The push budget of a fleet: how many pushes a minute it makes on the lease remote (pure arithmetic).

Every acquire, renewal and release is one push. With N agents on H hosts, each agent starting T tasks an
hour and each lease renewed every R seconds, and assuming every agent holds a lease all the time (an upper
bound: an idle agent renews nothing):

* per-lease (each holder renews its own lease: `lease.renewAgent false`, the local store, or a bare
  `git lease renew` loop): an acquire and a release per task, ``2 * N * T / 60`` pushes a minute,
  plus one renewal push per lease per interval, ``N * 60 / R``;
* batched (the default of ``hold()`` and ``git lease run``: the per-host ``git lease agent`` renews every lease of
  a host in one push; ``acquire --replace`` puts a worker's
  release and its next acquire in one push), ``N * T / 60``, plus one renewal push per host per interval for
  all its leases, ``min(H, N) * 60 / R``.

The largest fleet that fits under a host's limit L (pushes a minute; GitHub recommends at most 6 per
repository) is ``floor(L / (2T/60 + 60/R))`` agents per-lease, and ``floor((L - 60H/R) / (T/60))`` agents on
H hosts batched (unbounded when T is 0, none when the hosts' renewals alone exceed L).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gitlease.core.errors import UsageError

GITHUB_PUSHES_PER_MINUTE = 6.0


@dataclass(frozen=True)
class Fleet:
    agents: int
    hosts: int
    ttl: int
    renew_every: int | None = None  # default: half the TTL
    tasks_per_hour: float = 2.0

    @property
    def interval(self) -> float:
        return float(self.renew_every if self.renew_every else self.ttl / 2)


@dataclass(frozen=True)
class Model:
    label: str
    acquire_release: float  # pushes a minute
    renewals: float
    limit: float
    max_agents: int | None  # None: no limit (no tasks and renewals within the budget)

    @property
    def total(self) -> float:
        return self.acquire_release + self.renewals

    @property
    def fits(self) -> bool:
        return self.total <= self.limit + 1e-9

    @property
    def share(self) -> float:
        return self.total / self.limit

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "acquireRelease": round(self.acquire_release, 4),
            "renewals": round(self.renewals, 4),
            "total": round(self.total, 4),
            "fits": self.fits,
            "shareOfLimit": round(self.share, 4),
            "maxAgents": self.max_agents,
        }


@dataclass(frozen=True)
class Budget:
    fleet: Fleet
    limit: float
    per_lease: Model
    batched: Model

    def to_json(self) -> dict[str, object]:
        fleet = asdict(self.fleet)
        fleet["renewEvery"] = self.fleet.interval
        fleet.pop("renew_every")
        fleet["tasksPerHour"] = fleet.pop("tasks_per_hour")
        return {
            "fleet": fleet,
            "limit": self.limit,
            "perLease": self.per_lease.to_json(),
            "batched": self.batched.to_json(),
        }

    def lines(self) -> list[str]:
        f = self.fleet
        out = [
            f"fleet: {f.agents} agents on {f.hosts} host{'s' if f.hosts != 1 else ''}, ttl {f.ttl}s, renewal "
            f"every {f.interval:g}s, {f.tasks_per_hour:g} tasks per agent per hour",
            f"host limit: {self.limit:g} pushes/min",
        ]
        on_hosts = f"agents on {f.hosts} host{'s' if f.hosts != 1 else ''}"
        for model, fleet_text in ((self.per_lease, "agents"), (self.batched, on_hosts)):
            verdict = "fits" if model.fits else "OVER the limit"
            most = "no limit from this model" if model.max_agents is None else f"{model.max_agents} {fleet_text}"
            out += [
                f"{model.label}:",
                f"  {model.total:.2f} pushes/min = {model.acquire_release:.2f} acquire/release + "
                f"{model.renewals:.2f} renewals: {verdict} ({model.share:.0%} of {self.limit:g}/min)",
                f"  largest fleet that fits: {most}",
            ]
        return out


PER_LEASE = "per-lease renewals (each holder renews its own lease: lease.renewAgent false)"
BATCHED = (
    "batched (the default: git lease agent, one renewal push per host; acquire --replace: release + next acquire "
    "in one push)"
)


def plan(fleet: Fleet, limit: float = GITHUB_PUSHES_PER_MINUTE) -> Budget:
    _validate(fleet, limit)
    r = fleet.interval
    per_task = 2 * fleet.tasks_per_hour / 60  # pushes a minute per busy agent, for acquire + release
    per_lease = Model(
        PER_LEASE, fleet.agents * per_task, fleet.agents * 60 / r, limit, math.floor(limit / (per_task + 60 / r) + 1e-9)
    )
    per_task = fleet.tasks_per_hour / 60  # batched: release + next acquire in one push
    host_renewals = 60 * fleet.hosts / r
    if host_renewals > limit + 1e-9:
        most: int | None = 0
    elif per_task == 0:
        most = None
    else:
        most = math.floor((limit - host_renewals) / per_task + 1e-9)
    batched = Model(BATCHED, fleet.agents * per_task, min(fleet.hosts, fleet.agents) * 60 / r, limit, most)
    return Budget(fleet, limit, per_lease, batched)


def _validate(fleet: Fleet, limit: float) -> None:
    if fleet.agents < 0:
        raise UsageError("--agents must be 0 or more")
    if fleet.hosts < 1:
        raise UsageError("--hosts must be 1 or more")
    if fleet.ttl < 1:
        raise UsageError("--ttl must be at least 1 second")
    if fleet.renew_every is not None and not 0 < fleet.renew_every < fleet.ttl:
        raise UsageError(
            f"--renew-every must be shorter than the TTL ({fleet.ttl}s), or leases expire between renewals"
        )
    if fleet.tasks_per_hour < 0:
        raise UsageError("--tasks-per-hour must be 0 or more")
    if not limit > 0:
        raise UsageError("--limit must be more than 0 pushes a minute")
