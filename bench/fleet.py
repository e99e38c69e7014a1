#!/usr/bin/env python3
"""gitlease push budget benchmark (issue 11): a fleet on a few hosts, the real store, pushes counted at the
remote.

    .venv/bin/python bench/fleet.py                              # 100 agents on 10 hosts, 6 simulated hours
    .venv/bin/python bench/fleet.py --quick                      # 20 agents on 4 hosts, 1 simulated hour
    .venv/bin/python bench/fleet.py --write docs/performance.md  # also (re)write its section there

What it does, every figure from this one run:

- One bare ``file://`` remote whose ``reference-transaction`` hook logs every transaction the server commits
  with the pid of its ``receive-pack`` (soak/serverlog.py): one pid is one push, counted by the server, not by
  the clients.
- ``--hosts`` simulated hosts, each one repository with ``--agents / --hosts`` linked worktrees (one per agent)
  and its own ``git lease agent`` (gitlease.liveness.agent.Agent, the renewal logic, ticked in-process).
- The tokio trace as the task queue: task *i* takes ``paths`` of commit *i*, its duration proportional to its
  size with a mean of ``--task-minutes`` (30), at least a minute. An agent that finishes takes the first of
  the next ``--lookahead`` (400) queued tasks
  whose files no active lease covers (one read of the store per step for the fleet), and acquires it through
  its host's agent (``Agent.acquire``) with ``replace=`` its finished lease, so moving to the next task is one
  push, which also carries the renewals of that host's leases that are due soon (piggybacking). TTL ``--ttl``
  (10 min); each host's agent renews when half the TTL is left, all its leases in one push.
- Time is simulated (one FakeClock for the whole fleet, moved in steps of ``--step`` seconds); the store and
  every push are real.

Reported: pushes per simulated minute in all and by kind, renewal pushes per host per interval, against the
host's limit (6 a minute, GitHub's recommendation); and the wall time of the fleet's reads (each one verifies
every lease; versions verified by an earlier read are not verified again: trust.ChainMemo).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from plan import DEFAULT_TRACE, git, isolate, load_trace, machine_info, make_repo  # noqa: E402

from gitlease.core.clock import FakeClock  # noqa: E402
from gitlease.core.config import resolve  # noqa: E402
from gitlease.core.errors import HeldError  # noqa: E402
from gitlease.core.pathindex import PathIndex  # noqa: E402
from gitlease.core.repo import Repo  # noqa: E402
from gitlease.core.scope import normalize_all  # noqa: E402
from gitlease.liveness.agent import Agent  # noqa: E402
from gitlease.service.leases import LeaseService  # noqa: E402
from soak import serverlog  # noqa: E402
from testing.benchdoc import write_section  # noqa: E402

BEGIN, END = "<!-- fleet:begin -->", "<!-- fleet:end -->"
LIMIT = 6.0  # pushes a minute: GitHub's recommendation per repository


class Counter:
    """Pushes seen by the server since the last call: distinct receive-pack pids in the new part of its log
    (every push has finished when this is called, so each one's records are all in that part)."""

    def __init__(self, bare: Path) -> None:
        self.path, self.offset = serverlog.log_path(bare), 0

    def take(self) -> int:
        if not self.path.exists():
            return 0
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        return len({t.pid for t in serverlog.parse(data.decode("utf-8"))})


def run(args, tmp: Path, log) -> dict:
    commits, files = load_trace(Path(args.trace), args.tasks)
    bare = tmp / "leases.git"
    git("init", "-q", "--bare", str(bare))
    git("config", "receive.autogc", "false", cwd=bare)
    serverlog.install(bare)
    url = bare.as_uri()
    clock = FakeClock()
    per_host = args.agents // args.hosts
    hosts = []
    for h in range(args.hosts):
        worktrees = make_repo(tmp / f"host{h}" / "repo", files, per_host)
        svcs = []
        for i, wt in enumerate(worktrees):
            repo = Repo.discover(str(wt))
            svcs.append(
                LeaseService(
                    repo,
                    resolve(repo.config, env={}, remote=url, agent=f"h{h}a{i}", task="fleet", ttl=args.ttl, timeout=60),
                    clock=clock,
                )
            )
        by_path = {str(s.repo.cwd): s for s in svcs}
        agent = Agent(
            lambda repo, remote, by_path=by_path: by_path[repo], clock=clock, alive=lambda pid, start: True, margin=5
        )
        hosts.append((agent, svcs))
    paths_of = [normalize_all(c.paths) for c in commits]
    mean = sum(c.duration for c in commits) / len(commits)
    durations = [max(60.0, args.task_minutes * 60 * c.duration / mean) for c in commits]
    queue = list(range(len(commits)))
    busy: dict[tuple[int, int], tuple[float, str]] = {}  # (host, agent) -> (ends at, lease id)
    counts = {"acquire": 0, "renewal": 0, "refused": 0, "release": 0}
    reads: list[float] = []
    held_per_step: list[int] = []
    count = Counter(bare)
    start = clock.now()
    end = start + args.minutes * 60
    started = finished = 0
    renew_rounds: dict[int, int] = {}

    def next_task(agent, svc, replace, index):
        """The first queued task (looking a little ahead) that no lease in this step's listing, nor a task
        started in this step, overlaps (``index``): one read per step for the whole fleet, then one push per
        start, through the host's agent."""
        nonlocal started
        for k, idx in enumerate(queue[: args.lookahead]):
            paths = paths_of[idx]
            if index.overlapping(paths):
                continue
            try:
                got, _reg = agent.acquire(str(svc.repo.cwd), None, paths, pid=1, replace=replace, ttl=args.ttl)
            except HeldError:  # a refused push commits nothing: counted here, by the client
                counts["refused"] += max(1, count.take())
                continue
            counts["acquire"] += count.take()
            queue.pop(k)
            index.add(got.lease_id, paths)
            started += 1
            return idx, got.lease_id
        if replace:
            agent.release(str(svc.repo.cwd), None, replace)
            counts["release"] += count.take()
        return None

    while clock.now() < end and queue:
        now = clock.now()
        t0 = time.perf_counter()
        snap = hosts[0][1][0].snapshot(use_cache=False)  # one read per step (reads are not pushes)
        reads.append(time.perf_counter() - t0)
        bad = [v.lease_id for v in snap.leases if not v.valid]
        if bad:
            raise SystemExit(f"bench: the read found invalid leases {bad[:3]}")
        index: PathIndex = PathIndex()
        for v in snap.leases:
            index.add(v.lease_id, v.paths)
        for h, (agent, svcs) in enumerate(hosts):
            for i, svc in enumerate(svcs):
                cur = busy.get((h, i))
                if cur is not None and cur[0] > now:
                    continue
                replace = None
                if cur is not None:
                    replace = cur[1]
                    index.remove(replace)
                    finished += 1
                    del busy[(h, i)]
                got = next_task(agent, svc, replace, index)
                if got is None:
                    continue
                idx, lease_id = got
                busy[(h, i)] = (now + durations[idx], lease_id)
        held_per_step.append(sum(len(agent.regs) for agent, _ in hosts))
        for h, (agent, _) in enumerate(hosts):
            for lid in list(agent.regs):  # each holder's heartbeat polls its agent (its check-in) every step
                agent.status(lid)
            before = agent.pushes
            agent.tick()
            if agent.pushes != before:
                renew_rounds[h] = renew_rounds.get(h, 0) + 1
            counts["renewal"] += count.take()
            lost = [lid for lid, r in agent.regs.items() if r.state != "held"]
            if lost:
                raise SystemExit(f"bench: host {h} lost leases {lost[:3]}: {[agent.regs[x].error for x in lost]}")
        clock.advance(args.step)
    # the last listing read from scratch (every version of every lease verified, as a new process would), then
    # the same read again with what that one verified remembered
    import gitlease.identity.trust as trust_mod

    reader = hosts[0][1][0]
    saved, trust_mod.MEMO = trust_mod.MEMO, trust_mod.ChainMemo()
    try:
        t0 = time.perf_counter()
        snap = reader.snapshot(use_cache=False)
        scratch = time.perf_counter() - t0
        t0 = time.perf_counter()
        reader.snapshot(use_cache=False)
        warm = time.perf_counter() - t0
    finally:
        trust_mod.MEMO = saved
    live_versions = sum(len(v.chain.versions) for v in snap.leases if v.chain is not None)
    minutes = (clock.now() - start) / 60
    interval = args.ttl / 2
    intervals = (clock.now() - start) / interval
    total = sum(counts[k] for k in ("acquire", "renewal", "refused", "release"))
    piggybacked = sum(agent.piggybacked for agent, _ in hosts)
    log(f"  {started} tasks started, {finished} finished in {minutes:.0f} simulated minutes; {total} pushes")
    late = reads[len(reads) // 2 :]
    return {
        "agents": args.agents,
        "hosts": args.hosts,
        "ttl": args.ttl,
        "task_minutes": args.task_minutes,
        "minutes": minutes,
        "started": started,
        "finished": finished,
        "counts": counts,
        "total": total,
        "per_minute": total / minutes,
        "renewal_per_host_interval": counts["renewal"] / args.hosts / intervals,
        "rounds_per_host": renew_rounds,
        "intervals": intervals,
        "commits": len(commits),
        "piggybacked": piggybacked,
        "round_renewals": sum(a.round_renewals for a, _ in hosts),
        "reads": len(reads),
        "read_first": reads[0] if reads else 0.0,
        "read_mean": sum(reads) / len(reads) if reads else 0.0,
        "read_late_mean": sum(late) / len(late) if late else 0.0,
        "read_scratch": scratch,
        "read_warm": warm,
        "live_leases": len(snap.leases),
        "live_versions": live_versions,
        "lookahead": args.lookahead,
        "held_mean": sum(held_per_step) / max(1, len(held_per_step)),
        "held_max": max(held_per_step or [0]),
    }


def section(res: dict, info: dict) -> str:
    c = res["counts"]
    m = res["minutes"]
    ok_total = res["per_minute"] <= LIMIT
    ok_renew = res["renewal_per_host_interval"] <= 1.0 + 1e-9
    interval = res["ttl"] / 2
    switches = res["agents"] / res["task_minutes"]  # task switches a minute, fleet-wide
    rounds_max = res["hosts"] * 60 / interval
    per_lease = res["agents"] * 60 / interval + 2 * switches
    renewals = res["piggybacked"] + res["round_renewals"]
    lines = [
        BEGIN,
        "## Push budget: a fleet on a few hosts (`bench/fleet.py`)",
        "",
        f"Run {info['when']}, {info['machine']}, {info['git']}, code {info['code']}. {res['agents']} agents on "
        f"{res['hosts']} hosts replay the {info['trace']} trace ({res['commits']} commits as tasks, "
        f"{res['task_minutes']:g} simulated minutes on average, TTL {res['ttl']} s, renewal at half the TTL by "
        "each host's `git lease agent`, next task acquired through the host's agent with `replace=` the finished "
        f"one) for {m:.0f} simulated minutes ({m / res['task_minutes']:.0f} mean task lengths, "
        f"{res['intervals']:.0f} renewal intervals) against a real `file://` store. Pushes are counted by the "
        "server (receive-pack processes seen by its reference-transaction hook); refused acquires, which commit "
        "nothing there, are counted by the client.",
        "",
        "The arithmetic (what the design promises, before measuring):",
        "",
        f"- Task switches: {res['agents']} agents / {res['task_minutes']:g} min = {switches:.2f} a minute, each "
        "one push (the next acquire carries the release of the finished lease: `replace=`).",
        f"- Renewals: at most one push per host per renewal interval ({interval:.0f} s): {res['hosts']} hosts x "
        f"60 / {interval:.0f} = {rounds_max:.2f} a minute, fewer when due renewals ride in a task switch's push "
        "(piggybacking: a lease rides along when it is due within half its interval).",
        f"- Bound, with every agent always busy and every switch one push: {switches:.2f} + {rounds_max:.2f} = "
        f"**{switches + rounds_max:.2f} a minute** (limit {LIMIT:g}). "
        f"Without the agent (each lease renewing itself, releasing in a push of its own): {res['agents']} x 60 / "
        f"{interval:.0f} + 2 x {switches:.2f} = {per_lease:.1f} a minute.",
        "- What the bound leaves out, measured below: a next scope that overlaps the finished one costs two "
        "pushes (git refuses deleting a scope ref and creating an overlapping one in one push, so the release "
        "goes first), and an agent with no task left releases in a push of its own.",
        "",
        "Measured:",
        "",
        "| pushes | count | per simulated minute |",
        "| --- | ---: | ---: |",
        f"| acquire (release of the finished task and due renewals in the same push) | {c['acquire']} | "
        f"{c['acquire'] / m:.2f} |",
        f"| release alone (no task left for that agent) | {c['release']} | {c['release'] / m:.2f} |",
        f"| renewal rounds (one push per host per round) | {c['renewal']} | {c['renewal'] / m:.2f} |",
        f"| refused acquires (another agent took the scope between read and push) | {c['refused']} | "
        f"{c['refused'] / m:.2f} |",
        f"| **all** | **{res['total']}** | **{res['per_minute']:.2f}** |",
        "",
        f"- Renewal pushes per host per renewal interval ({interval:.0f} s): "
        f"**{res['renewal_per_host_interval']:.2f}** (target at most 1: **{'met' if ok_renew else 'not met'}**).",
        f"- All pushes: **{res['per_minute']:.2f} a minute** against the host's {LIMIT:g} "
        f"(**{'met' if ok_total else 'not met'}**).",
        f"- {renewals} renewals in all: {res['piggybacked']} rode in acquire or release pushes, "
        f"{res['round_renewals']} were made by rounds.",
        f"- {res['started']} tasks started ({c['acquire']} acquire pushes: a next scope that overlaps the "
        f"finished one needs the release first, in a push of its own), {res['finished']} finished. Leases held "
        f"at once: {res['held_mean']:.1f} on average, {res['held_max']} at most: the trace's tasks overlap on "
        "shared files (tokio/Cargo.toml in 216 of the 1999 commits, .github/workflows/ci.yml in 178, "
        "README.md in 139), so much of the time many agents wait for a task no lease blocks "
        f"(each looks {res['lookahead']} tasks ahead in the queue).",
        f"- Reads (one per simulated minute, every lease verified): {res['reads']}, first "
        f"{res['read_first'] * 1000:.0f} ms, mean {res['read_mean'] * 1000:.0f} ms, mean of the second half "
        f"{res['read_late_mean'] * 1000:.0f} ms (versions verified by an earlier read are not verified again). "
        f"At the end, {res['live_leases']} leases with {res['live_versions']} versions: a read from scratch (as a "
        f"new process makes it) {res['read_scratch'] * 1000:.0f} ms, the same read again "
        f"{res['read_warm'] * 1000:.0f} ms.",
        END,
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--ttl", type=int, default=600)
    ap.add_argument("--task-minutes", type=float, default=30)
    ap.add_argument("--minutes", type=float, default=360)
    ap.add_argument("--step", type=float, default=60)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--lookahead", type=int, default=400, help="queued tasks an idle agent considers")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-memo", action="store_true", help="verify every version at every read (for comparison)")
    ap.add_argument("--write", metavar="FILE")
    args = ap.parse_args(argv)
    if args.quick:
        args.agents, args.hosts, args.minutes = 20, 4, 60
    if args.no_memo:
        from gitlease.identity.trust import ChainMemo

        ChainMemo.versions = lambda self, *a: []
        ChainMemo.newest = lambda self, *a: []

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="gitlease-fleet-"))
    try:
        isolate(tmp)
        info = machine_info(Path(args.trace))
        res = run(args, tmp, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = section(res, info)
    print(text)
    if args.write:
        path = Path(args.write)
        write_section(path, text, BEGIN, END)
        log(f"wrote its section of {path}")
    print(json.dumps({k: v for k, v in res.items() if k != "rounds_per_host"}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
