"""The soak: N workers against file://, git daemon and smart HTTP remotes, a fault injector, then the checker.

    python -m soak.run [--duration 60] [--workers 16] [--kinds file,daemon,http] [--ttl 4] [--skew 2]
                       [--mode safe|force|unfenced|outside|untrusted] [--unsigned] [--no-faults] [--seed N] [--json]
                       [--until acquired=3,renewed=1,faults=6 [--max-duration S]] [--write docs/reliability.md]

``--until``: the run goes on past ``--duration`` until the workers of every remote kind have done at least that
many of each operation (``faults``: injected faults in all), or ``--max-duration`` (default ten times the
duration) has passed; the report says whether they were reached (``until``). What a short run must have
exercised is then a condition it waits for, not a count that depends on how fast the machine is.

Signed by default: every worker gets its own Ed25519 key (``ssh-keygen``), the sweepers an admin key, and a
trust file listing them all (``.gitlease/allowed_signers``) is committed to each remote's default branch before
the run; the checker verifies every lease version against it. ``--unsigned``: no keys, no trust file.

Exit 0 when the checker found no anomaly (with a negative control, ``--mode force|unfenced|outside|untrusted``,
exit 0 when it did).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testing.servers import GitDaemon, SmartHTTPServer, make_bare  # noqa: E402

from . import checker, serverlog  # noqa: E402


def _traces() -> Path:
    """``../shared/traces`` of the checkout (for a worktree under /work/wt/<name>, the one two levels up)."""
    if os.environ.get("GITLEASE_TRACES"):
        return Path(os.environ["GITLEASE_TRACES"])
    for up in (ROOT.parent, ROOT.parent.parent):
        if (up / "shared" / "traces").is_dir():
            return up / "shared" / "traces"
    return ROOT.parent / "shared" / "traces"


TRACES = _traces()

HANG_HOOK = """#!/bin/sh
# soak fault: hold the push while soak-hang exists (at most 4 s), like a server that stalls mid-receive
n=0
while [ -e soak-hang ] && [ $n -lt 40 ]; do sleep 0.1; n=$((n + 1)); done
cat >/dev/null
exit 0
"""


WORKER_MODE = {"untrusted": "safe"}  # the harness's mode -> its workers' (the untrusted control is in the trust file)


def task_paths(limit: int = 2000) -> list[list[str]]:
    tasks = []
    for f in sorted(TRACES.glob("*.jsonl")):
        for line in f.read_text().splitlines()[:limit]:
            paths = json.loads(line).get("paths") or []
            if paths:
                tasks.append(paths)
    if not tasks:
        tasks = [[f"pkg{i}/mod{j}.py" for j in range(3)] for i in range(20)]
    return tasks


def git(*args, cwd=None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


class Soak:
    def __init__(self, args) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="gitlease-soak-"))
        self.state = self.tmp / "state"
        self.state.mkdir()
        self.rng = random.Random(args.seed)
        self.servers: dict[str, object] = {}
        self.bares: dict[str, Path] = {}
        self.urls: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts = collections.Counter()
        self.crashes: list[str] = []
        self.swept: dict[str, list[str]] = {}
        self.keys: dict[str, Path] = {}  # agent name -> private key file (signed mode)
        self._kinds: dict[str, str] = {}  # worker name -> the remote kind it works on
        self.reached = not args.until  # --until's operations done (none asked: nothing to wait for)
        self.trust_text = ""
        self.task_source = ""

    def make_keys(self) -> None:
        """One Ed25519 key per worker, one admin key for the sweepers, and the trust file naming them."""
        folder = self.tmp / "keys"
        folder.mkdir()
        lines = []
        for name in [f"w{i}" for i in range(self.args.workers)] + ["soak-admin"]:
            path = folder / name
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)],
                check=True,
                capture_output=True,
            )
            self.keys[name] = path
            pub = " ".join(path.with_suffix(".pub").read_text().split()[:2])
            if self.args.mode == "untrusted":  # the control: the trust file lists other keys than the workers'
                other = folder / f"{name}.untrusted"
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(other)],
                    check=True,
                    capture_output=True,
                )
                pub = " ".join(Path(f"{other}.pub").read_text().split()[:2])
            if name == "soak-admin":
                sweepers = ",".join(["sweeper"] + [f"sweeper-{k}" for k in self.args.kinds])
                lines.append(f'{sweepers} namespaces="gitlease,gitlease-admin" {pub}')
            else:
                lines.append(f'{name} namespaces="gitlease" {pub}')
        self.trust_text = "".join(line + "\n" for line in lines)

    def key_for(self, name: str) -> Path | None:
        if not self.keys:
            return None
        return self.keys["soak-admin"] if name.startswith("sweeper") else self.keys[name]

    # ------------------------------------------------------------------ set-up
    def remote(self, kind: str) -> None:
        base = self.tmp / f"srv-{kind}"
        base.mkdir()
        if kind == "file":
            bare = make_bare(base / "store.git")
            url = bare.as_uri()
        else:
            server = (GitDaemon if kind == "daemon" else SmartHTTPServer)(base)
            server.start()
            self.servers[kind] = server
            bare = server.make_bare("store.git")
            url = server.url_for("store.git")
        git("config", "receive.autogc", "false", cwd=bare)
        git("config", "gc.auto", "0", cwd=bare)
        if self.trust_text:  # before the transaction log exists: the checker sees only the run's updates
            commit_trust(bare, self.trust_text)
        serverlog.install(bare)
        hook = bare / "hooks" / "pre-receive"
        hook.write_text(HANG_HOOK)
        hook.chmod(0o755)
        self.bares[kind], self.urls[kind] = bare, url
        self._server_pid(kind)

    def _server_pid(self, kind: str) -> None:
        server = self.servers.get(kind)
        if server is not None and server.pid:
            (self.state / f"server-{kind}.pid").write_text(str(os.getpgid(server.pid)))

    def spawn(self, name: str, kind: str, offset: float, mode: str | None = None) -> None:
        repo = self.tmp / "repos" / name
        if not repo.exists():
            repo.mkdir(parents=True)
            git("init", "-q", str(repo))
        argv = [
            sys.executable,
            "-m",
            "soak.worker",
            "--dir",
            str(self.state),
            "--repo",
            str(repo),
            "--url",
            self.urls[kind],
            "--name",
            name,
            "--seed",
            str(self.rng.randrange(1 << 30)),
            "--ttl",
            str(self.args.ttl),
            "--skew",
            str(self.args.skew),
            "--offset",
            f"{offset:.3f}",
            "--timeout",
            str(self.args.timeout),
            "--mode",
            mode or WORKER_MODE.get(self.args.mode, self.args.mode),
            "--paths",
            str(self.tmp / "paths.json"),
        ]
        key = self.key_for(name)
        if key is not None:
            argv += ["--key", str(key)]
        if self.args.mode == "untrusted":  # the control writes what gitlease itself refuses to write (exit 5):
            argv += ["--no-writer-check"]  # a client that skips the writer's own trust check, for the checker
        self.procs[name] = subprocess.Popen(
            argv,
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(self.state / f"{name}.stderr", "ab"),
        )

    # --------------------------------------------------------------------- run
    def run(self) -> dict:
        a = self.args
        started = time.monotonic()
        tasks = task_paths()
        self.task_source = (
            f"{len(tasks)} tasks from {', '.join(sorted(f.name for f in TRACES.glob('*.jsonl')))}"
            if TRACES.is_dir() and list(TRACES.glob("*.jsonl"))
            else f"{len(tasks)} synthetic tasks (no traces in {TRACES})"
        )
        (self.tmp / "paths.json").write_text(json.dumps(tasks))
        if a.signed:
            self.make_keys()
        for kind in a.kinds:
            self.remote(kind)
        # some workers run with a wrong clock, within half the skew margin either way
        offsets = {
            f"w{i}": (self.rng.uniform(-a.skew / 2, a.skew / 2) if i % 3 == 2 else 0.0) for i in range(a.workers)
        }
        kinds = self._kinds = {f"w{i}": a.kinds[i % len(a.kinds)] for i in range(a.workers)}
        for name in offsets:
            self.spawn(name, kinds[name], offsets[name])
        if a.mode == "safe":  # one sweeper per remote, on this host (not a fault target: its name is no w*)
            for kind in a.kinds:
                self.spawn(f"sweeper-{kind}", kind, 0.0, mode="sweep")
        inject = None
        if a.faults:
            inject = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "soak.inject",
                    "--dir",
                    str(self.state),
                    "--seed",
                    str(a.seed),
                    "--ttl",
                    str(a.ttl),
                    "--every",
                    str(a.fault_every),
                    "--bares",
                    ",".join(str(b) for b in self.bares.values()),
                ],
                cwd=ROOT,
            )
        deadline = time.monotonic() + a.duration
        hard_deadline = time.monotonic() + (a.max_duration or 10 * a.duration)
        next_lock_scan, next_count = 0.0, 0.0
        while time.monotonic() < deadline or (not self.reached and time.monotonic() < hard_deadline):
            if a.until and time.monotonic() >= next_count:
                self.reached = self.until_reached(kinds)
                next_count = time.monotonic() + 1
            for name, proc in list(self.procs.items()):
                if proc.poll() is not None and name.startswith("sweeper-"):
                    self.crashes.append(f"{name} exited with {proc.returncode}: {_tail(self.state / f'{name}.stderr')}")
                    self.spawn(name, name.split("-", 1)[1], 0.0, mode="sweep")
                elif proc.poll() is not None:
                    if proc.returncode != -signal.SIGKILL:
                        self.crashes.append(
                            f"{name} exited with {proc.returncode}: {_tail(self.state / f'{name}.stderr')}"
                        )
                    self.restarts["worker"] += 1
                    self.spawn(name, kinds[name], offsets[name])
            if "file" in self.bares and time.monotonic() >= next_lock_scan:
                self.restarts["stale ref locks removed (file remote)"] += remove_stale_locks(
                    self.bares["file"], older_than=STALE_LOCK_AGE
                )
                next_lock_scan = time.monotonic() + 2
            for kind, server in self.servers.items():
                if not server.running:
                    self.restarts["stale ref locks removed"] += remove_stale_locks(self.bares[kind])
                    server.restart()
                    self._server_pid(kind)
                    self.restarts["server"] += 1
            time.sleep(0.1)
        (self.state / "stop").write_text("")
        if inject:
            inject.wait(timeout=30)
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if "file" in self.bares:
            self.restarts["stale ref locks removed (file remote)"] += remove_stale_locks(
                self.bares["file"], older_than=STALE_LOCK_AGE
            )
        for kind, server in self.servers.items():  # the workers' last releases need their servers
            if not server.running:
                server.restart()
        stop_by = time.monotonic() + 4 * a.timeout + 5
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, stop_by - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.crashes.append(f"{name} did not stop within {4 * a.timeout + 5} s of being asked")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.returncode not in (0, -signal.SIGKILL):
                self.crashes.append(f"{name} exited with {proc.returncode}: {_tail(self.state / f'{name}.stderr')}")
        if a.mode == "safe":  # (the negative control has failed already; it need not wait for P7)
            # every lease a killed worker left behind expires within ttl; then one sweep clears them
            time.sleep(a.ttl + a.skew + a.tolerance + 1)
            for kind in a.kinds:  # nothing pushes any more: a ref lock still there is stale
                self.restarts["stale ref locks removed (at the end)"] += remove_stale_locks(
                    self.bares[kind], older_than=STALE_LOCK_AGE
                )
            self.swept = {
                kind: sweep(self.tmp, kind, self.urls[kind], a, self.key_for("sweeper"), crashed_refs(self.bares[kind]))
                for kind in a.kinds
            }
        for server in self.servers.values():
            server.stop()
        return self.report(time.monotonic() - started)

    def until_reached(self, kinds: dict[str, str]) -> bool:
        """Whether the workers of every remote kind have done ``--until``'s operations (and faults were injected)."""
        per_kind: dict[str, collections.Counter] = {k: collections.Counter() for k in self.args.kinds}
        for name, kind in kinds.items():
            try:
                per_kind[kind].update(json.loads((self.state / f"{name}.stats").read_text() or "{}"))
            except (OSError, ValueError):
                pass
        try:
            faults = len((self.state / "faults.jsonl").read_text().splitlines())
        except OSError:
            faults = 0
        return all(
            faults >= want if op == "faults" else all(c[op] >= want for c in per_kind.values())
            for op, want in self.args.until.items()
        )

    def report(self, seconds: float) -> dict:
        a = self.args
        intents = checker.read_intents(self.state)
        results = {}
        for kind, bare in self.bares.items():
            final = dict(
                line.split(" ", 1)[::-1]
                for line in git("for-each-ref", "--format=%(objectname) %(refname)", cwd=bare).splitlines()
            )
            txns = serverlog.settle(serverlog.read(bare), final)
            rep = checker.check(
                bare,
                txns,
                tolerance=a.tolerance,
                release_intents=intents,
                final_refs=final if a.mode == "safe" else {},
                signed=a.signed,
                ssh_keygen_sample=a.ssh_keygen_sample,
                seed=a.seed,
            )
            results[kind] = rep.to_json()
            locks = sorted(str(p.relative_to(bare)) for p in bare.rglob("*.lock"))
            if locks:
                rep.anomalies.append(f"stale ref locks on the server at the end: {locks[:3]}")
            if self.swept.get(kind):
                results[kind]["sweep"] = self.swept[kind]["swept"]
                results[kind]["forced"] = self.swept[kind]["forced"]
        ops = collections.Counter()
        for f in self.state.glob("*.stats"):
            ops.update(json.loads(f.read_text() or "{}"))
        faults = collections.Counter()
        fpath = self.state / "faults.jsonl"
        if fpath.exists():
            for line in fpath.read_text().splitlines():
                faults[json.loads(line)["kind"]] += 1
        return {
            "seconds": round(seconds, 1),
            "workers": a.workers,
            "kinds": a.kinds,
            "mode": a.mode,
            "signed": a.signed,
            "tasks": self.task_source,
            "ttl": a.ttl,
            "skew": a.skew,
            "ops": dict(ops),
            "faults": dict(faults),
            "until": {"wanted": a.until, "reached": self.until_reached(self._kinds) if a.until else None},
            "restarts": dict(self.restarts),
            "checks": results,
            "crashes": self.crashes,
            "anomalies": [f"{k}: {x}" for k, r in results.items() for x in r["anomalies"]]
            + [f"worker crash: {c}" for c in self.crashes]
            + (["no lease was acquired: the run tested nothing"] if not ops.get("acquired") else [])
            + (
                ["no fenced push landed: the run tested no fencing"]
                if a.mode == "safe" and not ops.get("fenced-push")
                else []
            ),
        }

    def cleanup(self, keep: bool = False) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for server in self.servers.values():
            server.stop()
        if not keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


