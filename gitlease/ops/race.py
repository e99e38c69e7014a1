"""``git lease doctor``'s concurrency probe: does the server grant overlapping leases when acquires race?

Sequential probes cannot see it: a server that checks a push's refs for directory/file conflicts and then
writes them without one lock over the whole transaction (JGit's RefDirectory, dulwich) refuses every
overlapping create made one at a time, and grants several made at once. So the probe races pushers the way
acquires race: each pusher's push is one ``--atomic`` push of an id ref of its own and a scope ref, each pinned
to "must not exist", and the rounds cycle through the shapes that trigger the known races:

* ``parent/child``: half the pushers create ``X``, half ``X/sub``;
* ``directory/file``: pusher *i* creates ``X`` nested *i* deep (``X``, ``X/s``, ``X/s/s``, ...): every pair a
  directory/file conflict, in both directions;
* ``same path``: every pusher creates ``X``.

Pushers are released together: each ``git push`` connects, reads the server's advertisement and runs a
``pre-push`` hook of the probe's own, which waits at a gate (a unix socket of this process) until every pusher
is there; then all are let go at once, so their updates reach the server within a few milliseconds of each
other instead of spread over the start-up time of a git process. (On the local store, threads behind a barrier
run the transactions.) A round fails when more than one pusher is told it won, when two overlapping scope refs
are both there afterwards, or when a pusher told it won finds its refs missing.

No round can prove the server safe; the rounds bound how often it could be unsafe. If a double grant happens
in a fraction *p* of rounds, *n* rounds all pass with probability (1 - *p*)^*n*; so *n* clean rounds rule out,
with 99% confidence, any rate above 1 - 0.01^(1/*n*) (``detectable_rate``): 15% for 30 rounds, 7.4% for 60. The
servers that race (measured: JGit RefDirectory, dulwich) do so in a large share of rounds.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gitlease.core.errors import GitLeaseError
from gitlease.core.store import Outcome, RefUpdate
from gitlease.service.verdict import MIN_ROUNDS, PROBE_VERSION  # (kept in doctor's verdict)

ROUNDS = MIN_ROUNDS  # default rounds: a race in more than 15% of rounds shows with 99% confidence
PUSHERS = 4
CONFIDENCE = 0.99
SHAPES = ("parent/child", "directory/file", "same path")
GATE_ENV = "GITLEASE_RACE_GATE"
STRAGGLERS = 5.0  # seconds: the gate opens for those waiting when no other came this long after the last

Push = Callable[[Sequence[RefUpdate], "dict[str, str] | None", "str | None"], Outcome]
Lister = Callable[[str], "dict[str, str]"]
Commit = Callable[[str], str]

# The pre-push hook: after git read the server's advertisement, wait at the gate until every pusher is there.
# The doctor's process going away (its socket closed) or the wait running out stops the push (exit 1).
_HOOK = """import os, socket, sys
sys.stdin.buffer.read()
gate = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
gate.settimeout(float(os.environ.get("GITLEASE_RACE_WAIT", "60")))
try:
    gate.connect(os.environ["GITLEASE_RACE_GATE"])
    gate.sendall(b"r")
    go = gate.recv(2)
except OSError:
    go = b""
