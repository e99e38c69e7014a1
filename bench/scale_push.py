"""The pre-push hook against the number of refs a push updates: rows that bench/scale.py adds to its section.

    .venv/bin/python bench/scale_push.py [--quick]     # the rows alone, on stdout

A store with 1,000 one-path leases; a clone with 1,000 branches already on the store, each a commit of its own
(so every pushed ref has its own old value: the hook judges each by what it gains over it). Each round gives
1 / 100 / 1,000 of the branches one new commit each (one ``git fast-import``) and pushes them in one ``git push``
with the hook, then as many again with ``--no-verify``: CPU of the whole process tree, median of the rounds,
interleaved. One more push with ``GIT_TRACE`` counts the git processes the hooked push starts beyond the
plain one: the hook's own. Standard library and gitlease only.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BRANCHES = 1000
REFS = (1, 100, 1000)


def _advance(client: Path, names: list[str], k: int) -> None:
    """One new commit on each branch of ``names`` (a file of its own changed), by one ``git fast-import``."""
    chunks = []
    for i, name in enumerate(names):
        data = f"{name} {k} {time.time_ns()}\n".encode()
        chunks.append(
            b"commit refs/heads/%s\nmark :%d\ncommitter b <b@b> %d +0000\ndata 2\nc\nfrom refs/heads/%s^0\n"
            b"M 100644 inline free/%s/f\ndata %d\n%s\n"
            % (name.encode(), i + 1, int(time.time()), name.encode(), name.encode(), len(data), data)
        )
    subprocess.run(["git", "fast-import", "--quiet", "--force"], cwd=client, input=b"".join(chunks), check=True)


def _cpu_env(argv: list[str], cwd: Path, env: dict | None = None) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(argv, cwd=cwd, capture_output=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"{argv[:4]}: exit {res.returncode}: {res.stderr.decode(errors='replace')[-400:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _processes(client: Path, argv: list[str], trace: Path) -> int:
    trace.unlink(missing_ok=True)
    _cpu_env(argv, client, dict(os.environ, GIT_TRACE=str(trace)))
    lines = trace.read_text(errors="replace").splitlines()
    return sum(" trace: built-in: git " in ln or " trace: exec: git-" in ln for ln in lines)


def push_rows(tmp: Path, rounds: int, log, branches: int = BRANCHES) -> list[dict]:
    """Pre-push at 1 / 100 / 1,000 pushed refs (fewer in a quick run): CPU against the same push without the
    hook, and the git processes the hook starts."""
    from scale import git, new_store, populate, prepush_setup

    bare, client, url = new_store(tmp, "push-refs")
    populate(bare, 1000, expired=False, tag="s")
    git("pack-refs", "--all", cwd=bare)
    git("remote", "add", "origin", url, cwd=client)
    git("config", "lease.remote", "origin", cwd=client)
    prepush_setup(client, url, 1)  # the hook installed
    names = [f"b{k:04d}" for k in range(branches)]
    git("update-ref", "--stdin", cwd=client, input="".join(f"create refs/heads/{n} HEAD\n" for n in names).encode())
    _advance(client, names, -1)  # each branch a commit of its own
    git("push", "-q", "--no-verify", "origin", "refs/heads/b*:refs/heads/b*", cwd=client)
    rows = []
    for n in (r for r in REFS if r <= branches):
        chosen = names[:n]
        spec = [f"refs/heads/{b}:refs/heads/{b}" for b in chosen]
        hooked, plain = [], []
        for k in range(rounds):
            _advance(client, chosen, 2 * k)
            hooked.append(_cpu_env(["git", "push", "-q", "origin", *spec], client))
            _advance(client, chosen, 2 * k + 1)
            plain.append(_cpu_env(["git", "push", "-q", "--no-verify", "origin", *spec], client))
        _advance(client, chosen, 10_000)
        with_hook = _processes(client, ["git", "push", "-q", "origin", *spec], tmp / "trace-hooked")
        _advance(client, chosen, 10_001)
        without = _processes(client, ["git", "push", "-q", "--no-verify", "origin", *spec], tmp / "trace-plain")
        row = {
            "refs": n,
            "hooked": statistics.median(hooked),
            "plain": statistics.median(plain),
            "processes": with_hook - without,
        }
        rows.append(row)
        log(
            f"pre-push {n} refs: {row['hooked'] * 1000:.0f} ms CPU vs {row['plain'] * 1000:.0f} ms, "
            f"{row['processes']} git processes in the hook"
        )
    return rows


def markdown_rows(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        out.append(
            f"| pre-push of {r['refs']:,} pushed ref{'s' if r['refs'] != 1 else ''} (each its own old value on "
            f"the store, one new commit each; 1,000 leases) | {r['hooked'] * 1000:.0f} ms CPU; "
            f"**{r['processes']} git processes** started by the hook | the push without the hook (`--no-verify`) "
            f"{r['plain'] * 1000:.0f} ms ({r['hooked'] / r['plain']:.2f}x) | a handful of git processes, "
            f"whatever the refs | {'**met**' if r['processes'] <= 25 else '**not met**'} |"
        )
    return out


def main(argv=None) -> int:
    import argparse
    import shutil
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 branches, 3 rounds")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="gitlease-scale-push-"))
    env = dict(os.environ)
    try:
        from plan import isolate
        from scale import bytecode

        isolate(tmp)
        os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
        bytecode(tmp)
        rows = push_rows(tmp, 3 if args.quick else 5, lambda m: print(m, file=sys.stderr, flush=True),
                         branches=100 if args.quick else BRANCHES)  # fmt: skip
    finally:
        os.environ.clear()
        os.environ.update(env)
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(markdown_rows(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
