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
* ``auto`` (the default): a file in a small workspace member (a package root other than the repository's, with
  at most ``AUTO_MAX_PACKAGE_FILES`` files below it) leases that package; else a file in a small leaf
  directory (no subdirectories, at most ``AUTO_MAX_DIR_ENTRIES`` entries, not a package root and not the
  repository root) leases that directory, so a task that also adds or edits a sibling stays covered; any other
  file (a large package's manifest, a ``src/lib.rs`` next to subdirectories, a file in a wide flat folder such
  as a flat Python package) leases just itself. No file ever leases a subtree it does not sit in (the package
  trap avoided). Inside a queue (``QueueIndex``), a package or folder is leased whole only when no task within
  ``AUTO_QUEUE_WINDOW`` positions names another file in it: where nearby tasks work side by side in one
  folder, each leases its files, so a folder lease never serialises tasks that touch different files.
  Measured on the requests and tokio traces (docs/planning.md): the same makespan as ``file``.

The tree comes from one ``git ls-tree -r --name-only -z HEAD`` (``read_tree``), never a walk of the worktree:
what the repository holds, not what happens to be on disk. Pure apart from ``read_tree``.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gitlease.core import scope as scopes
from gitlease.core.errors import UsageError

PACKAGE_MARKERS = ("Cargo.toml", "pyproject.toml", "package.json", "go.mod")
GRANULARITIES = ("auto", "file", "dir", "package", "depth:N")
DEFAULT_GRANULARITY = "auto"
AUTO_MAX_DIR_ENTRIES = 12
AUTO_MAX_PACKAGE_FILES = 16
AUTO_QUEUE_WINDOW = 32


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
    sizes: dict[str, int] = field(default_factory=dict)  # folder -> files anywhere below it

    @classmethod
    def from_paths(cls, paths: Iterable[str]) -> RepoTree:
        files = frozenset(paths)
        dirs: dict[str, list[int]] = {scopes.ROOT: [0, 0]}
        sizes: Counter[str] = Counter()
        packages = set()
        for path in files:
            parts = path.split("/")
            sizes[scopes.ROOT] += 1
            for i in range(1, len(parts)):  # parents first, so that each new folder is counted in its own
                folder = "/".join(parts[:i])
                sizes[folder] += 1
                if folder not in dirs:
                    dirs[folder] = [0, 0]
                    dirs[_parent(folder)][1] += 1
            parent = _parent(path)
            dirs[parent][0] += 1
            if parts[-1] in PACKAGE_MARKERS:
                packages.add(parent)
        return cls(files, dirs, frozenset(packages), dict(sizes))

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
    from gitlease.core import gitq
    from gitlease.core.errors import GitError

    try:
        return RepoTree.from_paths(gitq.tree_paths(repo_dir, rev, timeout=timeout))
    except GitError as exc:
        if not gitq.has_tree(repo_dir, rev):
            return RepoTree.from_paths(())  # no commit yet: nothing to detect
        raise UsageError(f"cannot read the tree of {rev}: {exc.stderr.strip()}") from None


def _parent(path: str) -> str:
    head, sep, _ = path.rpartition("/")
    return head if sep else scopes.ROOT


class QueueIndex:
    """What the tasks of a queue name, folder by folder: each path (or explicit scope) below each folder, with
    the queue positions of the tasks that name it. ``auto`` asks it whether another task *near* a task in the
    queue (within ``window`` positions: the tasks that may run at the same time) works in a folder before
    leasing that folder whole. Built once over the whole queue as given (done tasks included), so a task's
    scope does not depend on which tasks are still pending, nor on the host that computes it."""

    def __init__(self, tasks: Iterable[Iterable[str]] = (), *, window: int | None = None) -> None:
        self.window = AUTO_QUEUE_WINDOW if window is None else window
        self._below: dict[str, dict[str, list[int]]] = {}
        self._size = 0
        for names in tasks:
            self.append(names)

    def append(self, names: Iterable[str]) -> int:
        """The next task of the queue (its normalised paths, or its explicit scope); returns its position."""
        pos = self._size
        self._size += 1
        for name in set(names):
            segs = [] if name == scopes.ROOT else name.split("/")
            for i in range(1, len(segs)):  # every folder strictly above the name (the root is never leased)
                self._below.setdefault("/".join(segs[:i]), {}).setdefault(name, []).append(pos)
        return pos

    def __len__(self) -> int:
        return self._size

    def others_in(self, folder: str, own: Iterable[str], position: int) -> bool:
        """Whether a task within ``window`` positions of ``position`` names something below ``folder`` that the
        task at ``position`` (naming ``own``) does not: a path both name makes them wait for each other anyway."""
        mine = set(own)
        lo, hi = position - self.window, position + self.window
        for name, where in self._below.get(folder, {}).items():
            if name in mine:
                continue
            i = bisect.bisect_left(where, lo)
            while i < len(where) and where[i] <= hi:
                if where[i] != position:
                    return True
                i += 1
        return False


