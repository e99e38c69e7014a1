"""What ``git lease work`` reports: each event, each task's figures, and the run's summary (docs/work.md).

The summary's figures are honest about what they measure: the makespan (start to end), the time spent in
the agents, in the verifier and in landing (summed over tasks), and the parallelism those give,
``(agent + verify + land) / makespan``: how many tasks were in progress on average (a task lands while its
worker runs its next agent, so it can exceed the worker count). It is not a speed-up over one worker; that
needs a measured one-worker run of the same queue (``bench/work.py`` measures both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gitlease.core.clock import iso


@dataclass(frozen=True)
class Event:
    kind: str  # claimed | refused | waiting | running | verifying | landing | landed | retry | failed | done
    # | released | quarantined | swept | stopping | interrupted | error
    worker: int
    at: float
    task: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        d = self.detail
        who = f"worker {self.worker}" if self.worker >= 0 else "runner"
        task = f" {self.task}" if self.task else ""
        extra = d.get("message") or " ".join(f"{k}={v}" for k, v in d.items() if v not in (None, "", [], {}))
        return f"{who}: {self.kind}{task}" + (f": {extra}" if extra else "")

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, "worker": self.worker, "at": iso(self.at), "task": self.task, **self.detail}


@dataclass
class TaskStats:
    id: str
    state: str = "pending"
    attempts: int = 0
    landed: str | None = None
    quarantine: str | None = None
    reason: str = ""
    busy: float = 0.0  # seconds a worker of this runner spent on it (claim to release)
    agent: float = 0.0  # of which: in its command
    verify: float = 0.0  # in the verifier
    land: float = 0.0  # landing (fetch, rebase, fenced push, retries)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "attempts": self.attempts,
            "landed": self.landed,
            "quarantine": self.quarantine,
            "reason": self.reason,
            "busySeconds": round(self.busy, 3),
            "agentSeconds": round(self.agent, 3),
            "verifySeconds": round(self.verify, 3),
            "landSeconds": round(self.land, 3),
        }


@dataclass
class Summary:
    done: list[str]  # tasks done (by any runner), queue order
    failed: list[str]
    pending: list[str]  # neither (interrupted, or left to other runners)
    ran: int  # attempts this runner made
    makespan: float  # seconds from start to end
    busy: float  # worker seconds spent on tasks
    lease_waits: int  # times a task that could be next waited for a lease (planned blocked, or refused)
    retries: int  # failed attempts re-queued, and non-fast-forward landing retries
    land_retries: int
    interrupted: bool
    workers: int
    tasks: dict[str, TaskStats] = field(default_factory=dict)
    signal: int = 0  # the signal that interrupted the run (SIGINT, SIGTERM, SIGHUP), 0: none

    @property
    def agent(self) -> float:
        return sum(t.agent for t in self.tasks.values())

    @property
    def verify(self) -> float:
        return sum(t.verify for t in self.tasks.values())

    @property
    def land(self) -> float:
        return sum(t.land for t in self.tasks.values())

    @property
    def parallelism(self) -> float:
        """(agent + verify + land time) / makespan: how many tasks were in progress on average (landing overlaps
        the worker's next agent). Not a speed-up over one worker (that needs a one-worker run of the same queue
        to compare with: bench/work.py)."""
        work = self.agent + self.verify + self.land
        return work / self.makespan if self.makespan > 0 else 0.0

    @property
    def speedup(self) -> float:
        """Kept for scripts that read it: the same figure as ``parallelism``."""
        return self.parallelism

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 128 + (self.signal or 2)
        return 1 if self.failed else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "failed": self.failed,
            "pending": self.pending,
            "attempts": self.ran,
            "makespanSeconds": round(self.makespan, 3),
            "busySeconds": round(self.busy, 3),
            "agentSeconds": round(self.agent, 3),
            "verifySeconds": round(self.verify, 3),
            "landSeconds": round(self.land, 3),
            "parallelism": round(self.parallelism, 2),
            "speedup": round(self.parallelism, 2),
            "leaseWaits": self.lease_waits,
            "retries": self.retries,
            "landRetries": self.land_retries,
            "interrupted": self.interrupted,
            "workers": self.workers,
            "tasks": [t.to_json() for t in self.tasks.values()],
        }

    def lines(self) -> list[str]:
        out = [
            f"done {len(self.done)}, failed {len(self.failed)}"
            + (f", not finished {len(self.pending)}" if self.pending else "")
            + f"; makespan {self.makespan:.1f}s; agents {self.agent:.1f}s, verify {self.verify:.1f}s, "
            f"landing {self.land:.1f}s; parallelism {self.parallelism:.2f} (work / makespan, "
            f"{self.workers} worker{'s' if self.workers != 1 else ''})",
            f"waits caused by leases {self.lease_waits}, retries {self.retries} "
            f"(non-fast-forward landings {self.land_retries})",
        ]
        for tid in self.failed:
            t = self.tasks.get(tid)
            if t:
                q = f"; work kept in {t.quarantine}" if t.quarantine else ""
                out.append(f"failed: {tid} after {t.attempts} attempt{'s' if t.attempts != 1 else ''}: {t.reason}{q}")
        return out


__all__ = ["Event", "TaskStats", "Summary"]
