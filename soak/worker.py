"""One soak worker: loops acquire / renew / commit + fenced push / release on random scopes drawn from real
task traces.

    python -m soak.worker --dir D --repo R --url URL --name w1 --seed 1 --ttl 4 --skew 2 [--offset 0.5]
                          [--mode safe|force|unfenced|outside|sweep] [--key KEYFILE] --paths PATHS.json

While it holds a lease, a worker either renews it or makes a commit touching files inside the lease's scope
(``<scope>/soak-<name>.txt``) and pushes it to ``refs/heads/soak/<name>`` with ``LeaseService.push_fenced``:
the branch moves and the lease is renewed in ONE atomic push pinned to the lease's version. ``--key``: the
worker signs every lease version (and audit entry) with that Ed25519 key.

It stops when ``D/stop`` exists (or on SIGTERM, after releasing what it holds). It writes two files the
harness reads: ``D/<name>.stats`` (counts, rewritten after every step) and ``D/<name>.events`` (a
"release-intent" line before each release: the only thing the checker takes from a worker, and only to excuse
the deletion of an unexpired lease). ``--mode force`` is the negative control: it takes leases with `+`
refspecs that switch git's compare-and-swap off, and the checker must catch it. Two more negative controls,
for fencing: ``--mode unfenced`` takes leases properly but moves its branch with a plain ``git push`` (no
lease in the push), and ``--mode outside`` pushes fenced commits that touch a file outside the lease's scope.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gitlease.core import record as records
from gitlease.core import scope as scopes
from gitlease.core.clock import Clock  # noqa: E402
from gitlease.core.config import resolve  # noqa: E402
from gitlease.core.errors import GitLeaseError, HeldError, LeaseLost, PushRejected, RemoteUnavailable  # noqa: E402
from gitlease.core.record import Owner  # noqa: E402
from gitlease.core.refnames import id_ref, scope_ref  # noqa: E402
from gitlease.core.repo import Repo  # noqa: E402
from gitlease.identity.signer import UNSIGNED  # noqa: E402
from gitlease.service.leases import LeaseService  # noqa: E402


class OffsetClock(Clock):
    """The wall clock shifted by a fixed offset: a worker whose clock is wrong (within the skew margin)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


def pick_scope(rng: random.Random, tasks: list[list[str]]) -> list[str]:
    """A task's files at a random granularity: the files, their directories, or their top two segments."""
    paths = rng.choice(tasks)[:4]
    how = rng.random()
    if how < 0.4:
        return paths
    if how < 0.8:
        return sorted({p.rsplit("/", 1)[0] if "/" in p else p for p in paths})
    return sorted({"/".join(p.split("/")[:2]) for p in paths})


