"""Reads at scale, the CPU half of issue 22: rows that bench/scale.py adds to its section (``markdown_rows``).

    .venv/bin/python bench/scale_cpu.py [--quick]     # the rows alone, on stdout

Each figure is CPU (user + system) of the whole process tree, the median of interleaved runs, against a git
baseline measured in the same run:

* parsing one 1,000-path lease record (in-process; against the pairwise ``minimize`` it replaced, on the same
  paths);
* ``git lease can-start`` with 1,000 paths against 10,000 leases (against ``git lease status`` and
  ``git ls-remote`` on the same store: the added cost is the overlap check);
* ``git push`` of a 1,000-file change with the pre-push hook installed, against 10,000 leases (against the same
  push with ``--no-verify``; the floor: an interpreter and the store's listing, gitlease's imports apart);
* ``git lease acquire`` of a one-path scope (against ``python -c pass`` plus one ``git push`` of a new ref to the
  same remote);
* ``git lease status`` from a clone whose replay memory holds 25,000 more leases (against a clone of the same
  store remembering only its own), whether reads rewrite the memory, and the ``ls-remote`` calls of a read.

``--quick``: 1,000 leases instead of 10,000, fewer runs. Standard library and gitlease only.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT / "bench"))


def parse_row(rounds: int) -> dict:
    from gitlease.core import record as records
    from gitlease.core import scope as scopes

    paths = tuple(sorted(f"w/{k}" for k in range(1000)))
    owner = records.Owner(task_id="bench", agent_id="bench", host="bench", pid=0)
    rec = records.new_record(
        lease_id=records.new_lease_id(time.time()), repo="bench", paths=paths, workspace_id="bench", owner=owner,
        now=time.time(), ttl=3600,
    )  # fmt: skip
    data = rec.canonical()
    ours, old = [], []
    for _ in range(max(rounds, 5)):
        t = time.process_time()
        records.parse(data)
        ours.append(time.process_time() - t)
    for _ in range(max(1, rounds // 3)):
        t = time.process_time()
        scopes.minimize_quadratic(paths)
        old.append(time.process_time() - t)
    return {"parse": statistics.median(ours), "quadratic": statistics.median(old)}


def fresh_commit(client: Path, tree: str, parent: str, k: int) -> str:
    from scale import git

    return git("commit-tree", tree, "-p", parent, "-m", f"change {k} {time.time_ns()}", cwd=client).strip()


def store_rows(tmp: Path, n: int, rounds: int, log) -> dict:
    """can-start and pre-push against ``n`` leases."""
    from scale import LEASE, cpu_of, git, new_store, populate, prepush_setup

    bare, client, url = new_store(tmp, f"cpu{n}")
    populate(bare, n, expired=False, tag="s")
    git("pack-refs", "--all", cwd=bare)
    git("remote", "add", "origin", url, cwd=client)
    git("config", "lease.remote", "origin", cwd=client)
    subprocess.run([*LEASE, "status", "--json"], cwd=client, capture_output=True)  # fetch the objects once
    scopes = [f"c/{k}" for k in range(1000)]
    argv_can = [*LEASE, "can-start", "--json"] + [x for s in scopes for x in ("--scope", s)]
    res = subprocess.run(argv_can, cwd=client, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"can-start: exit {res.returncode}: {res.stdout[-300:]} {res.stderr[-300:]}")
    # a 1,000-file change, outside every lease: the hook reads the store and lets it through
    base, tree = prepush_setup(client, url, 1000)
    for name in ("probe", "probe2"):  # two full checks on the same listing: the second writes the lean path's digest
        probe = fresh_commit(client, tree, base, -1 - len(name))
        res = subprocess.run(["git", "push", "origin", f"{probe}:refs/heads/{name}"], cwd=client, capture_output=True)
        if res.returncode != 0:
            raise RuntimeError(f"the hooked push was refused: {res.stderr.decode(errors='replace')[-400:]}")
    import scale

    # what the hook cannot do without: an interpreter (started as the hook starts it: -S), the modules of its
    # lean path (enforce/quickpush.py), and the one listing of the store (every id ref, to see a torn lease)
    # that also answers the remote's HEAD
    imports = "import gitlease.enforce.entry, gitlease.enforce.quickpush, gitlease.service.recordindex, os"
    floor_argv = {
        "python": [scale.PYTHON, "-S", "-c", "pass"],
        "imports": [scale.PYTHON, "-S", "-c", f"{imports}; os._exit(0)"],
        "listing": ["git", "ls-remote", "--symref", "origin", "HEAD", "refs/leases/*"],
    }
    can, status, lsr, hooked, plain, full = [], [], [], [], [], []
    cache = client / ".git" / "gitlease" / "cache"
    digest, last = cache / "push-digest.marshal", cache / "push-listing.key"  # enforce/quickpush.DIGEST, LAST_KEY
    floor: dict[str, list[float]] = {k: [] for k in floor_argv}
    runs = rounds if n < 10_000 else min(rounds, 3)
    for k in range(runs):  # interleaved
        can.append(cpu_of(argv_can, client))
        status.append(cpu_of([*LEASE, "status", "--json"], client))
        lsr.append(cpu_of(["git", "ls-remote", url, "refs/leases/*"], client))
        c1, c2 = fresh_commit(client, tree, base, 2 * k), fresh_commit(client, tree, base, 2 * k + 1)
        hooked.append(cpu_of(["git", "push", "-q", "origin", f"{c1}:refs/heads/h{k}"], client))
        plain.append(cpu_of(["git", "push", "-q", "--no-verify", "origin", f"{c2}:refs/heads/p{k}"], client))
        # as after a lease moved on the store since the last push: no digest answers, the full check runs (and
        # notes the listing, writing no digest); then the quiet store's digest put back for the next round
        kept = (digest.read_bytes(), last.read_bytes())
        digest.unlink()
        last.write_bytes(b"another listing")
        c3 = fresh_commit(client, tree, base, 2 * k + 10_000)
        full.append(cpu_of(["git", "push", "-q", "origin", f"{c3}:refs/heads/f{k}"], client))
        digest.write_bytes(kept[0])
        last.write_bytes(kept[1])
        for name, argv in floor_argv.items():
            floor[name].append(cpu_of(argv, client))
    row = {
        "n": n,
        "can_start": statistics.median(can),
        "status": statistics.median(status),
        "ls_remote": statistics.median(lsr),
        "hooked": statistics.median(hooked),
        "plain": statistics.median(plain),
        "full": statistics.median(full),
        **{f"floor_{k}": statistics.median(v) for k, v in floor.items()},
    }
    log(
        f"n={n}: can-start {row['can_start']:.3f} s, status {row['status']:.3f} s, pre-push {row['hooked']:.3f} s "
        f"vs push {row['plain']:.3f} s"
    )
    return row


def acquire_row(tmp: Path, rounds: int, log) -> dict:
    import scale
    from scale import LEASE, cpu_of, git, new_store

    bare, client, url = new_store(tmp, "acq")
    ours, pushes, pys = [], [], []
    blob = git("hash-object", "-w", "--stdin", cwd=client, input=b"x").strip()
    for k in range(max(rounds, 5)):
        ours.append(cpu_of([*LEASE, "acquire", "--scope", f"a/{k}", "--ttl", "600"], client))
        tree = git("mktree", cwd=client, input=f"100644 blob {blob}\tf{k}\n".encode()).strip()
        commit = git("commit-tree", tree, "-m", f"p{k}", cwd=client).strip()
        pushes.append(cpu_of(["git", "push", "-q", "--atomic", url, f"{commit}:refs/bench/p{k}"], client))
        pys.append(cpu_of([scale.PYTHON, "-c", "pass"], client))
    row = {"acquire": statistics.median(ours), "push": statistics.median(pushes), "python": statistics.median(pys)}
    log(f"acquire {row['acquire'] * 1000:.0f} ms, push {row['push'] * 1000:.0f} ms, python {row['python'] * 1000:.0f}")
    return row


def memory_row(tmp: Path, rounds: int, log, remembered: int = 25_000) -> dict:
    """``git lease status`` on a 10-lease store from a clone whose replay memory (identity/replay.py) also holds
    ``remembered`` leases seen gone, against a clone of the same store with only those 10; and whether the
    memory file was rewritten by reads that saw nothing new. Also the ``ls-remote`` calls of one status
    (``GIT_TRACE``; a signed read is counted by tests/test_scale_io.py)."""
    from scale import LEASE, cpu_of, git, new_store, populate

    bare, big, url = new_store(tmp, "memory")
    populate(bare, 10, expired=False, tag="m")
    small = tmp / "memory-small"
    git("clone", "-q", url, str(small))
    git("config", "lease.remote", url, cwd=small)
    for clone in (big, small):
        subprocess.run([*LEASE, "status", "--json"], cwd=clone, capture_output=True, check=True)
    from gitlease.identity.replay import Memory

    mem = next((big / ".git" / "gitlease" / "cache").glob("seen-*.marshal"))
    doc = Memory.parse(mem.read_bytes())
    far = time.time() + 30 * 86400
    doc.gone.update({f"lease_gone{k:06d}": far for k in range(remembered)})
    mem.write_bytes(doc.dump())
    subprocess.run([*LEASE, "status", "--json"], cwd=big, capture_output=True, check=True)
    before = mem.stat().st_mtime_ns
    ours, base = [], []
    for _ in range(max(rounds, 5)):  # interleaved
        ours.append(cpu_of([*LEASE, "status", "--json"], big))
        base.append(cpu_of([*LEASE, "status", "--json"], small))
    trace = tmp / "trace-status"
    env = dict(os.environ, GIT_TRACE=str(trace))
    subprocess.run([*LEASE, "status", "--json"], cwd=small, capture_output=True, check=True, env=env)
    trips = sum("built-in: git ls-remote" in ln for ln in trace.read_text().splitlines())
    row = {
        "remembered": remembered,
        "big": statistics.median(ours),
        "small": statistics.median(base),
        "rewritten": mem.stat().st_mtime_ns != before,
        "entries": len(Memory.parse(mem.read_bytes())),
        "trips": trips,
    }
    log(f"memory {remembered}: status {row['big'] * 1000:.0f} ms vs {row['small'] * 1000:.0f} ms; trips {trips}")
    return row


def measure(quick: bool, log) -> dict:
    from plan import isolate

    rounds = 3 if quick else 5
    n = 1000 if quick else 10_000
    tmp = Path(tempfile.mkdtemp(prefix="gitlease-scale-cpu-"))
    env = dict(os.environ)
    cwd = os.getcwd()
    try:
        isolate(tmp)
        os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
        os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
        from scale import bytecode

        bytecode(tmp)
        out = {
            "parse": parse_row(rounds),
            "store": store_rows(tmp, n, rounds, log),
            "acquire": acquire_row(tmp, rounds, log),
            "memory": memory_row(tmp, rounds, log),
        }
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def rows_of(m: dict) -> list[str]:
    def met(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    p, s, a, mem = m["parse"], m["store"], m["acquire"], m["memory"]
    n = s["n"]
    lines = [
        f"| parse one 1,000-path lease record (in-process) | {p['parse'] * 1000:.2f} ms CPU | the pairwise "
        f"`minimize` it replaced, on the same paths {p['quadratic'] * 1000:.0f} ms | under 5 ms; linear in the "
        f"paths | {met(p['parse'] < 0.005)} |",
        f"| `git lease can-start`, 1,000 paths against {n:,} leases | {s['can_start']:.2f} s CPU | `git lease "
        f"status` on the same store {s['status']:.2f} s; `git ls-remote` {s['ls_remote'] * 1000:.0f} ms | "
        f"under 0.5 s | "
        f"{met(s['can_start'] < 0.5)} |",
        f"| pre-push of a 1,000-file change against {n:,} leases | {s['hooked']:.2f} s CPU | the push without "
        f"the hook (`--no-verify`) {s['plain']:.2f} s ({s['hooked'] / s['plain']:.2f}x) | at most 1.4x | "
        f"{met(s['hooked'] <= 1.4 * s['plain'])} |",
        f"| the same after a lease moved on the store (no digest answers: the full check; a store that did change "
        f"also has the moved leases fetched and read, not counted here) | {s['full']:.2f} s CPU | the push without the hook {s['plain']:.2f} s "
        f"({s['full'] / s['plain']:.2f}x) | | |",
        f"| floor: an interpreter and the store's listing | {_floor(s) * 1000:.0f} ms CPU: `python -S -c pass` "
        f"{s['floor_python'] * 1000:.0f} ms, the listing (`ls-remote`) {s['floor_listing'] * 1000:.0f} ms | the push "
        f"without the hook + these: {(s['plain'] + _floor(s)) / s['plain']:.2f}x; gitlease's imports "
        f"{(s['floor_imports'] - s['floor_python']) * 1000:.0f} ms and its own work "
        f"{(s['hooked'] - s['plain'] - _floor(s) - s['floor_imports'] + s['floor_python']) * 1000:.0f} ms on top | | |",
        f"| `git lease acquire`, one path | {a['acquire'] * 1000:.0f} ms CPU | `python -c pass` "
        f"{a['python'] * 1000:.0f} ms + one `git push` {a['push'] * 1000:.0f} ms: "
        f"+{(a['acquire'] - a['python'] - a['push']) * 1000:.0f} ms over them | under 50 ms over them | "
        f"{met(a['acquire'] - a['python'] - a['push'] < 0.05)} |",
        f"| `git lease status` (10 leases) with {mem['remembered']:,} more leases in the replay memory | "
        f"{mem['big'] * 1000:.0f} ms CPU; the memory file rewritten by reads that saw nothing new: "
        f"{'yes' if mem['rewritten'] else 'no'} | the same store from a clone remembering only its 10 leases "
        f"{mem['small'] * 1000:.0f} ms (+{(mem['big'] - mem['small']) * 1000:.1f} ms) | constant-time lookup; "
        f"written only when it changes | {met(not mem['rewritten'] and mem['entries'] > mem['remembered'])} |",
        f"| `git ls-remote` calls of one `git lease status` | {mem['trips']} | | one | {met(mem['trips'] == 1)} |",
    ]
    return lines


def _floor(s: dict) -> float:
    """CPU any pre-push hook that reads the whole listing pays: an interpreter and the ``ls-remote``."""
    return s["floor_python"] + s["floor_listing"]


LAST: dict = {}


def markdown_rows(quick: bool = False) -> list[str]:
    """The rows for bench/scale.py's table (and the measurements, kept in LAST for its curve)."""
    m = measure(quick, lambda msg: print(msg, file=sys.stderr, flush=True))
    LAST.clear()
    LAST.update(m)
    return rows_of(m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    print("\n".join(markdown_rows(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
