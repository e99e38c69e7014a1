#!/usr/bin/env python3
"""gitlease hook benchmark: ``git commit`` with gitlease's pre-commit hook, against plain ``git commit`` and
against ``git commit`` with git-lfs's hooks, side by side in one run.

    .venv/bin/python bench/hooks.py                               # tables on stdout
    .venv/bin/python bench/hooks.py --quick                       # fewer runs
    .venv/bin/python bench/hooks.py --write docs/performance.md   # also write its section (``make bench``)

Four repositories with the same content (200 files in 20 folders) under a temporary HOME with its own global
git config:

1. ``plain``: no hooks;
2. ``gitlease strict``: ``git lease install-hooks`` and a lease on the folder the commits change (local
   store), so every commit runs the strict check (held.json, staged paths);
3. ``gitlease others``: the hooks, no lease held here, another worktree holding an unrelated folder: the
   default mode of a plain worktree (it also reads the lease refs);
4. ``git-lfs``: ``git lfs install --local`` (its post-commit hook runs on every commit; its pre-push hook
   is not involved). Skipped, and reported as unavailable, when ``git-lfs`` is not installed.

Python's bytecode caches for the hook live in a temporary ``PYTHONPYCACHEPREFIX`` (written during the warm-up
rounds; ``PYTHONDONTWRITEBYTECODE`` is unset), as on a user's machine. Each round changes one file in each repository, stages it (not timed), and times ``git commit -q -m ...``
as a subprocess; the repositories take turns round by round so that load drift hits every column alike.
The section written into docs/performance.md sits between ``<!-- hooks:begin -->`` and
``<!-- hooks:end -->``; bench/run.py keeps it when it rewrites the file. Standard library and gitlease only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gitlease.core.config import resolve  # noqa: E402
from gitlease.core.repo import Repo  # noqa: E402
from gitlease.enforce.install import install  # noqa: E402
from gitlease.service.leases import LeaseService  # noqa: E402
from testing.benchdoc import markers, write_section  # noqa: E402
from testing.bytecode import keep_bytecode  # noqa: E402

BEGIN, END = markers("hooks")


def git(*args, cwd=None) -> str:
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {res.stderr.strip()}")
    return res.stdout


def isolate(tmp: Path) -> None:
    home = tmp / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[init]\n\tdefaultBranch = main\n[user]\n\tname = bench\n\temail = b@x\n")
    os.environ.update(HOME=str(home), GIT_CONFIG_GLOBAL=str(home / ".gitconfig"), GIT_CONFIG_NOSYSTEM="1")
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        os.environ.pop(var, None)
    # Bytecode caches as a user's machine has them (written during the warm-up rounds), kept out of the tree.
    keep_bytecode(tmp / "pycache")


def make_repo(path: Path) -> Path:
    git("init", "-q", str(path))
    for d in range(20):
        (path / f"pkg{d:02d}").mkdir()
        for f in range(10):
            (path / f"pkg{d:02d}" / f"mod{f}.py").write_text(f"# {d} {f}\n" * 20)
    git("add", ".", cwd=path)
    git("commit", "-q", "-m", "init", cwd=path)
    return path


def lfs_version() -> str | None:
    if not shutil.which("git-lfs"):
        return None
    res = subprocess.run(["git", "lfs", "version"], capture_output=True, text=True)
    return res.stdout.strip() if res.returncode == 0 else None


def setup(tmp: Path, with_lfs: bool) -> dict[str, Path]:
    repos = {"plain": make_repo(tmp / "plain")}
    strict = make_repo(tmp / "strict")
    install(str(strict))
    repo = Repo.discover(strict)
    LeaseService(repo, resolve(repo.config, env={}, agent="bench", task="bench")).acquire(["pkg00"], ttl=86400)
    repos["gitlease strict"] = strict
    others = make_repo(tmp / "others")
    install(str(others))
    holder = tmp / "others-holder"
    git("worktree", "add", "-q", "--detach", str(holder), cwd=others)
    repo = Repo.discover(holder)
    LeaseService(repo, resolve(repo.config, env={}, agent="b", task="b")).acquire(["pkg19"], ttl=86400)
    repos["gitlease others"] = others
    if with_lfs:
        lfs = make_repo(tmp / "lfs")
        git("lfs", "install", "--local", cwd=lfs)
        repos["git-lfs"] = lfs
    return repos


def timed_commit(path: Path, n: int) -> float:
    f = path / "pkg00" / "mod0.py"
    f.write_text(f"# change {n} {os.urandom(4).hex()}\n")
    git("add", "pkg00/mod0.py", cwd=path)
    t0 = time.perf_counter()
    res = subprocess.run(["git", "commit", "-q", "-m", f"c{n}"], cwd=path, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"commit in {path.name} failed: {res.stderr.strip()}")
    return dt * 1000


def timed(argv, cwd) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=cwd, capture_output=True)
    return (time.perf_counter() - t0) * 1000


def measure(repos: dict[str, Path], runs: int, warmup: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in repos}
    hook = repos["gitlease strict"] / ".git" / "hooks" / "pre-commit"
    samples["gitlease hook alone (strict)"] = []
    samples["python -S -c pass"] = []
    for i in range(warmup + runs):
        for name, path in repos.items():
            dt = timed_commit(path, i)
            if i >= warmup:
                samples[name].append(dt)
        # the hook process alone, with a staged change, and the interpreter start it cannot avoid
        strict = repos["gitlease strict"]
        (strict / "pkg00" / "mod1.py").write_text(f"# staged {i}\n")
        git("add", "pkg00/mod1.py", cwd=strict)
        dt = timed([str(hook)], strict)
        git("reset", "-q", "--hard", cwd=strict)
        py = timed([sys.executable, "-S", "-c", "pass"], strict)
        if i >= warmup:
            samples["gitlease hook alone (strict)"].append(dt)
            samples["python -S -c pass"].append(py)
    return samples


def p90(xs):
    return sorted(xs)[max(0, int(round(0.9 * len(xs))) - 1)]


def report(samples, runs, warmup, lfs: str | None, started: float, load0: float) -> str:
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["plain"]
    rows = ["| `git commit` in | median ms | p90 ms | over plain |", "| --- | ---: | ---: | ---: |"]
    for name in [k for k in samples if k in ("plain", "gitlease strict", "gitlease others", "git-lfs")]:
        over = med[name] - base
        rows.append(
            f"| {name} | {med[name]:.1f} | {p90(samples[name]):.1f} | {'—' if name == 'plain' else f'+{over:.1f}'} |"
        )
    parts = ["| process alone | median ms | p90 ms |", "| --- | ---: | ---: |"]
    for name in ("gitlease hook alone (strict)", "python -S -c pass"):
        parts.append(f"| {name} | {med[name]:.1f} | {p90(samples[name]):.1f} |")
    ours = max(med["gitlease strict"], med["gitlease others"]) - base
    if lfs:
        theirs = med["git-lfs"] - base
        verdict = (
            f"**{'met' if ours <= theirs else 'not met'}**: gitlease adds {ours:.1f} ms (the slower of its "
            f"two modes), git-lfs's hooks add {theirs:.1f} ms"
        )
    else:
        verdict = "**not measured**: git-lfs is not installed here (Debian package `git-lfs`)"
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    gitv = git("--version").strip()
    lines = [
        BEGIN,
        "## Hooks: `git commit` with gitlease's pre-commit hook",
        "",
        f"From `bench/hooks.py` (`make bench`), run {when}, {time.monotonic() - started:.0f} s, 1-minute load "
        f"{load0:.2f} at the start; {gitv}; {lfs or 'git-lfs: not installed'}; CPython "
        f"{sys.version.split()[0]}. Four repositories with the same 200 files; each round changes and stages "
        "one file in each (not timed) and times `git commit -q` as a subprocess, the repositories taking turns. "
        f"{runs} rounds after {warmup} warm-up rounds.",
        "",
        f"Target: gitlease adds no more time to a commit than git-lfs's hooks do. {verdict}.",
        "",
        *rows,
        "",
        "`gitlease strict`: this worktree holds a lease on the changed folder (reads held.json, lists the staged "
        "paths: two git calls). `gitlease others`: no lease here, another worktree holds an unrelated folder "
        "(the default for a plain worktree; also lists the local lease refs: three git calls). `git-lfs`: "
        "`git lfs install --local` (its post-commit hook).",
        "",
        *parts,
        "",
        "The hook is a few lines of shell that exec `python -S` (no site: an editable install's path finder alone "
        "costs about 15 ms) with the standard library only; most of its time is that interpreter's start.",
        END,
    ]
    return "\n".join(lines) + "\n"


def bench_main(argv, doc: str, name: str, bench) -> int:
    """The command line of a start-up benchmark (this one, bench/guard.py): ``--quick`` (fewer rounds), ``--write
    FILE`` (its section of FILE, between the markers of ``name``). ``bench(tmp, runs, warmup, started, load0)``
    measures in ``tmp``, a temporary folder under an isolated HOME (removed after), and returns the section."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write", metavar="FILE")
    args = ap.parse_args(argv)
    runs, warmup = (10, 2) if args.quick else (60, 5)
    started, load0 = time.monotonic(), os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix=f"gitlease-bench-{name}-"))
    try:
        isolate(tmp)
        section = bench(tmp, runs, warmup, started, load0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(section)
    if args.write:
        write_section(Path(args.write), section, *markers(name))
        print(f"wrote its section of {args.write}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    def bench(tmp: Path, runs: int, warmup: int, started: float, load0: float) -> str:
        lfs = lfs_version()
        samples = measure(setup(tmp, lfs is not None), runs, warmup)
        return report(samples, runs, warmup, lfs, started, load0)

    return bench_main(argv, __doc__, "hooks", bench)


if __name__ == "__main__":
    sys.exit(main())