STALE_LOCK_AGE = 10.0  # seconds: far longer than any receive-pack of the soak holds a ref lock


def remove_stale_locks(bare: Path, older_than: float | None = None) -> int:
    """What a server's restart script must do (docs/limits.md): a receive-pack killed while it held a ref lock
    leaves ``<ref>.lock`` behind, and git refuses every later update of that ref until it is removed. Safe for
    a server because its whole process group is dead.

    ``older_than`` (the file:// remote, which has no server to restart; its receive-packs are children of the
    clients' pushes, and gitlease kills one that outlives its push's timeout + PUSH_GRACE): only locks that old,
    and only while no receive-pack of this repository runs."""
    if older_than is not None and receive_pack_running(bare):
        return 0
    n = 0
    now = time.time()
    for lock in _lock_files(bare / "refs") + [bare / "packed-refs.lock"]:
        try:
            if older_than is not None and now - lock.stat().st_mtime < older_than:
                continue
            lock.unlink()
            n += 1
        except FileNotFoundError:
            pass
    return n


def _lock_files(refs: Path) -> list[Path]:
    """Every ``*.lock`` file below ``refs``. ``os.walk`` skips a folder git deletes while it is listed (the last
    ref of a folder removed by a push going on meanwhile); ``Path.rglob`` raised FileNotFoundError there, which
    failed a soak under load."""
    return [Path(top, name) for top, _dirs, files in os.walk(refs) for name in files if name.endswith(".lock")]