class Worker:
    def __init__(self, args) -> None:
        self.args = args
        self.dir = Path(args.dir)
        self.rng = random.Random(args.seed)
        self.tasks = json.loads(Path(args.paths).read_text())
        if args.mode == "force":  # the control must collide to show anything: a few hot scopes only
            self.tasks = [t[:1] for t in self.tasks[:3]]
        repo = Repo.discover(args.repo)
        settings = resolve(
            repo.config,
            env={},
            remote=args.url,
            agent=args.name,
            task=f"soak-{args.name}",
            ttl=args.ttl,
            skew=args.skew,
            timeout=args.timeout,
        )
        signer = UNSIGNED
        if args.key:
            from gitlease.identity.signer import load_signer

            signer = load_signer(args.key)
        self.svc = LeaseService(repo, settings, clock=OffsetClock(args.offset), signer=signer)
        if getattr(args, "no_writer_check", False):
            self.svc.check_writer = lambda: None  # type: ignore[method-assign]
        self.repo = Path(args.repo)
        self.branch = f"refs/heads/soak/{args.name}"
        self.tip_ref = "refs/soak/tip"  # local: the last branch tip this worker saw land on the server
        self.git_env = {
            **os.environ,
            "GIT_INDEX_FILE": str(self.repo / ".git" / "soak-index"),
            "GIT_AUTHOR_NAME": args.name,
            "GIT_AUTHOR_EMAIL": f"{args.name}@soak",
            "GIT_COMMITTER_NAME": args.name,
            "GIT_COMMITTER_EMAIL": f"{args.name}@soak",
        }
        for lock in (self.repo / ".git" / "soak-index.lock", self.repo / ".git" / "refs" / "soak" / "tip.lock"):
            lock.unlink(missing_ok=True)  # left by this worker's previous life, SIGKILLed while it held them
        try:  # a restarted worker goes on counting where its previous life stopped
            self.stats: dict[str, int] = json.loads((self.dir / f"{args.name}.stats").read_text())
        except (OSError, ValueError):
            self.stats = {}
        self.held: str | None = None
        self.stopping = False
        signal.signal(signal.SIGTERM, self._term)

    def _term(self, *_):
        self.stopping = True

    def count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1
        tmp = self.dir / f"{self.args.name}.stats.tmp"
        tmp.write_text(json.dumps(self.stats))
        os.replace(tmp, self.dir / f"{self.args.name}.stats")

    def event(self, **ev) -> None:
        with open(self.dir / f"{self.args.name}.events", "a") as f:
            f.write(json.dumps(ev) + "\n")

    def done(self) -> bool:
        return self.stopping or (self.dir / "stop").exists()

    def pause(self, most: float) -> None:
        end = time.monotonic() + self.rng.uniform(0, most)
        while time.monotonic() < end and not self.done():
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def sweep_loop(self) -> None:
        """``--mode sweep``: a sweeper on this host (it may reclaim the leases of killed workers early)."""
        from gitlease.ops.sweep import Sweeper

        sweeper = Sweeper(self.svc)
        while not self.done():
            try:
                for r in sweeper.sweep().results:
                    self.count(f"sweep-{r.outcome}")
            except GitLeaseError:
                self.count("error")
            self.pause(1.0)

    def loop(self) -> None:
        if self.args.mode == "sweep":
            return self.sweep_loop()
        while not self.done():
            paths = self.rng.choice(self.tasks) if self.args.mode == "force" else pick_scope(self.rng, self.tasks)
            try:
                lease = self.acquire(paths)
            except HeldError:
                self.count("refused")
                self.pause(0.3)
                continue
            except GitLeaseError:
                self.count("error")
                self.pause(0.3)
                continue
            self.count("acquired")
            self.held = lease
            for _ in range(self.rng.randint(0, 3)):
                self.pause(self.args.ttl / 3)
                if self.done():
                    break
                try:
                    if self.args.mode != "force" and self.rng.random() < 0.5:
                        self.commit_and_push(lease, scopes.normalize_all(paths))
                    else:
                        self.svc.renew(lease)
                        self.count("renewed")
                except LeaseLost:
                    self.count("lost")
                    break
                except GitLeaseError:
                    self.count("error")
                    break
            self.release(lease)

    # ------------------------------------------------------------------ commits and fenced pushes
    def _git(self, *argv: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", *argv],
            cwd=self.repo,
            env=self.git_env,
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def _tip(self) -> str | None:
        out = self._git("rev-parse", "-q", "--verify", self.tip_ref, check=False)
        return out.stdout.strip() or None

    def make_commit(self, files: list[str], note: str) -> str:
        """A commit on top of the last tip seen on the server that writes ``note`` to each of ``files``; made
        with plumbing and a private index (the worktree is not touched)."""
        base = self._tip()
        if base:
            self._git("read-tree", base)
        else:
            self._git("read-tree", "--empty")
        blob = self._git("hash-object", "-w", "--stdin", input=note).stdout.strip()
        self._git("update-index", "--add", "--index-info", input="".join(f"100644 {blob}\t{f}\n" for f in files))
        tree = self._git("write-tree").stdout.strip()
        return self._git("commit-tree", tree, *(("-p", base) if base else ()), "-m", note).stdout.strip()

    def refetch_tip(self) -> None:
        """After a branch refusal (our tip is behind: a push of ours landed after we gave up on it, or we died
        before recording it): take the branch's tip from the server."""
        out = self._git("fetch", "-q", "--no-tags", self.args.url, self.branch, check=False)
        if out.returncode == 0:
            self._git("update-ref", self.tip_ref, "FETCH_HEAD")
        self.count("branch-refetched")

    def commit_and_push(self, lease: str, paths: tuple[str, ...]) -> None:
        """One commit inside the lease's scope, pushed with the lease renewal in one atomic push (fenced).
        ``--mode unfenced`` pushes it with a plain ``git push`` instead; ``--mode outside`` adds a file outside
        the scope (both are negative controls: the checker must flag them)."""
        name = self.args.name
        files = [f"{p}/soak-{name}.txt" for p in self.rng.sample(list(paths), min(len(paths), 2))]
        if self.args.mode == "outside":
            stray = f"zz-soak-outside/{name}.txt"
            if not scopes.covers(paths, stray):
                files.append(stray)
        commit = self.make_commit(files, f"{lease} {time.time():.6f} {self.rng.random()}\n")
        spec = f"{commit}:{self.branch}"
        if self.args.mode == "unfenced":
            try:
                res = subprocess.run(
                    ["git", "push", "-q", "--no-verify", self.args.url, spec],
                    cwd=self.repo,
                    capture_output=True,
                    text=True,
                    timeout=self.args.timeout,
                )
                ok = res.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            if ok:
                self._git("update-ref", self.tip_ref, commit)
                self.count("unfenced-push")
            else:
                self.count("unfenced-push-failed")
                self.refetch_tip()
            return
        try:
            self.svc.push_fenced(lease, self.args.url, [spec])
        except PushRejected:
            self.count("fenced-push-rejected")  # the branch was refused (tip behind); the lease is still held
            self.refetch_tip()
            return
        except LeaseLost:
            self.count("fenced-push-lost")
            raise
        except GitLeaseError:
            self.count("fenced-push-error")
            raise
        self._git("update-ref", self.tip_ref, commit)
        self.count("fenced-push")

    def release(self, lease: str) -> None:
        self.event(event="release-intent", lease=lease)
        try:
            self.svc.release(lease)
            self.count("released")
        except (LeaseLost, GitLeaseError):
            self.count("release-failed")
        self.held = None

    def acquire(self, paths: list[str]) -> str:
        if self.args.mode != "force":
            return self.svc.acquire(paths, ttl=self.args.ttl, holder_pid=os.getpid()).lease_id
        return self.acquire_forced(paths)

    def acquire_forced(self, paths: list[str]) -> str:
        """The negative control: a grant pushed with `+` refspecs, so git checks nothing."""
        svc = self.svc
        norm = scopes.normalize_all(paths)
        now = svc.clock.now()
        owner = Owner(
            task_id=svc.settings.task,
            agent_id=svc.settings.agent,
            host=os.uname().nodename,
            pid=0,
            key=svc.signer.public_key,
        )
        rec = records.new_record(
            lease_id=records.new_lease_id(now),
            repo="soak",
            paths=norm,
            workspace_id=self.args.name,
            owner=owner,
            now=now,
            ttl=self.args.ttl,
        )
        oid = svc._write_version(rec, None, "acquire")
        plus = "+"  # built at run time: gitlease itself never contains such a refspec
        specs = [f"{plus}{oid}:{id_ref(rec.lease_id)}"] + [f"{plus}{oid}:{scope_ref(p)}" for p in norm]
        res = subprocess.run(
            ["git", "push", "-q", "--atomic", self.args.url, *specs],
            cwd=self.args.repo,
            capture_output=True,
            text=True,
            timeout=self.args.timeout,
        )
        if res.returncode != 0:
            raise RemoteUnavailable(res.stderr.strip()[-200:])
        svc._remember(rec, oid, oid)
        return rec.lease_id


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    for name in ("--dir", "--repo", "--url", "--name", "--paths"):
        ap.add_argument(name, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ttl", type=int, default=4)
    ap.add_argument("--skew", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=2)
    ap.add_argument("--offset", type=float, default=0.0)
    ap.add_argument("--mode", choices=("safe", "force", "unfenced", "outside", "sweep"), default="safe")
    ap.add_argument("--key", default=None, help="an Ed25519 OpenSSH private key: sign every version")
    ap.add_argument(
        "--no-writer-check",
        action="store_true",
        help="skip the writer's own trust check (the untrusted control: a client that writes untrusted leases)",
    )
    args = ap.parse_args(argv)
    w = Worker(args)
    (Path(args.dir) / f"{args.name}.pid").write_text(str(os.getpid()))
    try:
        w.loop()
    finally:
        if w.held:
            w.release(w.held)
    return 0


if __name__ == "__main__":
    sys.exit(main())
