#!/usr/bin/env python3
"""gitlease benchmark: lease operations against plain git, on a file:// bare remote and a real ``git daemon``.

    .venv/bin/python bench/run.py                    # full run, tables on stdout (about 3 minutes, 2 cores)
    .venv/bin/python bench/run.py --quick            # smoke check: fewer runs, no 10,000-lease case
    .venv/bin/python bench/run.py --write docs/performance.md   # also write the report (``make bench``)

What it measures, every figure from this one run (nothing in the report is typed in by hand):

1. baseline: one plain ``git push <url> <oid>:refs/bench/...`` of a new ref (a fresh, unique commit made
   beforehand) as a subprocess;
2. ``LeaseService.acquire`` / ``renew`` / ``release`` in-process, on disjoint fresh scopes, and their ratio to
   the baseline push of the same transport, with the git subprocesses each call made (``gitcmd.run`` is
   wrapped at run time to time them; gitlease itself is not modified);
3. the whole ``git lease acquire --scope X`` / ``renew ID`` / ``release ID`` process, and its overhead over the
   baseline push;
4. acquire (and plain push, and release) with 10, 1,000 and 10,000 valid active leases already on the remote,
   10,000 (and 1,000) with loose and with packed refs; the leases are real gitlease records (built with
   gitlease.core.record, written into the bare repository with one ``git fast-import``), counted with ``status()``
   and seen to refuse an overlapping acquire;
5. CLI start-up: ``git lease -h`` against ``python -c pass`` and ``git --version``, and
   ``python -X importtime -c "import gitlease.cli.core"``. The CLI measured is a regular ``pip install`` of
   this tree into a fresh venv (``--editable``: the development venv instead).

The measurements of 1-3 are interleaved (push, library calls, CLI calls, for file:// then git://, round after
round) so that drift in the machine's load hits every column alike. Everything runs under a temporary HOME
with its own global git config; the bare remote has ``receive.autogc=false`` and ``gc.auto=0`` so that no
background ``git gc`` (which would also pack the refs) runs in the middle of a measurement.

Standard library and gitlease only.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import datetime
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gitlease.core import gitcmd
from gitlease.core import record as records
from gitlease.core.config import resolve  # noqa: E402
from gitlease.core.errors import HeldError  # noqa: E402
from gitlease.core.refnames import scope_ref  # noqa: E402
from gitlease.core.repo import Repo  # noqa: E402
from gitlease.service.leases import LeaseService  # noqa: E402
from testing.servers import GitDaemon  # noqa: E402

VENV_BIN = Path(sys.executable).parent  # replaced in isolate() by a regular install's bin (see install_cli)
KINDS = ("file", "daemon")
LABEL = {"file": "file://", "daemon": "git daemon (git://)"}
SHORT = {"file": "file://", "daemon": "git://"}

TARGET_ACQUIRE_RATIO = 1.3  # library acquire within 1.3x of one plain push
TARGET_CLI_OVERHEAD_MS = 150.0  # whole `git lease ...` process: under 150 ms over one plain push
TARGET_SCALE_RATIO = 1.5  # acquire with 1,000 active leases within 1.5x of acquire with 10


@dataclass(frozen=True)
class Plan:
    runs: int  # samples per operation in parts 1-3
    warmup: int
    scale_runs: int  # samples per operation and case in part 4 ...
    scale_runs_large: int  # ... and in its 10,000-lease cases (a push there takes about a second)
    startup_runs: int  # samples per process in part 5
    importtime_runs: int
    sizes: tuple[tuple[int, bool], ...]  # (active leases, packed refs)


# Cases of part 4 in this order: leases are added (loose refs), then packed; the last case deletes leases
# back down to 1,000 on the packed remote, for loose against packed at 1,000 too.
FULL = Plan(
    runs=30,
    warmup=3,
    scale_runs=20,
    scale_runs_large=10,
    startup_runs=20,
    importtime_runs=5,
    sizes=((10, False), (1000, False), (10000, False), (10000, True), (1000, True)),
)
QUICK = Plan(
    runs=6,
    warmup=1,
    scale_runs=5,
    scale_runs_large=3,
    startup_runs=6,
    importtime_runs=2,
    sizes=((10, False), (1000, False), (1000, True)),
)


# ------------------------------------------------------------------------------------ statistics


def median(xs):
    return statistics.median(xs)


def p90(xs):
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=10, method="inclusive")[8]


def ms(x: float) -> str:
    return f"{x:,.1f}"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


# ----------------------------------------------------------------------- timing git subprocesses

_TRACE: list[tuple[str, float]] | None = None
_orig_run = gitcmd.run


def _git_name(args) -> str:
    it = iter(args)
    for a in it:
        if a in ("--git-dir", "-C", "-c"):
            next(it, None)
        elif not a.startswith("-"):
            return a
    return "?"


def _traced_run(args, **kw):
    t0 = time.perf_counter()
    try:
        return _orig_run(args, **kw)
    finally:
        if _TRACE is not None:
            _TRACE.append((_git_name(args), (time.perf_counter() - t0) * 1000))


gitcmd.run = _traced_run  # every git subprocess gitlease starts goes through gitcmd.run


def traced(fn):
    """Run fn(); return (result, elapsed ms, [(git subcommand, ms), ...])."""
    global _TRACE
    _TRACE = []
    t0 = time.perf_counter()
    try:
        out = fn()
        return out, (time.perf_counter() - t0) * 1000, _TRACE
    finally:
        _TRACE = None


# ------------------------------------------------------------------------------------ processes


class BenchError(RuntimeError):
    pass


def git(*args: str, cwd=None, input: bytes | str | None = None) -> str:
    if isinstance(input, str):
        input = input.encode()
    res = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True)
    if res.returncode != 0:
        raise BenchError(f"git {' '.join(args[:3])} failed: {res.stderr.decode(errors='replace').strip()}")
    return res.stdout.decode()


def run_timed(argv, *, cwd=None, check=True) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    elapsed = (time.perf_counter() - t0) * 1000
    if check and res.returncode != 0:
        raise BenchError(f"{' '.join(map(str, argv))} failed ({res.returncode}): {res.stderr.strip()}")
    return elapsed, res


# --------------------------------------------------------------------------------- environment


def install_cli(tmp: Path, editable: bool) -> Path:
    """The bin folder whose ``git-lease`` the CLI figures measure.

    By default a regular (non-editable) ``pip install`` of this tree into a fresh venv, as a user gets it:
    ``pip install -e`` adds an import finder to every interpreter start (about 15 ms), which no user pays.
    ``--editable`` measures the development venv instead (faster to set up)."""
    if editable:
        return VENV_BIN
    venv = tmp / "install"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    res = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(ROOT)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise BenchError(f"pip install of the tree failed: {res.stderr.strip()[-300:]}")
    return venv / "bin"


def isolate(tmp: Path, editable: bool = False) -> None:
    """A HOME and global git config of our own; no system config; fixed identity; the measured install's bin
    on PATH."""
    global VENV_BIN
    VENV_BIN = install_cli(tmp, editable)
    home = tmp / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[init]\n\tdefaultBranch = main\n[protocol]\n\tversion = 2\n[gc]\n\tauto = 0\n")
    for var in (
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_TRACE",
        "GIT_TRACE_PACKET",
        "GIT_TRACE2",
        "GIT_TRACE2_PERF",
        "GIT_TRACE2_EVENT",
        "GITLEASE_DEBUG",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPROFILEIMPORTTIME",
        "PYTHONDEVMODE",
    ):
        os.environ.pop(var, None)
    os.environ.update(
        {
            "HOME": str(home),
            "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "Bench",
            "GIT_AUTHOR_EMAIL": "bench@example.invalid",
            "GIT_COMMITTER_NAME": "Bench",
            "GIT_COMMITTER_EMAIL": "bench@example.invalid",
            "GIT_TERMINAL_PROMPT": "0",
            "GITLEASE_AGENT": "bench-agent",
            "GITLEASE_TASK": "bench",
            # Python processes keep their bytecode caches in a folder of ours, written on the warm-up runs: with
            # PYTHONDONTWRITEBYTECODE set, or sources edited since their cache was written, every `git lease`
            # would compile its modules again, which an installed gitlease never does.
            "PYTHONPYCACHEPREFIX": str(tmp / "pycache"),
            "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", ""), str(tmp / "bin")]),
            "LC_ALL": "C",
        }
    )
    # An external git command that does nothing: `git benchnoop` against running it directly is the cost of
    # git finding and starting an external command (as it does for `git lease`).
    (tmp / "bin").mkdir()
    noop = tmp / "bin" / "git-benchnoop"
    noop.write_text("#!/bin/sh\nexit 0\n")
    noop.chmod(0o755)
    if not (VENV_BIN / "git-lease").exists():
        raise BenchError(f"{VENV_BIN / 'git-lease'} is missing: run `make` (pip install -e .) first")


def machine() -> dict[str, str]:
    def out(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True).stdout.strip()
        except OSError:
            return "?"

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": out(["nproc"]),
        "git": out(["git", "--version"]),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_start": "%.2f" % os.getloadavg()[0],
        "code": code_version(),
    }


def code_version() -> str:
    try:
        head = git("rev-parse", "--short", "HEAD", cwd=ROOT).strip()
        dirty = [line[3:] for line in git("status", "--porcelain", "--", "gitlease", cwd=ROOT).splitlines()]
    except BenchError:
        return "not a git checkout"
    return f"commit {head}" + (f", with uncommitted changes in {', '.join(dirty)}" if dirty else "")


# ------------------------------------------------------------------------------------ fixtures


@dataclass
class Client:
    kind: str
    url: str
    path: Path
    svc: LeaseService = None  # type: ignore[assignment]
    commits: list[str] = field(default_factory=list)

    def service(self) -> LeaseService:
        repo = Repo.discover(self.path)
        return LeaseService(repo, resolve(repo.config))


def make_client(path: Path, kind: str, url: str) -> Client:
    git("init", "-q", str(path))
    git("commit", "-q", "--allow-empty", "-m", "init", cwd=path)
    git("config", "lease.remote", url, cwd=path)
    git("config", "gc.auto", "0", cwd=path)
    c = Client(kind, url, path)
    c.svc = c.service()
    return c


def fresh_commits(c: Client, n: int, tag: str) -> None:
    """n unique parentless commits (blob + tree + commit, like a lease version), made before any timing."""
    lines = []
    for i in range(n):
        blob = git("hash-object", "-w", "--stdin", cwd=c.path, input=f"bench {tag} {c.kind} {i} {time.time_ns()}\n")
        tree = git("mktree", cwd=c.path, input=f"100644 blob {blob.strip()}\tfile.txt\n").strip()
        lines.append(git("commit-tree", tree, "-m", f"bench {tag} {i}", cwd=c.path).strip())
    c.commits = lines


def delete_refs(bare: Path, prefix: str) -> None:
    refs = git("for-each-ref", "--format=%(refname)", prefix, cwd=bare).split()
    if refs:
        git("update-ref", "--stdin", cwd=bare, input="".join(f"delete {r}\n" for r in refs))


def clear_scratch_refs(bare: Path) -> None:
    """The baseline's pushes (refs/bench/) and the audit log of the releases measured (refs/leases-audit/: every
    release is audited) deleted, so that only leases are left to count."""
    delete_refs(bare, "refs/bench/")
    delete_refs(bare, "refs/leases-audit/")


def count_refs(bare: Path) -> tuple[int, int]:
    """(all refs, loose ref files) in the bare repository."""
    total = len(git("for-each-ref", "--format=%(refname)", cwd=bare).split())
    loose = sum(len(files) for _, _, files in os.walk(bare / "refs"))
    return total, loose


_used_ids: set[str] = set()
POPULATION: list[tuple[str, str]] = []  # (lease id, path) of every populated lease on the remote, in order


def shrink(bare: Path, n: int) -> None:
    """Delete the refs of every populated lease after the first ``n`` (one ``update-ref --stdin``)."""
    extra = POPULATION[n:]
    if extra:
        git(
            "update-ref",
            "--stdin",
            cwd=bare,
            input="".join(f"delete refs/leases/id/{i}\ndelete {scope_ref(p)}\n" for i, p in extra),
        )
        del POPULATION[n:]


def populate(bare: Path, first: int, count: int, ttl: int = 6 * 3600) -> None:
    """Add ``count`` valid, active, unsigned one-path leases (scopes pop/<first>...) to the bare repository
    with one ``git fast-import``: per lease a lease.json blob (gitlease's canonical record), a parentless
    commit on refs/leases/id/<id> and the scope ref pointing at the same commit (version 1 = the grant)."""
    if count <= 0:
        return
    now = time.time()
    host = socket.gethostname()
    owner = records.Owner(task_id="bench-population", agent_id="bench-pop", host=host, pid=0)
    chunks: list[bytes] = []
    for k in range(count):
        idx = first + k
        path = f"pop/{idx}"
        while True:
            lease_id = records.new_lease_id(now)
            if lease_id not in _used_ids:
                _used_ids.add(lease_id)
                break
        rec = records.new_record(
            lease_id=lease_id, repo="bench", paths=(path,), workspace_id="bench-pop", owner=owner, now=now, ttl=ttl
        )
        data = rec.canonical()
        msg = f"acquire {lease_id} v1\n\nscope: {path}\nexpires: {rec.expires_at}\n".encode()
        mark_b, mark_c = 2 * k + 1, 2 * k + 2
        chunks.append(b"blob\nmark :%d\ndata %d\n%s\n" % (mark_b, len(data), data))
        chunks.append(
            b"commit refs/leases/id/%s\nmark :%d\ncommitter bench-pop <bench-pop@%s> %d +0000\n"
            b"data %d\n%s\nM 100644 :%d lease.json\n\n"
            % (lease_id.encode(), mark_c, host.encode(), int(now), len(msg), msg, mark_b)
        )
        chunks.append(b"reset %s\nfrom :%d\n\n" % (scope_ref(path).encode(), mark_c))
        POPULATION.append((lease_id, path))
    res = subprocess.run(["git", "fast-import", "--quiet"], cwd=bare, input=b"".join(chunks), capture_output=True)
    if res.returncode != 0:
        raise BenchError(f"git fast-import failed: {res.stderr.decode(errors='replace')[-500:]}")


def check_population(checkers: dict[str, Client], expected: int) -> dict[str, float]:
    """status() must count exactly ``expected`` valid active leases; an acquire overlapping one of them must
    be refused with HeldError (so acquire sees them as real). Returns the times of both (one run each)."""
    file_c, daemon_c = checkers["file"], checkers["daemon"]
    t0 = time.perf_counter()
    snap = file_c.svc.status()
    t_status = (time.perf_counter() - t0) * 1000
    now = time.time()
    active = [v for v in snap.leases if v.valid and v.state(now, file_c.svc.settings.skew) == "active"]
    invalid = [v for v in snap.leases if not v.valid]
    if len(snap.leases) != expected or len(active) != expected or invalid:
        raise BenchError(
            f"status() sees {len(snap.leases)} leases ({len(active)} active, {len(invalid)} invalid); "
            f"expected {expected} active"
        )
    t0 = time.perf_counter()
    try:
        daemon_c.svc.acquire([f"pop/{expected - 1}/inner"])
    except HeldError:
        pass
    else:
        raise BenchError("an acquire overlapping a populated lease was granted")
    t_held = (time.perf_counter() - t0) * 1000
    return {"status_ms": t_status, "held_ms": t_held}


# ------------------------------------------------------------------------------------ the parts


def cli(c: Client, *args: str) -> tuple[float, str]:
    t, res = run_timed(["git", "lease", *args], cwd=c.path)
    return t, res.stdout


def push_new_ref(c: Client, oid: str, ref: str) -> float:
    t, _ = run_timed(["git", "push", "-q", c.url, f"{oid}:{ref}"], cwd=c.path)
    return t


ANATOMY = (  # (trace2 command hierarchy, what it is)
    ("push", "`git push` in all"),
    ("get_refs_list", "of it waiting for and reading the ref advertisement"),
    ("push/pack-objects", "client `pack-objects`"),
    ("push/receive-pack", "server `receive-pack` in all"),
    ("push/receive-pack/unpack-objects", "its `unpack-objects`"),
    ("push/receive-pack/rev-list", "its connectivity check `rev-list --not --all`"),
    ("push/receive-pack/rev-list/for-each-ref", "that check's `for-each-ref` (`--alternate-refs` of the quarantine)"),
)


def push_anatomy(c: Client, oid: str, ref: str, tmp: Path) -> dict[str, float]:
    """One plain push under GIT_TRACE2_PERF (one file per git process): {hierarchy: process ms}, plus the
    push's ``get_refs_list`` region."""
    folder = Path(tempfile.mkdtemp(prefix="trace2-", dir=tmp))
    env = dict(os.environ, GIT_TRACE2_PERF=str(folder))
    subprocess.run(["git", "push", "-q", c.url, f"{oid}:{ref}"], cwd=c.path, env=env, capture_output=True, check=True)
    out: dict[str, float] = {}
    for f in folder.iterdir():
        name, total, refs = None, None, None
        for line in f.read_text(errors="replace").splitlines():
            cols = [x.strip() for x in line.split("|")]
            if len(cols) < 9:
                continue
            event, t_abs, t_rel, msg = cols[3], cols[5], cols[6], cols[8]
            if event == "cmd_name" and "(" in msg:
                name = msg[msg.index("(") + 1 : msg.rindex(")")]
            elif event == "exit" and t_abs:
                total = float(t_abs) * 1000
            elif event == "region_leave" and msg.endswith("label:get_refs_list") and t_rel:
                refs = float(t_rel) * 1000
        if name and total is not None:
            out.setdefault(name, total)
        if refs is not None and name == "push":
            out["get_refs_list"] = refs
    shutil.rmtree(folder, ignore_errors=True)
    return out


def part_ops(clients: dict[str, Client], plan: Plan, log) -> dict:
    """Parts 1-3, interleaved: per round and transport, push; library acquire/renew/release; CLI ditto."""
    samples = {k: collections.defaultdict(list) for k in KINDS}
    traces = {k: collections.defaultdict(list) for k in KINDS}
    total = plan.warmup + plan.runs
    for c in clients.values():
        fresh_commits(c, total, "ops")
    for i in range(total):
        keep = i >= plan.warmup
        for kind in KINDS:
            c = clients[kind]
            s = samples[kind]
            t_push = push_new_ref(c, c.commits[i], f"refs/bench/ops/{kind}/{i}")
            got, t_acq, tr_acq = traced(lambda: c.svc.acquire([f"bench/{kind}/lib{i}"]))
            _, t_ren, tr_ren = traced(lambda: c.svc.renew(got.lease_id))
            _, t_rel, tr_rel = traced(lambda: c.svc.release(got.lease_id))
            t_cacq, out = cli(c, "acquire", "--scope", f"bench/{kind}/cli{i}")
            m = re.search(r"lease acquired: (\S+)", out)
            if not m:
                raise BenchError(f"git lease acquire printed no lease id: {out!r}")
            t_cren, _ = cli(c, "renew", m.group(1))
            t_crel, _ = cli(c, "release", m.group(1))
            if keep:
                for name, t in (
                    ("push", t_push),
                    ("acquire", t_acq),
                    ("renew", t_ren),
                    ("release", t_rel),
                    ("cli_acquire", t_cacq),
                    ("cli_renew", t_cren),
                    ("cli_release", t_crel),
                ):
                    s[name].append(t)
                traces[kind]["acquire"].append((t_acq, tr_acq))
                traces[kind]["renew"].append((t_ren, tr_ren))
                traces[kind]["release"].append((t_rel, tr_rel))
        if (i + 1) % 10 == 0 or i + 1 == total:
            log(f"  round {i + 1}/{total}")
    # service construction as the CLI does it (Repo.discover: 2 git calls; settings; LeaseService)
    for kind in KINDS:
        for _ in range(plan.runs):
            _, t, _tr = traced(clients[kind].service)
            samples[kind]["construct"].append(t)
    return {"samples": samples, "traces": traces}


def part_scale(
    bare: Path, clients: dict[str, Client], checkers: dict[str, Client], plan: Plan, log, tmp: Path
) -> list[dict]:
    rows = []
    for n, packed in plan.sizes:
        clear_scratch_refs(bare)
        t0 = time.perf_counter()
        have = len(POPULATION)
        if n >= have:
            populate(bare, have, n - have)
        else:
            shrink(bare, n)
        t_pop = (time.perf_counter() - t0) * 1000
        if packed:
            git("pack-refs", "--all", cwd=bare)
        refs, loose = count_refs(bare)
        checks = check_population(checkers, n)
        case = f"{n}{'p' if packed else ''}"
        log(
            f"  {n} leases ({'packed' if packed else 'loose'} refs: {refs} refs, {loose} loose): populated in "
            f"{t_pop / 1000:.1f} s, status() {checks['status_ms'] / 1000:.2f} s"
        )
        samples = {k: collections.defaultdict(list) for k in KINDS}
        runs = plan.scale_runs_large if n >= 5000 else plan.scale_runs
        total = 1 + runs
        for c in clients.values():  # (one more commit for the traced push below)
            fresh_commits(c, total + 1, f"scale{case}")
        for i in range(total):
            for kind in KINDS:
                c = clients[kind]
                t_push = push_new_ref(c, c.commits[i], f"refs/bench/scale/{kind}/{i}")
                got, t_acq, _ = traced(lambda: c.svc.acquire([f"scale/{case}/{kind}/{i}"]))
                _, t_rel, _ = traced(lambda: c.svc.release(got.lease_id))
                if i >= 1:
                    samples[kind]["push"].append(t_push)
                    samples[kind]["acquire"].append(t_acq)
                    samples[kind]["release"].append(t_rel)
        anatomy = push_anatomy(clients["file"], clients["file"].commits[total], "refs/bench/scale/traced", tmp)
        rows.append(
            {
                "leases": n,
                "packed": packed,
                "refs": refs,
                "loose": loose,
                "populate_ms": t_pop,
                "runs": runs,
                **checks,
                "samples": samples,
                "anatomy": anatomy,
            }
        )
    clear_scratch_refs(bare)
    return rows


_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def importtime(code: str) -> tuple[list[tuple[str, float, float, int]], int]:
    """One ``python -X importtime -c CODE``: ([(module, self ms, cumulative ms, depth), ...], index of the
    first line after ``site`` (what CODE imported, as against the interpreter's own start-up))."""
    res = subprocess.run([str(VENV_BIN / "python"), "-X", "importtime", "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        raise BenchError(f"python -X importtime -c {code!r} failed: {res.stderr[-300:]}")
    mods = []
    for line in res.stderr.splitlines():
        m = _IMPORT_LINE.match(line)
        if m:
            mods.append((m.group(4), int(m.group(1)) / 1000, int(m.group(2)) / 1000, len(m.group(3)) // 2))
    after_site = next((j + 1 for j, (name, _, _, depth) in enumerate(mods) if name == "site" and depth == 0), 0)
    return mods, after_site


def part_startup(workdir: Path, noop: Path, plan: Plan, log) -> dict:
    def pyc(code: str) -> list[str]:
        return [str(VENV_BIN / "python"), "-c", code]

    procs = {
        "git --version": ["git", "--version"],
        "git benchnoop (git starting an external no-op command)": ["git", "benchnoop"],
        "git-benchnoop (the no-op run directly)": [str(noop)],
        "python -c pass": pyc("pass"),
        'python -c "import argparse"': pyc("import argparse"),
        'python -c "import typer" (what the fast path of the core commands does not import)': pyc("import typer"),
        'python -c "import gitlease.cli.core"': pyc("import gitlease.cli.core"),
        'python -c "import gitlease.cli.core; os._exit(0)"': pyc("import gitlease.cli.core, os; os._exit(0)"),
        'python -c "import gitlease.cli.core, gitlease.service.leases"': pyc(
            "import gitlease.cli.core, gitlease.service.leases"
        ),
        'python -c "import gitlease.cli.core, gitlease.service.leases; os._exit(0)"': pyc(
            "import gitlease.cli.core, gitlease.service.leases, os; os._exit(0)"
        ),
        "git-lease -h (the script directly)": [str(VENV_BIN / "git-lease"), "-h"],
        "git lease -h (through git)": ["git", "lease", "-h"],
    }
    samples = collections.defaultdict(list)
    for _ in range(2):  # warm the page cache
        for argv in procs.values():
            run_timed(argv, cwd=workdir)
    for _ in range(plan.startup_runs):
        for name, argv in procs.items():
            samples[name].append(run_timed(argv, cwd=workdir)[0])
    runs = []
    for _ in range(plan.importtime_runs):
        mods, cut = importtime("import gitlease.cli.core")
        pmods, pcut = importtime("pass")
        runs.append(
            {
                "total": sum(m[1] for m in mods),  # every import of the process, start-up included
                "cli": sum(m[1] for m in mods[cut:]),  # what `import gitlease.cli.core` added
                "startup": sum(m[1] for m in pmods[:pcut]),  # python -c pass: site and what it imports
                "editable": sum(m[2] for m in pmods[:pcut] if m[0].startswith("__editable__") and m[3] == 1),
                "heavy": sorted(((m[0], m[2]) for m in mods[cut:] if m[3] <= 1), key=lambda kv: -kv[1])[:6],
            }
        )
    runs.sort(key=lambda r: r["cli"])
    log("  start-up measured")
    return {"samples": samples, "imports": runs, "import_mid": runs[len(runs) // 2]}


# ------------------------------------------------------------------------------------- report


def trace_summary(entries: list[tuple[float, list[tuple[str, float]]]]) -> tuple[list[str], float, float, str]:
    """The git calls of one operation: (["`git push` 24.1", ...] by call position, median python ms,
    median total ms, a note when not every run made the same calls)."""
    shapes = collections.Counter(tuple(n for n, _ in tr) for _, tr in entries)
    shape = shapes.most_common(1)[0][0]
    same = [(t, tr) for t, tr in entries if tuple(n for n, _ in tr) == shape]
    parts = [f"`git {name}` {ms(median([tr[j][1] for _, tr in same]))}" for j, name in enumerate(shape)]
    py = median([t - sum(x for _, x in tr) for t, tr in same])
    note = "" if len(same) == len(entries) else f" ({len(same)}/{len(entries)} runs had this call sequence)"
    return parts, py, median([t for t, _ in entries]), note


def build_report(
    info: dict, plan: Plan, quick: bool, ops: dict, scale: list[dict], start: dict, elapsed: float
) -> tuple[str, str]:
    S = ops["samples"]
    L: list[str] = []
    verdicts: list[str] = []
    w = L.append

    push = {k: median(S[k]["push"]) for k in KINDS}

    # ---- 1 + 2: library
    w("## 1-2. Plain `git push` against the library calls (in-process)")
    w("")
    w(
        f"Median and p90 in ms over {plan.runs} runs each (after {plan.warmup} warm-up round{'s' if plan.warmup != 1 else ''}); "
        "the ratio is the median against the median plain push of the same transport in this run."
    )
    w("")
    w("| operation | file:// median | p90 | x push | git:// median | p90 | x push |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    names = [
        ("push", "plain `git push URL OID:refs/bench/new` (baseline)"),
        ("acquire", "`LeaseService.acquire([scope])`"),
        ("renew", "`LeaseService.renew(id)`"),
        ("release", "`LeaseService.release(id)`"),
    ]
    for key, label in names:
        cells = []
        for k in KINDS:
            xs = S[k][key]
            cells += [ms(median(xs)), ms(p90(xs)), ratio(median(xs) / push[k])]
        w(f"| {label} | " + " | ".join(cells) + " |")
    w("")
    w(
        "Where a library call's time goes (medians; every git subprocess it starts, timed around "
        '`gitlease.core.gitcmd.run`; "python" is the rest of the call):'
    )
    w("")
    w("| call | transport | git subprocesses | python | total |")
    w("| --- | --- | --- | ---: | ---: |")
    for op in ("acquire", "renew", "release"):
        for k in KINDS:
            parts, py, tot, note = trace_summary(ops["traces"][k][op])
            w(f"| {op} | {SHORT[k]} | {' + '.join(parts)}{note} | {ms(py)} | {ms(tot)} |")
    w("")
    acq = {k: median(S[k]["acquire"]) / push[k] for k in KINDS}
    paired = {k: median([a / p for a, p in zip(S[k]["acquire"], S[k]["push"])]) for k in KINDS}
    ok = all(r <= TARGET_ACQUIRE_RATIO for r in acq.values())
    verdicts.append(
        f"- Library acquire within {TARGET_ACQUIRE_RATIO}x of one plain push: "
        f"**{'met' if ok else 'not met'}** (median against median: file:// {ratio(acq['file'])}, "
        f"git:// {ratio(acq['daemon'])}; median of the per-round ratios, each acquire against the push "
        f"just before it: file:// {ratio(paired['file'])}, git:// {ratio(paired['daemon'])})."
    )

    # ---- 3: CLI
    w("## 3. The whole `git lease` process")
    w("")
    w(
        f'Median and p90 in ms over {plan.runs} runs; "over push" is the median minus the median plain push of '
        "the same transport (same rounds)."
    )
    w("")
    w("| command | file:// median | p90 | over push | git:// median | p90 | over push |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    over = {}
    for key, label in (
        ("cli_acquire", "`git lease acquire --scope X`"),
        ("cli_renew", "`git lease renew ID`"),
        ("cli_release", "`git lease release ID`"),
    ):
        cells = []
        for k in KINDS:
            xs = S[k][key]
            over[(key, k)] = median(xs) - push[k]
            cells += [ms(median(xs)), ms(p90(xs)), f"+{ms(over[(key, k)])}"]
        w(f"| {label} | " + " | ".join(cells) + " |")
    w("")
    st = start["samples"]
    t_git = median(st["git --version"])
    t_py = median(st["python -c pass"])
    # imports measured in processes that skip the interpreter's shutdown (os._exit), shutdown on its own
    t_cli_x = median(st['python -c "import gitlease.cli.core; os._exit(0)"'])
    t_svc_x = median(st['python -c "import gitlease.cli.core, gitlease.service.leases; os._exit(0)"'])
    t_imp = t_cli_x - t_py
    t_lazy = t_svc_x - t_cli_x
    t_down = median(st['python -c "import gitlease.cli.core, gitlease.service.leases"']) - t_svc_x
    t_dispatch = median(st["git benchnoop (git starting an external no-op command)"]) - median(
        st["git-benchnoop (the no-op run directly)"]
    )
    w(
        "Approximate split of one `git lease acquire` (medians of pieces measured separately in this run, "
        "so the parts need not add up exactly):"
    )
    w("")
    w("| piece | file:// | git:// |")
    w("| --- | ---: | ---: |")
    rows = []
    for k in KINDS:
        construct = median(S[k]["construct"])
        lib = median(S[k]["acquire"])
        total = median(S[k]["cli_acquire"])
        rest = total - (t_dispatch + t_py + t_imp + t_lazy + construct + lib)
        rows.append((t_dispatch, t_py, t_imp, t_lazy, t_down, construct, lib, rest, total))
    labels = [
        "`git` finding and starting `git-lease` (`git benchnoop` minus running `git-benchnoop` directly)",
        "python interpreter start (`python -c pass`)",
        "`import gitlease.cli.core`: the dispatcher loading the core commands' module (no typer or click: "
        "a well-formed core command line is parsed by `gitlease/cli/fast.py`; process time over "
        "`python -c pass`, both without interpreter shutdown)",
        "imports of the service modules, made lazily in the command (`gitlease.service.leases` and what it imports)",
        "interpreter shutdown after those imports (tearing the modules down; `git-lease` skips it with "
        "`os._exit` after flushing, so this is not in the total)",
        "`Repo.discover` + settings + `LeaseService()` in-process (git `rev-parse`, git `config`)",
        "`LeaseService.acquire` in-process (the push)",
        "the rest (parsing, rendering, exit)",
        "**total `git lease acquire`** (measured)",
    ]
    for j, label in enumerate(labels):
        w(f"| {label} | {ms(rows[0][j])} | {ms(rows[1][j])} |")
    w("")
    worst = max(over.items(), key=lambda kv: kv[1])
    ok = worst[1] < TARGET_CLI_OVERHEAD_MS
    detail = ", ".join(f"{key.split('_')[1]} {SHORT[k]} +{ms(v)}" for (key, k), v in over.items())
    verdicts.append(
        f"- Whole CLI process under {TARGET_CLI_OVERHEAD_MS:.0f} ms over one plain push: "
        f"**{'met' if ok else 'not met'}** (worst: {worst[0][0].split('_')[1]} on {SHORT[worst[0][1]]} "
        f"+{ms(worst[1])} ms; all: {detail} ms)."
    )

    # ---- 4: scale
    w("## 4. Acquire with many active leases on the remote")
    w("")
    w(
        f"Median in ms over {plan.scale_runs} runs per case ({plan.scale_runs_large} in the 10,000-lease cases), "
        "after one warm-up round. The leases are valid gitlease leases (one path each, so 2 refs each: "
        "`refs/leases/id/<id>` and `refs/leases/scope/pop/<n>`) written into the bare repository with one "
        "`git fast-import` (their objects in one pack, the refs loose); the packed cases ran "
        "`git pack-refs --all` on the bare repository, and the last case deleted leases back down to 1,000 there. "
        "Before each case `status()` counted them (all valid and active, nothing else), and an `acquire` "
        "overlapping one of them was refused with `HeldError` over git://; both are single runs from separate "
        "client repositories, timed in the last two columns (the first of them fetches every lease object). "
        "Each timed acquire takes a fresh disjoint scope from a client that never fetched the leases, and is "
        "released again (timed too), so the count stays fixed."
    )
    w("")
    w(
        "| active leases | refs on remote | transport | plain push | acquire | x push | release | "
        "acquire x (10 leases) | `status()` (file://) | refused acquire (git://) |"
    )
    w("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base10 = {k: median(scale[0]["samples"][k]["acquire"]) for k in KINDS} if scale else {}
    for row in scale:
        for k in KINDS:
            s = row["samples"][k]
            a, p = median(s["acquire"]), median(s["push"])
            storage = "packed" if row["packed"] else f"{row['loose']:,} loose"
            refs = f"{row['refs']:,} ({storage})"
            w(
                f"| {row['leases']:,} | {refs} | {SHORT[k]} | {ms(p)} | {ms(a)} | {ratio(a / p)} | "
                f"{ms(median(s['release']))} | {ratio(a / base10[k])} | "
                f"{ms(row['status_ms']) if k == 'file' else ''} | {ms(row['held_ms']) if k == 'file' else ''} |"
            )
    w("")
    w(
        "Where a push's time goes as the refs grow: one plain push over file:// per case, traced with "
        "`GIT_TRACE2_PERF` (one trace per git process; process wall times in ms, one run, so noisier than the "
        "medians above). Every push receives the server's full ref advertisement, and `receive-pack` then checks "
        "connectivity with `rev-list --not --all`, which reads every ref again, and (because the pushed objects "
        "sit in a quarantine whose alternate is the repository) once more through `for-each-ref`. An acquire is "
        "one such push, so it pays the same."
    )
    w("")
    w(
        "| git process (ms) | "
        + " | ".join(
            f"{row['leases']:,} leases, {row['refs']:,} {'packed' if row['packed'] else 'loose'} refs" for row in scale
        )
        + " |"
    )
    w("| --- | " + " | ".join("---:" for _ in scale) + " |")
    for key, label in ANATOMY:
        w(
            f"| {label} | "
            + " | ".join(ms(row["anatomy"][key]) if key in row["anatomy"] else "-" for row in scale)
            + " |"
        )
    w("")

    def scale_ratio(n, packed):
        found = [row for row in scale if row["leases"] == n and row["packed"] == packed]
        if not found:
            return None
        return {k: median(found[0]["samples"][k]["acquire"]) / base10[k] for k in KINDS}

    def push_scale_ratio(n, packed):
        found = [row for row in scale if row["leases"] == n and row["packed"] == packed]
        base = [row for row in scale if row["leases"] == 10]
        if not found or not base:
            return None
        return {k: median(found[0]["samples"][k]["push"]) / median(base[0]["samples"][k]["push"]) for k in KINDS}

    rat = scale_ratio(1000, False)
    if rat:
        ok = all(r <= TARGET_SCALE_RATIO for r in rat.values())
        packed = scale_ratio(1000, True)
        extra = (
            f"; with the remote's refs packed: file:// {ratio(packed['file'])}, git:// {ratio(packed['daemon'])}"
            if packed
            else ""
        )
        floor = push_scale_ratio(1000, False)
        floor_p = push_scale_ratio(1000, True)
        floor_txt = (
            f" The floor is git's own: the plain push of one new ref, in the same run, slows by file:// "
            f"{ratio(floor['file'])}, git:// {ratio(floor['daemon'])} (packed: file:// "
            f"{ratio(floor_p['file'])}, git:// {ratio(floor_p['daemon'])}) from 10 to 1,000 leases, "
            "because `receive-pack` advertises and then reads every ref for its connectivity check "
            "(the trace below); no client can push below it."
            if floor and floor_p
            else ""
        )
        verdicts.append(
            f"- Acquire with 1,000 active leases (loose refs) within {TARGET_SCALE_RATIO}x of acquire "
            f"with 10: **{'met' if ok else 'not met'}** (file:// {ratio(rat['file'])}, "
            f"git:// {ratio(rat['daemon'])}{extra}).{floor_txt}"
        )

    # ---- 5: start-up
    w("## 5. CLI start-up")
    w("")
    w(
        f"Process wall time in ms, median and p90 over {plan.startup_runs} runs each (run from the client "
        "repository, after two warm-up runs)."
    )
    w("")
    w("| process | median | p90 | x `git --version` |")
    w("| --- | ---: | ---: | ---: |")
    for name, xs in st.items():
        shown = name.replace(" (", "` (", 1) if " (" in name else name + "`"
        w(f"| `{shown} | {ms(median(xs))} | {ms(p90(xs))} | {ratio(median(xs) / t_git)} |")
    w("")
    imp = start["import_mid"]
    w(
        f'`python -X importtime -c "import gitlease.cli.core"` (the median of {plan.importtime_runs} runs by the '
        f"figure in bold; importtime's own bookkeeping inflates every figure a little): "
        f"**{ms(imp['cli'])} ms of imports for `import gitlease.cli.core`**, on top of {ms(imp['startup'])} ms that the "
        f"interpreter's own start-up imports (`site` and the venv's `.pth` files; of it {ms(imp['editable'])} ms is "
        f"an editable-install finder, none in a regular install). "
        "Heaviest imports under `import gitlease.cli.core` (cumulative ms): "
        + ", ".join(f"`{n}` {ms(t)}" for n, t in imp["heavy"])
        + "."
    )
    w("")

    body = "\n".join(L)
    head = [
        "# Performance",
        "",
        "Lease operations measured against plain git, side by side on a `file://` bare remote and on a real "
        "`git daemon` (`git://` on 127.0.0.1), in one run of `bench/run.py`. Every figure below comes from the "
        "run described here; nothing is typed in by hand. Re-run to refresh.",
        "",
        f"- Run: {info['date']}{', **quick run** (`--quick`: fewer runs, no 10,000-lease case)' if quick else ''}; "
        f"took {elapsed:.0f} s; 1-minute load average {info['load_start']} at the start, {info['load_end']} at "
        "the end (other work on the machine shows up as noise, mostly in the p90 columns).",
        f"- Machine: {info['nproc']} CPUs (`nproc`), {info['cpu']}; {info['os']}.",
        f"- {info['git']}; {info['python']} (`{sys.executable}`); the CLI measured is "
        f"{'the development venv (`--editable`)' if info['editable'] else 'a regular `pip install` of the tree into a fresh venv'}.",
        f"- Code measured: {info['code']}.",
        "",
        "Reproduce: `make bench` (runs `.venv/bin/python bench/run.py --write docs/performance.md`); "
        "`.venv/bin/python bench/run.py --quick` is a smoke check of well under a minute.",
        "",
        "Method: one bare repository, served both as `file://` and by `git daemon --export-all "
        "--enable=receive-pack` (testing/servers.py's, as the tests run it) on a free loopback port, with `receive.autogc=false` (no background gc, which "
        "would also pack refs, during a measurement). Each transport has its own client repository with "
        "`lease.remote` set to its URL; HOME and the global git config are temporary, the system config is off. "
        "Parts 1-3 are interleaved round by round (push, library acquire/renew/release, CLI acquire/renew/release; "
        "file:// then git://) so that load drift hits every column alike. The baseline pushes a fresh, unique, "
        "parentless commit (blob, tree, commit: the same shape as a lease version) to a new ref, as a subprocess. "
        "Python's bytecode caches for the measured processes live in a temporary `PYTHONPYCACHEPREFIX`, "
        "written during the warm-up runs.",
        "",
        "## Targets",
        "",
        *verdicts,
        "",
    ]
    return "\n".join(head) + "\n" + body + "\n", body


# --------------------------------------------------------------------------------------- main

MARKED = re.compile(r"<!-- ([\w.-]+):begin -->.*?<!-- \1:end -->\n?", re.S)


def keep_marked_sections(doc: str, path: Path) -> str:
    """Sections other benchmarks own (``<!-- name:begin -->`` ... ``<!-- name:end -->``) survive a rewrite."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    kept = [m.group(0).rstrip("\n") for m in MARKED.finditer(old) if f"<!-- {m.group(1)}:begin -->" not in doc]
    return doc.rstrip("\n") + "".join("\n\n" + k for k in kept) + "\n" if kept else doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs, no 10,000-lease case")
    ap.add_argument("--write", metavar="FILE", help="write the report (markdown) to FILE")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument(
        "--editable",
        action="store_true",
        help="measure the CLI of the development venv (pip install -e) instead of a regular install",
    )
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gitlease-bench-"))
    daemon: GitDaemon | None = None

    def cleanup():
        if daemon:
            daemon.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    try:
        isolate(tmp, args.editable)
        info = machine()
        info["editable"] = args.editable
        base = tmp / "srv"
        base.mkdir()
        bare = base / "leases.git"
        git("init", "--bare", "-q", str(bare))
        git("config", "receive.autogc", "false", cwd=bare)
        git("config", "gc.auto", "0", cwd=bare)
        daemon = GitDaemon(base, log_path=tmp / "daemon.log", verbose=False)
        try:
            daemon.start()
        except (RuntimeError, TimeoutError) as exc:
            raise BenchError(f"git daemon did not start: {exc}") from None
        urls = {"file": bare.as_uri(), "daemon": daemon.url_for("leases.git")}
        log(f"bench in {tmp}; git daemon on port {daemon.port}; {'quick' if args.quick else 'full'} run")
        clients = {k: make_client(tmp / f"client-{k}", k, urls[k]) for k in KINDS}
        checkers = {k: make_client(tmp / f"checker-{k}", k, urls[k]) for k in KINDS}

        log("parts 1-3: plain push, library calls, CLI processes")
        ops = part_ops(clients, plan, log)
        clear_scratch_refs(bare)
        if count_refs(bare)[0] != 0:
            raise BenchError("leases left on the remote after parts 1-3")
        log("part 4: acquire with many active leases")
        scale = part_scale(bare, clients, checkers, plan, log, tmp)
        log("part 5: start-up")
        start = part_startup(clients["file"].path, tmp / "bin" / "git-benchnoop", plan, log)
        log("part 6: signing")
        import signing  # bench/signing.py: sign + verify per operation, start-up cost of a key

        signing_section = signing.run(tmp, args.quick, log)
        elapsed = time.monotonic() - started
        info["load_end"] = "%.2f" % os.getloadavg()[0]
        doc, body = build_report(info, plan, args.quick, ops, scale, start, elapsed)
        doc += "\n" + signing_section
    except BenchError as exc:
        log(f"bench failed: {exc}")
        return 1
    finally:
        if daemon:
            daemon.stop()
            daemon = None

    print(doc)
    if args.write:
        Path(args.write).write_text(keep_marked_sections(doc, Path(args.write)), encoding="utf-8")
        log(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