def receive_pack_running(bare: Path) -> bool:
    where = str(bare).encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:
            continue
        if b"receive-pack" in text and where in text:
            return True
    return False


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def commit_trust(bare: Path, text: str) -> str:
    """Commit ``.gitlease/allowed_signers`` to the bare repository's default branch (the branch its HEAD
    names), with plumbing, as a reviewed merge to that branch would leave it."""

    def g(*argv, input=None):
        return subprocess.run(
            ["git", *argv], cwd=bare, input=input, capture_output=True, text=True, check=True
        ).stdout.strip()

    blob = g("hash-object", "-w", "--stdin", input=text)
    inner = g("mktree", input=f"100644 blob {blob}\tallowed_signers\n")
    tree = g("mktree", input=f"040000 tree {inner}\t.gitlease\n")
    env = {
        "GIT_AUTHOR_NAME": "soak",
        "GIT_AUTHOR_EMAIL": "soak@example",
        "GIT_COMMITTER_NAME": "soak",
        "GIT_COMMITTER_EMAIL": "soak@example",
    }
    commit = subprocess.run(
        ["git", "commit-tree", tree, "-m", "soak: trust the workers' keys"],
        cwd=bare,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    ).stdout.strip()
    g("update-ref", g("symbolic-ref", "HEAD"), commit)
    return commit


