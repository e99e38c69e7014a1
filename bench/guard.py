#!/usr/bin/env python3
"""gitlease edit-time guard benchmark: ``git-lease-hook pre-edit`` as an agent's hook runner starts it (the
command ``git lease agent-hooks install`` writes: ``python -S`` on the hooks' entry, the payload on stdin),
against ``python -S -c pass``, the interpreter start no Python hook can avoid.

    .venv/bin/python bench/guard.py                               # table on stdout
    .venv/bin/python bench/guard.py --quick                       # fewer runs
    .venv/bin/python bench/guard.py --write docs/performance.md   # also write its section

Target (issue 20): the guard adds under 30 ms over ``python -S -c pass``. Cases, in a repository of 200 files
in 20 folders (local lease store) under a temporary HOME:

1. ``allowed (strict)``: this worktree holds a lease on ``pkg00``, the edit is inside it;
2. ``refused (strict)``: the same worktree, the edit is outside (the refusal names the lease to extend);
3. ``allowed (others)``: no lease here, another worktree holds ``pkg19``: the lease refs are read;
4. ``refused (others)``: the edit is inside the other worktree's lease: its record is read to name it;
5. ``pass``: ``python -S -c pass``.

Each round runs every case once, in turn, as a subprocess (bytecode caches written during the warm-up rounds,
in a temporary ``PYTHONPYCACHEPREFIX``). The section sits between ``<!-- guard:begin -->`` and
``<!-- guard:end -->`` in docs/performance.md (bench/run.py keeps it). Standard library and gitlease only.
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hooks import bench_main, git, make_repo, p90  # noqa: E402
from gitlease.core.config import resolve  # noqa: E402
from gitlease.core.repo import Repo  # noqa: E402
from gitlease.enforce.agenthooks import hook_command  # noqa: E402
from gitlease.service.leases import LeaseService  # noqa: E402
from testing.benchdoc import markers  # noqa: E402

BEGIN, END = markers("guard")
TARGET_MS = 30.0


def setup(tmp: Path) -> dict[str, tuple[Path, str]]:
    """case -> (repository, file the edit writes)"""
    strict = make_repo(tmp / "strict")
    repo = Repo.discover(strict)
    LeaseService(repo, resolve(repo.config, env={}, agent="bench", task="bench")).acquire(["pkg00"], ttl=86400)
    others = make_repo(tmp / "others")
    holder = tmp / "others-holder"
    git("worktree", "add", "-q", "--detach", str(holder), cwd=others)
    repo = Repo.discover(holder)
    LeaseService(repo, resolve(repo.config, env={}, agent="b", task="b")).acquire(["pkg19"], ttl=86400)
    many = make_repo(tmp / "many")  # 1,000 leases of another worktree, in loose refs
    holder = tmp / "many-holder"
    git("worktree", "add", "-q", "--detach", str(holder), cwd=many)
    repo = Repo.discover(holder)
    svc = LeaseService(repo, resolve(repo.config, env={}, agent="m", task="m"))
    for i in range(999):
        svc.acquire([f"many/p{i:03d}"], ttl=86400)
    svc.acquire(["pkg19"], ttl=86400)
    cases = {}  # an edit in pkg00 is allowed everywhere; strict refuses pkg01 (not its own), others pkg19 (b's)
    for where, wt, refused in (
        ("strict", strict, "pkg01"),
        ("others", others, "pkg19"),
        ("others, 1,000 leases", many, "pkg19"),
    ):
        cases[f"allowed ({where})"] = (wt, "pkg00/mod1.py")
        cases[f"refused ({where})"] = (wt, f"{refused}/mod1.py")
    return cases


def timed(argv: list[str], cwd: Path, data: bytes | None = None, want: int | None = None) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, input=data, capture_output=True)
    dt = (time.perf_counter() - t0) * 1000
    if want is not None and res.returncode != want:
        raise SystemExit(f"{' '.join(argv[:3])}: exit {res.returncode}, wanted {want}: {res.stderr.decode()}")
    return dt


def measure(cases, runs: int, warmup: int) -> dict[str, list[float]]:
    argv = ["sh", "-c", hook_command("pre-edit")]  # agents run hook commands through a shell
    samples: dict[str, list[float]] = {k: [] for k in cases}
    samples["python -S -c pass"] = []
    for i in range(warmup + runs):
        for name, (repo, path) in cases.items():
            payload = {"tool_name": "Write", "tool_input": {"file_path": path, "content": "x"}, "cwd": str(repo)}
            dt = timed(argv, repo, json.dumps(payload).encode(), want=2 if name.startswith("refused") else 0)
            if i >= warmup:
                samples[name].append(dt)
        py = timed([sys.executable, "-S", "-c", "pass"], ROOT)
        if i >= warmup:
            samples["python -S -c pass"].append(py)
    return samples


def report(samples, runs: int, warmup: int, started: float, load0: float) -> str:
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["python -S -c pass"]
    rows = [
        "| `git-lease-hook pre-edit` | median ms | p90 ms | over `python -S -c pass` |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in [k for k in samples if k != "python -S -c pass"]:
        rows.append(f"| {name} | {med[name]:.1f} | {p90(samples[name]):.1f} | +{med[name] - base:.1f} |")
    rows.append(f"| python -S -c pass | {base:.1f} | {p90(samples['python -S -c pass']):.1f} | — |")
    worst = max(med[k] - base for k in samples if k != "python -S -c pass")
    verdict = f"**{'met' if worst < TARGET_MS else 'not met'}**: the slowest case adds {worst:.1f} ms"
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "## Edit-time guard: `git-lease-hook pre-edit`",
        "",
        f"From `bench/guard.py`, run {when}, {time.monotonic() - started:.0f} s, 1-minute load {load0:.2f} at the "
        f"start; {git('--version').strip()}; CPython {sys.version.split()[0]}. The command `git lease agent-hooks "
        "install` writes, started as a subprocess with a Claude Code `PreToolUse` payload (`Write`) on stdin, "
        f"through `sh -c`, in a repository of 200 files (local lease store). {runs} rounds after {warmup} warm-up rounds.",
        "",
        f"Target: the guard adds under {TARGET_MS:.0f} ms over `python -S -c pass`. {verdict}.",
        "",
        *rows,
        "",
        "`strict`: this worktree holds a lease on `pkg00` (the guard reads `git config` and held.json; a refusal "
        "also lists the lease refs to see who else holds the path). `others`: no lease here, another worktree "
        "holds `pkg19` (the lease refs are read; a refusal reads the holder's record with `git cat-file`). `1,000 leases`: "
        "the same with 1,000 leases of the other worktree in loose refs (the guard reads only the refs a path needs).",
        END,
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    def bench(tmp: Path, runs: int, warmup: int, started: float, load0: float) -> str:
        return report(measure(setup(tmp), runs, warmup), runs, warmup, started, load0)

    return bench_main(argv, __doc__, "guard", bench)


if __name__ == "__main__":
    sys.exit(main())