sys.exit(0 if go == b"go" else 1)
"""


def detectable_rate(rounds: int, confidence: float = CONFIDENCE) -> float:
    """The smallest rate of double grants per round that ``rounds`` clean rounds rule out with ``confidence``."""
    return 1 - (1 - confidence) ** (1 / max(rounds, 1))


@dataclass
class RoundPlan:
    shape: str
    pushes: list[list[RefUpdate]]  # per pusher: its id ref, then its scope ref
    scope_dir: str  # the round's scope refs live below this


def plan_round(base: str, rnd: int, pushers: int, commit: Commit) -> RoundPlan:
    """The pushes of round ``rnd`` (0-based): every pusher an id ref of its own and one scope ref, of the
    round's shape, all created at the pusher's own fresh commit."""
    shape = SHAPES[rnd % len(SHAPES)]
    scope_dir = f"{base}/s"
    pushes = []
    for i in range(pushers):
        if shape == "parent/child":
            scope = "x" if i % 2 == 0 else "x/sub"
        elif shape == "directory/file":
            scope = "/".join(["x"] + ["s"] * i)
        else:
            scope = "x"
        oid = commit(f"race-{rnd}-{i}")
        pushes.append([RefUpdate(f"{base}/id/p{i}", oid, None), RefUpdate(f"{scope_dir}/{scope}", oid, None)])
    return RoundPlan(shape, pushes, scope_dir)


@dataclass
class RaceResult:
    rounds: int  # rounds run
    planned: int
    pushers: int
    problems: list[str] = field(default_factory=list)
    remnants: int = 0  # refused pushes that left part of their refs (git's files backend; an acquire cleans up)
    shapes: tuple[str, ...] = SHAPES
    gated: bool = False  # pushers released together at a gate (remote stores)

    @property
    def ok(self) -> bool:
        return not self.problems and self.rounds == self.planned

    @property
    def bound(self) -> float:
        return detectable_rate(self.rounds)

    def what(self) -> str:
        how = "released together" if self.gated else "started together"
        return f"{self.pushers} pushers {how}, {self.planned} rounds ({', '.join(self.shapes)})"

    def summary(self) -> str:
        """The statistical statement of a clean run."""
        return (
            f"0 double grants in {self.rounds} rounds: a race rate above {self.bound:.1%} would have shown "
            f"with {CONFIDENCE:.0%} confidence"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "rounds": self.rounds,
            "plannedRounds": self.planned,
            "pushers": self.pushers,
            "shapes": list(self.shapes),
            "gated": self.gated,
            "remnants": self.remnants,
            "problems": self.problems,
            "detectableRate": round(self.bound, 4),
            "confidence": CONFIDENCE,
            "probeVersion": PROBE_VERSION,
        }


def judge_round(plan: RoundPlan, outs: Sequence[Outcome], listed: dict[str, str]) -> tuple[str | None, int]:
    """(problem or None, remnants) of a round from what each pusher was told and what is on the store now."""
    winners = [i for i, out in enumerate(outs) if out.ok]
    landed = [i for i, ups in enumerate(plan.pushes) if listed.get(ups[0].ref) == ups[0].new]
    scopes = sorted(r[len(plan.scope_dir) + 1 :] for r in listed if r.startswith(plan.scope_dir + "/"))
    overlap = [(a, b) for a in scopes for b in scopes if b.startswith(a + "/")]
    # git's files backend can commit a loser's transaction in part when a directory/file conflict is only
    # found while it renames its locks: the loser was told it lost, one of its refs is there. An acquire deletes
    # such a remnant of its own (docs/limits.md); not an overlap.
    remnants = len(set(landed) - set(winners))
    if len(winners) > 1 or overlap:
        both = f" (both {overlap[0][0]} and {overlap[0][1]} created)" if overlap else ""
        return f"{len(winners)} of {len(outs)} pushers told they won{both}", remnants
    if set(winners) - set(landed):
        return "a pusher was told it won, and its refs are not there", remnants
    return None, remnants


class Gate:
    """Where the pushers of a round wait (their pre-push hook) until all are there, then go together."""

    def __init__(self, folder: str) -> None:
        self.hooks_dir = os.path.join(folder, "race-hooks")
        os.makedirs(self.hooks_dir, exist_ok=True)
        script = os.path.join(self.hooks_dir, "gate.py")
        with open(script, "w") as fh:
            fh.write(_HOOK)
        hook = os.path.join(self.hooks_dir, "pre-push")
        with open(hook, "w") as fh:
            fh.write(f'#!/bin/sh\nexec {_sh_quote(sys.executable)} -S {_sh_quote(script)} "$@"\n')
        os.chmod(hook, 0o700)
        self.path = os.path.join(folder, "gate.sock")
        self._short: str | None = None
        if len(self.path.encode()) > 100:  # a unix socket's path is at most 104-108 bytes
            import tempfile

            self._short = tempfile.mkdtemp(prefix="gl-gate-", dir="/tmp")
            self.path = os.path.join(self._short, "gate.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(64)

    def env(self, wait: float) -> dict[str, str]:
        return {GATE_ENV: self.path, "GITLEASE_RACE_WAIT": str(int(wait) + 1)}

    def open_when_all_wait(
        self,
        expected: int,
        threads: Sequence[threading.Thread],
        wait: float,
        *,
        before_release: Callable[[], None] | None = None,
    ) -> int:
        """Let the pushers go once ``expected`` wait at the gate (or every other push has ended, or none came
        for STRAGGLERS seconds after the first, or ``wait`` seconds passed): all at once, after
        ``before_release`` ran (when any came). Returns how many went."""
        waiting: list[socket.socket] = []
        deadline = time.monotonic() + wait
        self.sock.settimeout(0.05)
        try:
            while len(waiting) < expected and time.monotonic() < deadline:
                try:
                    conn, _ = self.sock.accept()
                except TimeoutError:
                    if sum(t.is_alive() for t in threads) <= len(waiting):
                        break  # the others ended before reaching the gate (their push failed)
                    continue
                deadline = min(deadline, time.monotonic() + STRAGGLERS)
                conn.settimeout(5)
                try:
                    conn.recv(1)
                except OSError:
                    conn.close()
                    continue
                waiting.append(conn)
            if waiting and before_release is not None:
                before_release()
            for conn in waiting:
                try:
                    conn.sendall(b"go")
                except OSError:
                    pass
        finally:
            for conn in waiting:
                conn.close()
        return len(waiting)

    def drain(self, threads: Sequence[threading.Thread]) -> None:
        """Let every latecomer go as it comes, until the round's pushes have all ended."""
        self.sock.settimeout(0.05)
        while any(t.is_alive() for t in threads):
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    conn.sendall(b"go")
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
            if self._short is not None:
                os.rmdir(self._short)
        except OSError:
            pass


