#!/usr/bin/env python3
"""Lease + attach a worktree against ``git worktree add`` alone, in the same run, on a tokio-sized repository.

    .venv/bin/python bench/worktree.py [--rounds 15] [--files-kb 8]

The repository is built from ``/work/shared/traces/tokio-2000.jsonl`` (or ``--trace``): every path the trace
names (927 for tokio) becomes a file of ``--files-kb`` KiB of text, in one commit, so checkout cost is that of
a real workspace of that shape. Each round, interleaved so load drift hits every column alike:

1. ``git worktree add --no-track -b BRANCH PATH HEAD`` as one subprocess (the baseline);
2. ``WorktreeManager.acquire([scope])`` in-process: lease on the local store + fresh worktree, locked, bound;
3. the same after the previous round's worktree was released and pruned into the pool (reuse: inspect + reset);
4. the whole ``git lease acquire --scope S --worktree`` process.

Clean-up between rounds is not timed. Prints a Markdown table (median, p90, ratio to the baseline median).
Standard library and gitlease only; runs under a temporary HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from testing.gitutil import git  # noqa: E402


def build_repo(base: str, trace: str, kb: int) -> str:
    paths = set()
    with open(trace, encoding="utf-8") as fh:
        for line in fh:
            paths.update(json.loads(line)["paths"])
    repo = os.path.join(base, "tokio")
    git(base, "init", "-q", repo)
    line = 'fn main() { println!("lease first, then a clean worktree"); }\n'
    body = (line * (kb * 1024 // len(line) + 1))[: kb * 1024]
    n = 0
    for p in sorted(paths):
        full = os.path.join(repo, p)
        try:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as fh:
                fh.write(f"// {p}\n{body}")
            n += 1
        except (IsADirectoryError, NotADirectoryError, FileExistsError):
            continue  # a path that was a file in one commit and a directory in another
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tokio-shaped tree")
    git(repo, "gc", "-q")
    return repo, n


def stats(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2], xs[min(len(xs) - 1, int(len(xs) * 0.9))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--files-kb", type=int, default=8)
    ap.add_argument("--trace", default="/work/shared/traces/tokio-2000.jsonl")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="gitlease-wt-bench-")
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    with open(os.path.join(home, ".gitconfig"), "w") as fh:
        fh.write(
            "[user]\n\tname = bench\n\temail = bench@example.invalid\n[init]\n\tdefaultBranch = main\n"
            "[gc]\n\tauto = 0\n"
        )
    os.environ.update(HOME=home, GIT_CONFIG_GLOBAL=os.path.join(home, ".gitconfig"), GIT_CONFIG_NOSYSTEM="1")
    try:
        from gitlease.core.clock import SYSTEM
        from gitlease.core.config import resolve
        from gitlease.core.repo import Repo
        from gitlease.service.leases import LeaseService
        from gitlease.worktree.manager import WorktreeManager

        repo, nfiles = build_repo(tmp, a.trace, a.files_kb)
        git(repo, "config", "lease.worktreeRoot", os.path.join(tmp, "pool"))

        def mgr(where=repo):
            r = Repo.discover(where)
            return WorktreeManager(
                LeaseService(r, resolve(r.config, env={}, agent="bench", task="bench"), clock=SYSTEM)
            )

        cols = {
            "git worktree add": [],
            "lease + fresh worktree (library)": [],
            "lease + pooled worktree (library)": [],
            "git lease acquire --worktree (CLI)": [],
        }
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        for i in range(a.rounds):
            path = os.path.join(tmp, "plain", f"w{i}")
            t = time.perf_counter()
            git(repo, "worktree", "add", "-q", "--no-track", "-b", f"plain/{i}", path, "HEAD")
            cols["git worktree add"].append(time.perf_counter() - t)
            git(repo, "worktree", "remove", path)

            m = mgr()
            t = time.perf_counter()
            att = m.acquire([f"fresh/{i}"])
            cols["lease + fresh worktree (library)"].append(time.perf_counter() - t)
            mgr(att.path).svc.release(att.lease_id)
            m.prune()  # now a clean pool worktree

            m = mgr()
            t = time.perf_counter()
            att2 = m.acquire([f"pool/{i}"])
            cols["lease + pooled worktree (library)"].append(time.perf_counter() - t)
            assert att2.reused, att2.skipped
            mgr(att2.path).svc.release(att2.lease_id)
            m.prune(remove=True)

            t = time.perf_counter()
            res = subprocess.run(
                ["git", "lease", "acquire", "--scope", f"cli/{i}", "--worktree", "--json"],
                cwd=repo,
                env=env,
                capture_output=True,
                text=True,
            )
            cols["git lease acquire --worktree (CLI)"].append(time.perf_counter() - t)
            doc = json.loads(res.stdout)["result"]
            mgr(doc["worktree"]["path"]).svc.release(doc["leaseId"])
            mgr().prune(remove=True)

        base = stats(cols["git worktree add"])[0]
        version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.split()[-1]
        print(
            f"Repository: {nfiles} files of {a.files_kb} KiB (paths of {os.path.basename(a.trace)}), "
            f"{a.rounds} rounds, git {version}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}\n"
        )
        print("| operation | median | p90 | median / git worktree add |")
        print("| --- | --- | --- | --- |")
        for name, xs in cols.items():
            med, p90 = stats(xs)
            print(f"| {name} | {med * 1000:.0f} ms | {p90 * 1000:.0f} ms | {med / base:.2f}x |")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