def crashed_refs(bare: Path) -> set[str]:
    """Refs of every transaction a server death cut in the middle (see serverlog.settle)."""
    final = dict(
        line.split(" ", 1)[::-1]
        for line in git("for-each-ref", "--format=%(objectname) %(refname)", cwd=bare).splitlines()
    )
    return {ref for t in serverlog.settle(serverlog.read(bare), final) if t.partial for _, _, ref in t.prepared}


def sweep(tmp: Path, kind: str, url: str, a, key: Path | None = None, crashed: set[str] = frozenset()) -> dict:
    """One `git lease sweep-stale` of the store: every stale lease reclaimed, each with its audit entry.

    Then what a sweep leaves by design: a lease a server death left half granted or half deleted is INVALID
    (its refs do not appear together), and gitlease never reclaims an invalid lease by a rule (fail closed;
    docs/sweeping.md): an admin clears it (`sweep-stale --force`, audited). The harness does that for each
    invalid lease left whose refs all belong to a half-landed transaction, and only for those (the checker
    flags a forced release of any other lease); anything else left is an anomaly (P7)."""
    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo
    from gitlease.identity.signer import UNSIGNED, load_signer
    from gitlease.service.leases import LeaseService

    repo = tmp / "repos" / f"sweeper-{kind}"
    repo.mkdir(parents=True, exist_ok=True)
    git("init", "-q", str(repo))
    r = Repo.discover(str(repo))
    svc = LeaseService(
        r,
        resolve(r.config, env={}, remote=url, agent="sweeper", skew=a.skew, timeout=30),
        signer=load_signer(str(key)) if key else UNSIGNED,
    )
    from gitlease.ops.sweep import Sweeper

    sweeper = Sweeper(svc)
    lines = [r.line() for r in sweeper.sweep().results]
    forced = []
    for view in svc.snapshot(use_cache=False).leases:
        if not view.valid and view.refs() and set(view.refs()) <= crashed:
            forced.append(sweeper.force(view.lease_id).line() + f" ({'; '.join(view.problems)[:80]})")
    return {"swept": lines, "forced": forced}


