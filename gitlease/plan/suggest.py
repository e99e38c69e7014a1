"""Scope suggestion: from the paths a task will change, the scope a planner should lease, at a granularity.

Granularities (``parse_granularity`` reads them from the command line):

* ``file``: the paths themselves. Finest: only tasks that touch the same file wait for each other, but a
  task that adds a file next to the ones it named is not covered, and every path is a ref of the lease.
* ``dir``: each path's directory. A file at the repository root leases ``.``, the whole repository.
* ``package``: the deepest package root above each path: a folder holding ``Cargo.toml``, ``pyproject.toml``,
  ``package.json`` or ``go.mod``. Paths in no package are leased as they are. Note the trap: a task that
  touches a package's own manifest (``tokio/Cargo.toml``) leases the whole package, and a workspace manifest
  at the root makes every top-level file lease the whole repository.
* ``depth:N``: the first N segments of each path (the path itself when it is shorter).
* ``auto`` (the default): a file in a small leaf directory (no subdirectories, at most
  ``AUTO_MAX_DIR_ENTRIES`` entries, not a package root and not the repository root) leases that directory,
  so a task that also adds or edits a sibling stays covered; any other file (a package's manifest, a
  ``src/lib.rs`` next to subdirectories, a file in a large flat folder) leases just itself. This is the
  package trap avoided: no file ever leases a subtree it does not sit in.

The tree comes from one ``git ls-tree -r --name-only -z HEAD`` (``read_tree``), never a walk of the worktree:
what the repository holds, not what happens to be on disk. Pure apart from ``read_tree``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gitlease.core import scope as scopes
from gitlease.core.errors import UsageError

PACKAGE_MARKERS = ("Cargo.toml", "pyproject.toml", "package.json", "go.mod")
GRANULARITIES = ("auto", "file", "dir", "package", "depth:N")
DEFAULT_GRANULARITY = "auto"
AUTO_MAX_DIR_ENTRIES = 20


@dataclass(frozen=True)
class Granularity:
    kind: str  # auto | file | dir | package | depth
    depth: int = 0

    def __str__(self) -> str:
        return f"depth:{self.depth}" if self.kind == "depth" else self.kind


def parse_granularity(text: str | None) -> Granularity:
    if text is None or text == "":
        return Granularity(DEFAULT_GRANULARITY)
    t = text.strip().lower()
    if t in ("auto", "file", "dir", "package"):
        return Granularity(t)
    if t in ("directory", "files", "pkg"):
        return Granularity({"directory": "dir", "files": "file", "pkg": "package"}[t])
    if t.startswith("depth:"):
        n = t.split(":", 1)[1]
        if n.isdigit() and int(n) >= 1:
            return Granularity("depth", int(n))
    raise UsageError(f"unknown granularity {text!r}: use file, dir, package, depth:N (N >= 1) or auto")


@dataclass
class RepoTree:
    """The files of a commit, with what suggestion needs: folders, their entry counts, package roots."""

    files: frozenset[str]
    dirs: dict[str, list[int]] = field(default_factory=dict)  # folder -> [files, subfolders] directly in it
    packages: frozenset[str] = frozenset()

    @classmethod
    def from_paths(cls, paths: Iterable[str]) -> RepoTree:
        files = frozenset(paths)
        dirs: dict[str, list[int]] = {scopes.ROOT: [0, 0]}
        packages = set()
        for path in files:
            parts = path.split("/")
            for i in range(1, len(parts)):  # parents first, so that each new folder is counted in its own
                folder = "/".join(parts[:i])
                if folder not in dirs:
                    dirs[folder] = [0, 0]
                    dirs[_parent(folder)][1] += 1
            parent = _parent(path)
            dirs[parent][0] += 1
            if parts[-1] in PACKAGE_MARKERS:
                packages.add(parent)
        return cls(files, dirs, frozenset(packages))

    def package_of(self, path: str) -> str | None:
        """The deepest package root that contains ``path`` (a package's own folder counts), or None."""
        segs = [] if path == scopes.ROOT else path.split("/")
        for n in range(len(segs), -1, -1):
            folder = "/".join(segs[:n]) or scopes.ROOT
            if folder in self.packages:
                return folder
        return None


def read_tree(repo_dir: str, rev: str = "HEAD", *, timeout: float | None = 30.0) -> RepoTree:
    """The tree of ``rev`` (empty in a repository without commits), from one ``git ls-tree``."""
    from gitlease.core import gitcmd

    res = gitcmd.run(
        ["ls-tree", "-r", "--name-only", "-z", "--full-tree", rev], cwd=repo_dir, check=False, timeout=timeout
    )
    if res.returncode != 0:
        probe = gitcmd.run(["rev-parse", "--verify", "-q", rev + "^{tree}"], cwd=repo_dir, check=False)
        if probe.returncode != 0:
            return RepoTree.from_paths(())  # no commit yet: nothing to detect
        raise UsageError(f"cannot read the tree of {rev}: {res.err.strip()}")
    return RepoTree.from_paths(gitcmd.zsplit(res.out))


def _parent(path: str) -> str:
    head, sep, _ = path.rpartition("/")
    return head if sep else scopes.ROOT


def suggest_one(path: str, gran: Granularity, tree: RepoTree) -> str:
    """The scope for one normalised path."""
    if path == scopes.ROOT or gran.kind == "file":
        return path
    is_dir = path in tree.dirs and path not in tree.files
    if gran.kind == "depth":
        segs = path.split("/")
        return "/".join(segs[: gran.depth]) if len(segs) > gran.depth else path
    if gran.kind == "dir":
        return path if is_dir else _parent(path)
    if gran.kind == "package":
        pkg = tree.package_of(path)
        return pkg if pkg is not None else path
    # auto
    if is_dir:
        return path
    folder = _parent(path)
    counts = tree.dirs.get(folder)
    if (
        counts is not None
        and folder != scopes.ROOT
        and folder not in tree.packages
        and counts[1] == 0
        and counts[0] <= AUTO_MAX_DIR_ENTRIES
    ):
        return folder
    return path


def suggest(paths: Iterable[str], gran: Granularity | str | None, tree: RepoTree) -> tuple[str, ...]:
    """The minimal scope set covering ``paths`` at granularity ``gran`` (raises ScopeError on a bad path)."""
    g = gran if isinstance(gran, Granularity) else parse_granularity(gran)
    normal = scopes.normalize_all(paths)
    return scopes.minimize(suggest_one(p, g, tree) for p in normal)


__all__ = [
    "Granularity",
    "RepoTree",
    "parse_granularity",
    "read_tree",
    "suggest",
    "suggest_one",
    "PACKAGE_MARKERS",
    "DEFAULT_GRANULARITY",
    "AUTO_MAX_DIR_ENTRIES",
]
