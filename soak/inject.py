"""The fault injector: a process of its own that, at random, SIGKILLs workers (a kill while the worker runs a
``git push`` is logged as ``kill-mid-push``), SIGSTOPs one past its TTL and resumes it, kills a server's whole
process group, and makes a server hang on receive (its ``pre-receive`` hook waits while ``<bare>/soak-hang``
exists), until ``D/stop`` exists. Every fault is a line in ``D/faults.jsonl``.

    python -m soak.inject --dir D --seed 7 --ttl 4 --bares B1,B2 [--kinds kill,stop,server,hang]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

KINDS = ("kill", "stop", "server", "hang")


def pids(folder: Path, pattern: str) -> list[int]:
    out = []
    for f in folder.glob(pattern):
        try:
            out.append(int(f.read_text()))
        except ValueError:
            pass
    return out


def pushing(pid: int) -> bool:
    """Whether ``pid`` has a ``git push`` child running now (a SIGKILL then is a kill mid-push: the push
    itself goes on without its client, and may land after the worker is gone)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and b"push" in (stat.parent / "cmdline").read_bytes():
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ttl", type=float, default=4)
    ap.add_argument("--bares", default="")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--every", type=float, default=0.7, help="mean seconds between faults")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    rng = random.Random(args.seed)
    kinds = [k for k in args.kinds.split(",") if k]
    bares = [Path(b) for b in args.bares.split(",") if b]
    stopped: dict[int, float] = {}  # pid -> when to resume
    hangs: dict[Path, float] = {}
    log = open(folder / "faults.jsonl", "a")

    def note(kind, **kw):
        log.write(json.dumps(dict(kind=kind, t=time.time(), **kw)) + "\n")
        log.flush()

    def resume_due(force=False):
        now = time.monotonic()
        for pid, when in list(stopped.items()):
            if force or now >= when:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                del stopped[pid]
        for flag, when in list(hangs.items()):
            if force or now >= when:
                flag.unlink(missing_ok=True)
                del hangs[flag]

    next_fault = time.monotonic() + rng.expovariate(1 / args.every)
    try:
        while not (folder / "stop").exists():
            resume_due()
            if time.monotonic() < next_fault or not kinds:
                time.sleep(0.05)
                continue
            next_fault = time.monotonic() + rng.expovariate(1 / args.every)
            kind = rng.choice(kinds)
            workers = [p for p in pids(folder, "w*.pid") if p not in stopped]
            if kind == "kill" and workers:
                pid = rng.choice(workers)
                mid_push = pushing(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                    note("kill-mid-push" if mid_push else "kill", pid=pid)
                except ProcessLookupError:
                    pass
            elif kind == "stop" and workers and not stopped:
                pid = rng.choice(workers)
                pause = args.ttl * rng.uniform(1.2, 2.0)
                try:
                    os.kill(pid, signal.SIGSTOP)
                    stopped[pid] = time.monotonic() + pause
                    note("stop", pid=pid, seconds=round(pause, 2))
                except ProcessLookupError:
                    pass
            elif kind == "server":
                servers = pids(folder, "server-*.pid")
                if servers:
                    pgid = rng.choice(servers)
                    try:
                        os.killpg(pgid, signal.SIGKILL)
                        note("server-kill", pgid=pgid)
                    except (ProcessLookupError, PermissionError):
                        pass
            elif kind == "hang" and bares:
                bare = rng.choice(bares)
                flag = bare / "soak-hang"
                if flag not in hangs:
                    flag.write_text("")
                    hangs[flag] = time.monotonic() + rng.uniform(1.0, 3.0)
                    note("hang", bare=bare.name)
    finally:
        resume_due(force=True)
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