def race(plan: RoundPlan, push: Push, gate: Gate | None, wait: float) -> list[Outcome]:
    """Every pusher's updates as one atomic transaction, all released together."""
    n = len(plan.pushes)
    outs: list[Outcome] = [Outcome(ok=False, ambiguous=True, message="not run")] * n
    barrier = threading.Barrier(n) if gate is None else None

    def run(i: int) -> None:
        try:
            if barrier is not None:
                barrier.wait(timeout=wait)
            outs[i] = push(plan.pushes[i], gate.env(wait) if gate else None, gate.hooks_dir if gate else None)
        except threading.BrokenBarrierError:
            outs[i] = push(plan.pushes[i], None, None)
        except GitLeaseError as exc:
            outs[i] = Outcome(ok=False, ambiguous=True, message=str(exc))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    if gate is not None:
        gate.open_when_all_wait(n, threads, wait)
        gate.drain(threads)
    for t in threads:
        t.join()
    return outs


def run_probe(
    base: str,
    push: Push,
    lister: Lister,
    commit: Commit,
    *,
    rounds: int = ROUNDS,
    pushers: int = PUSHERS,
    gate: Gate | None = None,
    wait: float = 30.0,
) -> RaceResult:
    """``rounds`` rounds below ``base``; stops at the first bad round (no more pushes to a server that failed)."""
    result = RaceResult(rounds=0, planned=rounds, pushers=pushers, gated=gate is not None)
    for rnd in range(rounds):
        plan = plan_round(f"{base}/r{rnd}", rnd, pushers, commit)
        outs = race(plan, push, gate, wait)
        listed = lister(f"{base}/r{rnd}/*")
        problem, remnants = judge_round(plan, outs, listed)
        result.rounds += 1
        result.remnants += remnants
        if problem:
            result.problems.append(f"round {rnd + 1} of {rounds} ({plan.shape}): {problem}")
            break
    return result


def _sh_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
