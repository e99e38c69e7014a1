"""The landing train at 1, 5, 10 and 20 workers: ``git lease work`` over ``git daemon`` (the server hook
installed), the last 30 commits of the requests trace as a queue (their paths, file granularity), and a fake
agent that works a fixed time per task (``--agent-seconds``, 2 s) then edits and commits its paths.

Reported per worker count, from one run each on this machine: the makespan; the throughput (tasks a minute) and
its ratio to the 5-worker run; the share of worker time spent landing (landing seconds over busy seconds: claim
to release); the agent runs (one a task means no agent ran again for a landing fault), the landing pushes the
train made and the non-fast-forward retries. The targets (issue 32): 10 workers at least 1.5x the throughput of
5, landing under 20 % of worker time at 10, no agent re-run caused by landing.

    python bench/train.py [--tasks 30] [--workers 1,5,10,20] [--agent-seconds 2] [--write docs/performance.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gitlease  # noqa: E402
from bench.work import AGENT, git, seed_tasks  # noqa: E402  (the same fake agent: sleeps its "work", edits, commits)
from testing.benchdoc import write_section  # noqa: E402
from testing.servers import GitDaemon  # noqa: E402

TRACE = ROOT / "tests/data/requests-tail240.jsonl"
BEGIN, END = "<!-- bench/train.py -->", "<!-- /bench/train.py -->"


def load(n: int, seconds: float) -> list[dict]:
    rows = [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()][-n:]
    return [{"id": f"c{i:02d}-{r['id'][:8]}", "paths": r["paths"], "work": seconds} for i, r in enumerate(rows)]


def run_one(daemon: GitDaemon, tmp: Path, tasks: list[dict], workers: int, agent: Path) -> dict:
    name = f"w{workers}.git"
    bare = daemon.make_bare(name)
    subprocess.run([str(Path(sys.executable).parent / "git-lease"), "install-hooks", "--server"], cwd=bare,
                   check=True, capture_output=True)  # fmt: skip
    clone = tmp / f"clone{workers}"
    seed_tasks(tmp, bare, tasks)
    git("clone", "-q", daemon.url_for(name), str(clone), cwd=tmp)
    git("config", "lease.remote", "origin", cwd=clone)
    seen: dict = {}
    summary = gitlease.work(
        tasks, repo=str(clone), command=[sys.executable, str(agent)], land="main", workers=workers,
        granularity="file", backoff=1.0, runner_hook=lambda r: seen.setdefault("runner", r),
    )  # fmt: skip
    if summary.failed or len(summary.done) != len(tasks):
        raise SystemExit(f"bench/train.py: x{workers}: failed {summary.failed}, done {len(summary.done)}")
    lander = seen["runner"].lander
    return {
        "workers": workers,
        "makespan": summary.makespan,
        "per_minute": len(tasks) / summary.makespan * 60,
        "landing_share": summary.land / summary.busy if summary.busy else 0.0,
        "agent_runs": summary.ran,
        "pushes": lander.rides,
        "retries": summary.land_retries,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--workers", default="1,5,10,20")
    ap.add_argument("--agent-seconds", type=float, default=2.0)
    ap.add_argument("--write", metavar="FILE")
    args = ap.parse_args(argv)
    tasks = load(args.tasks, args.agent_seconds)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gitlease-bench-train-") as tmp, GitDaemon(Path(tmp) / "served") as daemon:
        agent = Path(tmp) / "agent.py"
        agent.write_text(AGENT)
        for w in (int(x) for x in args.workers.split(",")):
            rows.append(run_one(daemon, Path(tmp), tasks, w, agent))
            print(json.dumps(rows[-1]), flush=True)
    five = next((r for r in rows if r["workers"] == 5), None)
    lines = [
        BEGIN,
        f"`python bench/train.py` ({args.tasks} tasks from the requests trace, file granularity, a fake agent of "
        f"{args.agent_seconds:g} s a task, git daemon with the server hook; one run each):",
        "",
        "| workers | makespan | tasks / min | vs 5 workers | landing share of worker time | agent runs | landing pushes | non-ff retries |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = f"{r['per_minute'] / five['per_minute']:.2f}x" if five else "-"
        lines.append(
            f"| {r['workers']} | {r['makespan']:.1f} s | {r['per_minute']:.1f} | {ratio} | {r['landing_share']:.0%} "
            f"| {r['agent_runs']} | {r['pushes']} | {r['retries']} |"
        )
    ten = next((r for r in rows if r["workers"] == 10), None)
    if five and ten:
        met = [
            ("10 workers >= 1.5x the throughput of 5", ten["per_minute"] >= 1.5 * five["per_minute"]),
            ("landing < 20 % of worker time at 10", ten["landing_share"] < 0.20),
            ("no agent re-run caused by landing", all(r["agent_runs"] == args.tasks for r in rows)),
        ]
        lines += [""] + [f"- {what}: {'met' if ok else 'not met'}" for what, ok in met]
    lines.append(END)
    if args.write:
        heading = "## The landing train (`git lease work` at 1 to 20 workers)"
        write_section(args.write, "\n".join(lines), BEGIN, END, heading=heading)
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