CONTROLS = {  # negative control -> what it breaks (each must make the checker fail)
    "force": "takes leases with `+` refspecs (git's compare-and-swap switched off)",
    "unfenced": "takes leases properly, but moves its branch with a plain `git push` (the lease not in the push)",
    "outside": "pushes fenced commits that also touch a file outside the lease's scope",
    "untrusted": "signs with keys the trust file on the default branch does not list for those workers",
}


def run_controls(seed: int) -> dict:
    """Each negative control once (4 workers, 4 s, file remote, no faults): the checker must fail each."""
    out = {}
    for mode in CONTROLS:
        res = run_once(
            parse(
                [
                    "--duration",
                    "4",
                    "--workers",
                    "4",
                    "--kinds",
                    "file",
                    "--no-faults",
                    "--mode",
                    mode,
                    "--seed",
                    str(seed),
                ]
            )
        )
        out[mode] = {
            "seconds": res["seconds"],
            "anomalies": len(res["anomalies"]),
            "first": res["anomalies"][0] if res["anomalies"] else "(none)",
        }
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def write_doc(res: dict, path: Path, argv: list[str]) -> None:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    checks = res["checks"]
    total = lambda key: sum(r.get(key, 0) for r in checks.values())  # noqa: E731
    ops_total = sum(v for k, v in res["ops"].items() if k != "branch-refetched")
    faults_by = ", ".join(f"{k} {v}" for k, v in sorted(res["faults"].items())) or "none"
    rows = [f"| {k} | {v} |" for k, v in sorted(res["ops"].items())]
    frows = [f"| {k} | {v} |" for k, v in sorted(res["faults"].items())] or ["| (none) | 0 |"]
    crows = [
        f"| {k} | {r['transactions']} | {r['leases']} | {r['renewals']} | {r['releases']} | {r['reclaims']} | "
        f"{r['fenced_updates']} of {r['branch_updates']} | {r['signatures']} | {r['ssh_keygen_verified']} | "
        f"{r['half_landed']} ({r['half_grants']}, {r['remnants_cleared']}) | {len(r['anomalies'])} |"
        for k, r in checks.items()
    ]
    forced_n = sum(len(r.get("forced", [])) for r in checks.values())
    ctl = res.get("controls") or {}
    ctl_rows = [
        f"| `--mode {m}` | {CONTROLS[m]} | {c['anomalies']} | {_cell(c['first'][:150])} |" for m, c in ctl.items()
    ]
    signed = (
        "signed: every worker signs with its own Ed25519 key (made with `ssh-keygen`), the sweepers with an "
        "admin key (`gitlease-admin`), all listed in `.gitlease/allowed_signers` committed to each remote's "
        "default branch before the run"
        if res["signed"]
        else "unsigned (`--unsigned`): no keys, no trust file"
    )
    text = f"""# Reliability

Figures of one real run of the soak, {when} (seed {res["seed"]}), made by `make soak
DURATION={res["duration"]:g}`, which runs:

    python -m soak.run {" ".join(argv)}

{res["workers"]} worker processes for {res["duration"]:g} s against {", ".join(res["kinds"])} remotes, TTL {res["ttl"]} s,
skew margin {res["skew"]} s; every third worker's clock is off by up to half the margin; scopes from
{res["tasks"]}. {signed[0].upper() + signed[1:]}.

| operations run | faults injected | anomalies | seconds |
| ---: | --- | ---: | ---: |
| {ops_total} | {sum(res["faults"].values())}: {faults_by} | **{len(res["anomalies"])}** | {res["seconds"]} |

(Seconds: the whole run, with set-up, the wait for the last leases to expire, one sweep and the checker.)

## What the harness does

- Workers (`soak/worker.py`) loop acquire / renew / commit + fenced push / release on scopes drawn from the
  task traces in `shared/traces/` (the files of a real commit, their directories, or their top two segments).
  While it holds a lease a worker either renews it or makes a commit that writes `<scope>/soak-<worker>.txt`
  for one or two paths of its scope and pushes it to `refs/heads/soak/<worker>` with
  `LeaseService.push_fenced`: the branch moves and the lease is renewed in ONE atomic push pinned to the
  lease's version. A refused branch (its tip is behind: a push of ours landed after we gave up on it) is
  refetched.
- A fault injector (`soak/inject.py`, a process of its own) SIGKILLs workers at any point (`kill-mid-push`:
  the worker had a `git push` running, which goes on without it; the harness restarts the worker), SIGSTOPs
  one for 1.2-2x its TTL and resumes it, SIGKILLs the `git daemon` or HTTP server's whole process group (the
  harness restarts it), and stalls a server's receive for 1-3 s (longer than the clients' 2 s timeout:
  ambiguous outcomes, pushes landing after the client gave up).
- The checker (`soak/checker.py`) trusts no worker: a `reference-transaction` hook on each test remote logs
  every committed ref transaction, in lock order, with the server's clock (reflogs cannot serve: git deletes
  a ref's reflog with the ref). It replays that log with the objects in the server's repository and checks
  P1-P8 (see the module):
  - no scope ref ever moves between leases; a lease's refs appear and vanish together;
  - every renewal is a proper compare-and-swap successor (parent, version + 1, same lease, scope and owner)
    made before the previous version's expiry by the server's clock (within a tolerance of
    {res["tolerance"]} s for the workers' clock offsets and the records' one-second resolution);
  - no two overlapping leases exist at once, and none is deleted before its expiry unless its holder released
    it or an audited reclaim of a dead holder did; every other deletion is an audited reclaim;
  - fencing: every branch update lands in the same transaction as a proper renewal of a lease that is live
    then (not expired, not taken over), whose scope covers every path the update changes (`git diff` of the
    old tip against the new one in the server's repository);
  - signed runs: every lease version is signed (SSHSIG, namespace `gitlease`) over its exact `lease.json` by
    the key its record names as the owner's, and the trust file on the server's default branch (parsed by the
    checker itself) lists that key for the owner's agent id; every audit entry is signed by a listed key. All
    signatures are verified in-process with `gitlease.identity.sshsig.verify`; a random sample of
    {res["ssh_keygen_sample"]} lease versions per remote again with `ssh-keygen -Y verify` (OpenSSH's code,
    independent of gitlease's);
  - after the run and one sweep, no lease is left on the server, nor a stale ref lock.

## Operations (as the workers counted them)

| operation | count |
| --- | ---: |
{chr(10).join(rows)}

`fenced-push`: commit and renewal landed in one push; `fenced-push-rejected`: the branch was refused and
nothing landed (the lease stays held); `fenced-push-lost`: the lease was lost (stop); `fenced-push-error`:
the store was unreachable or the outcome unknown.

## Faults injected

| fault | count |
| --- | ---: |
{chr(10).join(frows)}

Restarts by the harness: {", ".join(f"{k} {v}" for k, v in res["restarts"].items()) or "none"}.

## What the checker saw

| remote | transactions | leases granted | renewals | releases | reclaims | fenced branch updates | signatures verified | also by ssh-keygen | half-landed (grants, remnants cleared) | anomalies |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(crows)}

Half-landed: transactions the server process was SIGKILLed in while it committed them (prepared, all refs
locked and compare-and-swap checked, no outcome logged) of which only some refs landed: git's files backend
renames ref locks one by one (docs/limits.md). They are no anomaly in themselves; the checker checks what
they leave. A grant of which only some refs landed was never answered, so nobody holds it: it must never be
renewed, and its scope refs still keep overlapping grants out. A release or reclaim that half landed ends
the lease, and what it left must later go by an audited reclaim (the sweeper's): "remnants cleared".

After the run, one sweep left {forced_n} leases INVALID because half-landed transactions broke them (refs
that do not appear together); gitlease never reclaims an invalid lease by a rule (fail closed,
docs/sweeping.md), so the harness's admin cleared exactly those with `sweep-stale --force` (audited; the
checker flags a forced release of anything else). Then no lease was left (P7).

Totals: {total("branch_updates")} branch updates, {total("fenced_updates")} of them fenced; {total("signatures")}
signatures verified ({total("ssh_keygen_verified")} also by `ssh-keygen`). Anomalies: **{len(res["anomalies"])}**.

## Negative controls

Each control is a run the checker must fail, or it proves nothing (tests/test_soak.py asserts each fails, and
with nothing but the expected kind of anomaly). Figures from the runs made with this page (4 workers, 4 s,
file remote, no faults):

| control | what it breaks | anomalies | first one |
| --- | --- | ---: | --- |
{chr(10).join(ctl_rows) or "| (not run) | | | |"}

## Not covered yet

- The test remotes run no gitlease receive hook (docs/hooks.md): nothing on the server stops a plain
  `git push` of a branch, or a fenced push touching files outside its scope. Fencing here is the client's
  discipline plus git's atomic compare-and-swap, and the checker detects a breach (the `unfenced` and
  `outside` controls) rather than the server refusing it.
- A reclaim is told from a release only by the audit entry in its transaction, or by its holder's release
  intent: the checker cannot prove who deleted refs when neither exists.
- The checker's trust-file parser reads only the plain lines the harness writes (no patterns, no
  `valid-after`); the `ssh-keygen -Y verify` sample covers OpenSSH's full rules for those lines.
- Fuzzing of hook stdin and trust files is not part of the soak (see the unit tests).
"""
    # keep the other tools' sections: the fleet soak's (soak/fleet.py, `make fleet-soak`), the suite under load
    # (testing/stress.py, `make test-stress`)
    old = path.read_text() if path.exists() else ""
    for name in ("fleet-soak", "stress"):
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin in old and end in old:
            text = text.rstrip("\n") + "\n\n" + old[old.index(begin) : old.index(end) + len(end)] + "\n"
    path.write_text(text)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--kinds", default="file,daemon,http")
    ap.add_argument("--ttl", type=int, default=5)
    ap.add_argument("--skew", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=2)
    ap.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="seconds the checker allows between server and record times (default: skew/2 + 1.5)",
    )
    ap.add_argument(
        "--mode",
        choices=("safe", "force", "unfenced", "outside", "untrusted"),
        default="safe",
        help="safe; or a negative control: force (+ refspecs), unfenced (plain git push of the "
        "branch), outside (fenced commits touching a file outside the lease's scope), untrusted "
        "(the trust file lists other keys than the ones the workers sign with)",
    )
    ap.add_argument(
        "--unsigned",
        dest="signed",
        action="store_false",
        help="no keys and no trust file (default: every worker signs with its own key)",
    )
    ap.add_argument(
        "--ssh-keygen-sample",
        type=int,
        default=50,
        help="lease versions per remote the checker also verifies with `ssh-keygen -Y verify`",
    )
    ap.add_argument(
        "--until",
        default="",
        metavar="OP=N,...",
        help="go on past --duration until every remote kind's workers did N of each OP (faults: injected in all)",
    )
    ap.add_argument("--max-duration", type=float, default=None, help="with --until: at most this long in all")
    ap.add_argument("--no-faults", dest="faults", action="store_false")
    ap.add_argument("--fault-every", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", metavar="FILE")
    args = ap.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    try:
        args.until = {op: int(n) for op, _, n in (item.partition("=") for item in args.until.split(",") if item)}
    except ValueError:
        ap.error("--until takes OP=N,... (acquired=3,renewed=1,faults=6)")
    if args.mode == "untrusted" and not args.signed:
        ap.error("--mode untrusted needs signing (drop --unsigned)")
    args.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    args.tolerance = args.tolerance if args.tolerance is not None else args.skew / 2 + 1.5
    return args


def run_once(args: argparse.Namespace) -> dict:
    soak = Soak(args)
    res: dict = {}
    try:
        res = soak.run()
    finally:
        # a failed safe run keeps its files (servers' logs, the transaction logs, the workers' stderr)
        keep = args.keep or bool(args.mode == "safe" and res.get("anomalies"))
        soak.cleanup(keep=keep)
    if keep:
        res["kept"] = str(soak.tmp)
    res.update(
        seed=args.seed, duration=args.duration, tolerance=args.tolerance, ssh_keygen_sample=args.ssh_keygen_sample
    )
    return res


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    res = run_once(args)
    if args.write and args.mode == "safe":
        res["controls"] = run_controls(args.seed)
        res["anomalies"] += [
            f"negative control --mode {m} found no anomaly: the checker misses that hazard"
            for m, c in res["controls"].items()
            if not c["anomalies"]
        ]
    if args.write:
        write_doc(res, Path(args.write), [a for a in argv if a != "--json"])
    if args.json:
        print(json.dumps(res, indent=2, sort_keys=True))
    else:
        print(f"{res['seconds']} s, ops {res['ops']}, faults {res['faults']}, anomalies {len(res['anomalies'])}")
        for line in res["anomalies"][:200]:
            print("  " + line)
        if res.get("kept"):
            print(f"files kept in {res['kept']}")
    found = bool(res["anomalies"])
    return int(found) if args.mode == "safe" else int(not found)  # a negative control must fail the checker


if __name__ == "__main__":
    sys.exit(main())
