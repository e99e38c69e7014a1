#!/usr/bin/env python3
"""Start-up of the fast path, two trees side by side: ``git lease status`` (and ``can-start``) as a process, and
the imports of ``dispatch(['status'])`` by ``python -X importtime``, runs interleaved so that the machine's load
hits both alike. Issue 18 item 3 (the CLI defined once) must not cost start-up.

    .venv/bin/python bench/startup.py --before /path/to/a/checkout/of/main [--runs 40]

``--before``: a checkout (``git worktree add --detach /tmp/before main``) whose ``gitlease`` is put first on
``PYTHONPATH``; "after" is the tree this venv is installed from. Standard library only; prints a table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a checkout of the tree to compare against")
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    bindir = os.path.dirname(sys.executable)
    base = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"])
    base.pop("PYTHONPATH", None)
    envs = {"before": dict(base, PYTHONPATH=os.path.abspath(args.before)), "after": base}
    with tempfile.TemporaryDirectory(prefix="gitlease-startup-") as tmp:
        repo = os.path.join(tmp, "r")
        subprocess.run(["git", "init", "-q", repo], check=True)
        subprocess.run(["git", "-C", repo, "commit", "-q", "--allow-empty", "-m", "i"], check=True, env=base)
        cmds = [["git", "lease", "status"], ["git-lease", "status"], ["git-lease", "can-start", "-s", "a"]]
        wall: dict[tuple[str, str], list[float]] = {(k, " ".join(c)): [] for k in envs for c in cmds}
        imports: dict[str, list[float]] = {k: [] for k in envs}
        heavy: dict[str, set[str]] = {k: set() for k in envs}
        for _ in range(args.runs):
            for k, env in envs.items():
                for c in cmds:
                    t0 = time.perf_counter()
                    subprocess.run(c, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    wall[(k, " ".join(c))].append((time.perf_counter() - t0) * 1000)
                code = "from gitlease.cli import dispatch; dispatch(['status'])"
                out = subprocess.run(
                    [sys.executable, "-X", "importtime", "-c", code], cwd=repo, env=env, capture_output=True, text=True
                ).stderr
                total = 0
                for line in out.splitlines():
                    if line.startswith("import time:") and "self [us]" not in line:
                        parts = line.split("|")
                        total += int(parts[0].split(":")[1])
                        name = parts[2].strip()
                        if name.split(".")[0] in ("typer", "click", "cryptography"):
                            heavy[k].add(name.split(".")[0])
                imports[k].append(total / 1000)
    print(f"{'command':32s} {'tree':7s} {'median ms':>10s} {'p10 ms':>8s}")
    for (k, c), xs in sorted(wall.items(), key=lambda kv: (kv[0][1], kv[0][0] != "before")):
        xs.sort()
        print(f"{c:32s} {k:7s} {statistics.median(xs):10.1f} {xs[len(xs) // 10]:8.1f}")
    for k, xs in imports.items():
        print(
            f"imports of dispatch(['status']), {k}: median {statistics.median(xs):.1f} ms; "
            f"typer/click/cryptography imported: {sorted(heavy[k]) or 'none'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
