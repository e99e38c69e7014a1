"""Agents sharing one lease store: each its own linked worktree (the local store) or its own repository
pointed at the remote's URL, all on one fake clock."""

from __future__ import annotations

from pathlib import Path

from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.repo import Repo
from gitlease.service.leases import LeaseService
from testing.gitutil import git


class Fleet:
    """Agents on one store. For the local store they are linked worktrees of one repository (the refs are
    shared); for a remote, each agent has its own clone-like repository pointed at the URL."""

    def __init__(self, base: Path, url: str | None, clock: FakeClock | None = None) -> None:
        self.base, self.url = base, url
        self.clock = clock or FakeClock()
        self.n = 0
        self.main = base / "main"
        git(base, "init", "-q", str(self.main))
        git(self.main, "commit", "-q", "--allow-empty", "-m", "init")

    def path(self, name: str) -> Path:
        if self.url is None:
            wt = self.base / name
            if not wt.exists():
                git(self.main, "worktree", "add", "-q", "--detach", str(wt))
            return wt
        repo = self.base / name
        if not repo.exists():
            git(self.base, "init", "-q", str(repo))
        return repo

    def agent(self, name: str = "", **flags) -> LeaseService:
        self.n += 1
        name = name or f"agent{self.n}"
        repo = Repo.discover(self.path(name))
        settings = resolve(
            repo.config,
            env={},
            remote=self.url,
            agent=name,
            task=f"task-{name}",
            timeout=flags.pop("timeout", 20),
            **flags,
        )
        return LeaseService(repo, settings, clock=self.clock)
