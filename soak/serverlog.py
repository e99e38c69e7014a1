"""The checker's ground truth: a log of every ref transaction the server committed, written by the server.

Reflogs cannot be the source: git deletes a ref's reflog with the ref, and a released lease deletes all its
refs. Instead the test remote gets a ``reference-transaction`` hook (git runs it in the server's process, for
every transaction, over every transport) that appends one record per state change. The ``prepared`` state
runs while the transaction holds its ref locks, so the order of ``prepared`` records is the order in which
each ref changed; a transaction counts once its ``committed`` record follows.

Each record is one ``write(2)`` in ``O_APPEND`` mode (small: a lease transaction has a few refs), so records
of concurrent transactions never interleave.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ZERO40 = "0" * 40

# The hook: $1 is the state; stdin has "<old> <new> <ref>" lines. One printf builtin writes one record.
HOOK = """#!/bin/sh
input=$(cat)
record=$(printf 'txn %s %s %s\\n%s\\n.\\n' "$1" "$PPID" "$(date +%s.%N)" "$input")
printf "%s\\n" "$record" >> soak-transactions.log
"""

LOG_NAME = "soak-transactions.log"


@dataclass(frozen=True)
class Txn:
    seq: int  # position of the prepared record
    time: float  # server clock at prepare
    pid: int
    updates: tuple[tuple[str, str, str], ...]  # (old, new, ref); zero-to-zero rows dropped
    certain: bool = True  # False: prepared, then the server process died before it logged the outcome
    partial: bool = False  # settle() found only some of its updates landed
    prepared: tuple[tuple[str, str, str], ...] = ()  # of a partial one: every update it had locked and checked


def install(bare: Path) -> None:
    hook = Path(bare) / "hooks" / "reference-transaction"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(HOOK)
    hook.chmod(0o755)


def log_path(bare: Path) -> Path:
    return Path(bare) / LOG_NAME


class LogCorrupt(Exception):
    pass


def parse(text: str) -> list[Txn]:
    """Committed transactions, in the order they were prepared."""
    records = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        head = lines[i]
        if not head:
            i += 1
            continue
        parts = head.split(" ")
        if len(parts) != 4 or parts[0] != "txn":
            raise LogCorrupt(f"line {i + 1}: {head[:80]!r}")
        _, state, pid, t = parts
        body = []
        i += 1
        while i < len(lines) and lines[i] != ".":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise LogCorrupt("a record without its end mark")
        i += 1
        rows = []
        for row in body:
            if not row:
                continue
            old, new, ref = row.split(" ", 2)
            if old == new == ZERO40 or (set(old) == {"0"} and set(new) == {"0"}):
                continue
            rows.append((old, new, ref))
        records.append((state, int(pid), float(t), tuple(rows)))
    pending: dict[int, list[tuple[int, float, tuple]]] = {}
    committed: list[Txn] = []
    for seq, (state, pid, t, rows) in enumerate(records):
        if state == "prepared":
            pending.setdefault(pid, []).append((seq, t, rows))
        elif state in ("committed", "aborted"):
            queue = pending.get(pid, [])
            match = next((k for k, (_, _, r) in enumerate(queue) if r == rows), None)
            if match is None:
                if state == "committed" and rows:
                    raise LogCorrupt(f"committed without prepare (pid {pid})")
                continue
            s, tp, r = queue.pop(match)
            if state == "committed" and r:
                committed.append(Txn(s, tp, pid, r))
    # A server process killed between "prepared" and "committed" leaves an outcome nobody logged: keep those
    # transactions as uncertain; the checker decides them from later evidence (settle()).
    for pid, queue in pending.items():
        for s, tp, r in queue:
            if r:
                committed.append(Txn(s, tp, pid, r, certain=False))
    committed.sort(key=lambda x: x.seq)
    return committed


def settle(txns: list[Txn], final_refs: dict[str, str]) -> list[Txn]:
    """Decide each uncertain transaction ref by ref from what followed: an update landed if the next
    transaction touching that ref started from its new value, or, when none did, if the final refs agree.
    A transaction of which only some updates landed comes back with those only and ``partial`` set."""
    out = []
    for k, t in enumerate(txns):
        if t.certain:
            out.append(t)
            continue
        landed = []
        for old, new, ref in t.updates:
            nxt = next((o for u in txns[k + 1 :] for o, _, r in u.updates if r == ref), None)
            if nxt is not None:
                ok = nxt == new or (is_zero(nxt) and is_zero(new))
            else:
                ok = final_refs.get(ref, ZERO40) == new or (is_zero(new) and ref not in final_refs)
            if ok:
                landed.append((old, new, ref))
        if landed:
            partial = len(landed) != len(t.updates)
            out.append(
                Txn(
                    t.seq,
                    t.time,
                    t.pid,
                    tuple(landed),
                    certain=True,
                    partial=partial,
                    prepared=t.updates if partial else (),
                )
            )
    return out


def read(bare: Path) -> list[Txn]:
    p = log_path(bare)
    return parse(p.read_text()) if p.exists() else []


def is_zero(oid: str) -> bool:
    return set(oid) == {"0"}


__all__ = ["HOOK", "Txn", "install", "parse", "read", "settle", "log_path", "is_zero", "LogCorrupt"]