def _auto(path: str, tree: RepoTree, own: tuple[str, ...], queue: QueueIndex | None, position: int) -> str:
    def free(folder: str) -> bool:
        return queue is None or not queue.others_in(folder, own, position)

    pkg = tree.package_of(path)
    if pkg is not None and pkg != scopes.ROOT and tree.sizes.get(pkg, 0) <= AUTO_MAX_PACKAGE_FILES and free(pkg):
        return pkg
    folder = _parent(path)
    counts = tree.dirs.get(folder)
    if (
        counts is not None
        and folder != scopes.ROOT
        and folder not in tree.packages
        and counts[1] == 0
        and counts[0] <= AUTO_MAX_DIR_ENTRIES
        and free(folder)
    ):
        return folder
    return path


def suggest_one(
    path: str,
    gran: Granularity,
    tree: RepoTree,
    *,
    own: tuple[str, ...] = (),
    queue: QueueIndex | None = None,
    position: int = -1,
) -> str:
    """The scope for one normalised path (``own``: all the task's paths; ``queue`` and ``position``: the queue
    and the task's place in it, see ``QueueIndex``)."""
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
    return path if is_dir else _auto(path, tree, own or (path,), queue, position)


# A record with every field but the paths as long as a real one gets (a long remote URL, a signed owner): the
# scope fits a lease when this record, at its largest version (records.largest_version), is within the limits.
_SAMPLE = ("t" * 128, "a" * 64, "h" * 64, "ssh-ed25519 " + "A" * 68)  # task id, agent id, host, key


def lease_problem(scope: Sequence[str]) -> str | None:
    """Why no lease could hold ``scope`` (over ``MAX_PATHS`` paths, or a record over ``MAX_RECORD_BYTES``
    bytes at some version: what ``acquire`` refuses before it pushes), or None."""
    from gitlease.core import record as records

    if len(scope) > records.MAX_PATHS:
        return f"{len(scope)} paths, over the limit of {records.MAX_PATHS} paths per lease"
    if sum(len(p) for p in scope) + 3 * len(scope) < records.MAX_RECORD_BYTES // 2:
        return None  # far below the limit (the rest of the record is a few kB): no record built
    owner = records.Owner(_SAMPLE[0], _SAMPLE[1], _SAMPLE[2], 4194304, key=_SAMPLE[3])
    rec = records.new_record(
        lease_id="lease_" + "0" * 20, repo="r" * 256, paths=tuple(scope), workspace_id="w" * 64, owner=owner,
        now=0.0, ttl=86400, renew_every=3600, stop_after=3600,
    )  # fmt: skip
    return records.size_problem(rec)


def fitting(scope: Sequence[str]) -> tuple[str, ...]:
    """``scope`` itself when one lease can hold it, else the finest coarser scope that fits: every path cut to
    its first N segments, for the largest N that fits (the repository root, ``.``, at worst). It covers every
    path of ``scope``; only what is deeper than N is leased as its folder."""
    current = tuple(scope)
    if lease_problem(current) is None:
        return current
    depth = max((p.count("/") + 1 for p in current), default=1)
    for n in range(depth - 1, 0, -1):
        cut = scopes.minimize("/".join(p.split("/")[:n]) for p in current)
        if lease_problem(cut) is None:
            return cut
    return (scopes.ROOT,)


def suggest(
    paths: Iterable[str],
    gran: Granularity | str | None,
    tree: RepoTree,
    *,
    queue: QueueIndex | None = None,
    position: int = -1,
) -> tuple[str, ...]:
    """The minimal scope set covering ``paths`` at granularity ``gran`` (raises ScopeError on a bad path).
    ``queue``, ``position``: the queue the task is part of and its place there (``QueueIndex``), for ``auto``;
    without them, the tree alone decides."""
    g = gran if isinstance(gran, Granularity) else parse_granularity(gran)
    normal = scopes.normalize_all(paths)
    return scopes.minimize(suggest_one(p, g, tree, own=normal, queue=queue, position=position) for p in normal)


__all__ = [
    "Granularity",
    "RepoTree",
    "QueueIndex",
    "parse_granularity",
    "read_tree",
    "suggest",
    "suggest_one",
    "lease_problem",
    "fitting",
    "PACKAGE_MARKERS",
    "DEFAULT_GRANULARITY",
    "AUTO_MAX_DIR_ENTRIES",
    "AUTO_MAX_PACKAGE_FILES",
    "AUTO_QUEUE_WINDOW",
]
