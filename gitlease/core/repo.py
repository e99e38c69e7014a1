"""Where we are: the repository, its git dirs, and its ``lease.*`` configuration (two git calls)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gitlease.core import gitcmd
from gitlease.core.errors import ConfigError, UsageError


@dataclass(frozen=True)
class Repo:
    git_dir: str
    common_dir: str
    worktree: str | None  # None in a bare repository
    object_format: str = "sha1"
    config: dict[str, str] = field(default_factory=dict)  # lease.* keys, lower-cased, last value wins
    remotes: tuple[str, ...] = ()  # the configured remotes' names (remote.<name>.url), sorted

    @classmethod
    def discover(cls, path: str | os.PathLike[str] = ".") -> Repo:
        res = gitcmd.run(
            [
                "rev-parse",
                "--path-format=absolute",
                "--is-bare-repository",
                "--git-dir",
                "--git-common-dir",
                "--show-object-format",
                "--show-toplevel",
            ],
            cwd=path,
            check=False,
        )
        lines = res.out.splitlines()
        if len(lines) < 4:
            raise UsageError(f"not a git repository: {os.path.abspath(path)}")
        bare = lines[0] == "true"
        worktree = None if bare or len(lines) < 5 else lines[4]
        git_dir, common_dir, fmt = lines[1], lines[2], lines[3]
        config, remotes = read_config(git_dir)
        return cls(
            git_dir=git_dir,
            common_dir=common_dir,
            worktree=worktree,
            object_format=fmt,
            config=config,
            remotes=remotes,
        )

    @property
    def objects_dir(self) -> str:
        return os.path.join(self.common_dir, "objects")

    @property
    def cwd(self) -> str:
        return self.worktree or self.git_dir

    def private_dir(self) -> str:
        """gitlease's per-worktree state folder (inside this worktree's own git dir)."""
        return os.path.join(self.git_dir, "gitlease")

    def shared_dir(self) -> str:
        """gitlease's folder shared by all worktrees (in the common git dir)."""
        return os.path.join(self.common_dir, "gitlease")


def read_lease_config(git_dir: str) -> dict[str, str]:
    return read_config(git_dir)[0]


def read_config(git_dir: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """The ``lease.*`` keys (lower-cased, last value wins) and the names of the configured remotes, in one
    ``git config`` call. A git that cannot read the configuration is an error, never "no keys": an empty
    answer would silently mean unsigned (issue 17: a renewal agent whose working directory was removed renewed
    signed leases unsigned that way)."""
    res = gitcmd.run(
        ["--git-dir", git_dir, "config", "-z", "--get-regexp", r"^(lease\.|remote\..*\.url$)"],
        cwd=git_dir,
        check=False,
    )
    if res.returncode not in (0, 1):  # 1: no such key
        raise ConfigError(f"cannot read the git configuration of {git_dir}: {res.err.strip() or res.returncode}")
    out: dict[str, str] = {}
    remotes: set[str] = set()
    for item in gitcmd.zsplit(res.out):
        key, _, value = item.partition("\n")
        if key.lower().startswith("lease."):
            out[key.lower()] = value
        elif key.startswith("remote.") and key.endswith(".url"):
            remotes.add(key[len("remote.") : -len(".url")])
    return out, tuple(sorted(remotes))


def absent_paths(repo: Repo, paths: list[str] | tuple[str, ...]) -> list[str]:
    """The scopes among ``paths`` that name nothing here: neither in HEAD's tree nor in the work tree (a typo
    such as ``servics/billing``). One ``git cat-file --batch-check`` for all of them; nothing without a work
    tree or before the first commit."""
    wanted = [p for p in paths if p != "."]
    if repo.worktree is None or not wanted:
        return []
    res = gitcmd.run(
        ["cat-file", "--batch-check=%(objecttype)"],
        cwd=repo.worktree,
        input="".join(f"HEAD:{p}\n" for p in wanted).encode(),
        check=False,
    )
    answers = res.out.splitlines()
    if res.returncode != 0 or len(answers) != len(wanted):
        return []
    return [
        p
        for p, answer in zip(wanted, answers)
        if answer.endswith("missing") and not os.path.lexists(os.path.join(repo.worktree, p))
    ]
