"""The git questions gitlease asks, each named once: the rest of the package asks these and never builds git
argv (the way pre-commit keeps its questions in ``pre_commit/git.py``).

Each question is a small function over one ``git`` call (``gitcmd.run``: environment, timeouts, errors), its
output read with a small pure parser (``parse_*``) fed ``-z`` or porcelain output, never text meant for people.
A question about state answers ``None``, ``False`` or an empty list when git says no; one that changes
something raises ``GitError`` when git fails, unless it says otherwise.

Where a question runs is a ``Where``: a directory (the repository or worktree there), or an ``At``: a worktree
addressed from outside it (``outside``), a temporary index (``At.index``), or the repository git's own
environment names (``HOOK``: a server hook, whose pushed objects are still in git's quarantine).

Who else runs git (tests/test_layers.py holds the list):

- ``core/store.py``: the store's transport (``push_argv``, the atomic push pinned with ``--force-with-lease``,
  the listing by ``ls-remote``, fetches by oid, ``update-ref --stdin`` transactions) keeps its own calls;
  ``push`` here runs a push that ``push_argv`` built, for the doctor's probes;
- ``core/repo.py``: finding the repository and reading its ``lease.*`` config (imported by everything);
- the hooks' fast paths (``enforce/entry.py``, ``enforce/guard.py``, ``enforce/shell.py``,
  ``enforce/hookmain.py``): they stay cheap, on purpose: git runs a commit hook on every commit and an agent's
  guard on every edit, so they import neither this module nor ``subprocess`` where they can avoid it.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Union

from gitlease.core import gitcmd
from gitlease.core.errors import UsageError
from gitlease.core.gitcmd import Result, zsplit
from gitlease.core.hookgit import touched_paths_args
from gitlease.core.store import RefUpdate, parse_batch, push_argv

# ------------------------------------------------------------------------------------ where


@dataclass(frozen=True)
class At:
    """Where git runs: in ``cwd`` (None: this process's directory); on ``git_dir`` and ``work_tree`` given
    explicitly (a worktree addressed from outside); with ``index`` as its index file; ``hook_env``: keeping
    the repository variables git exported to this process (a server hook)."""

    cwd: str | None = None
    git_dir: str | None = None
    work_tree: str | None = None
    index: str | None = None
    hook_env: bool = False


Where = Union[str, "os.PathLike[str]", At]

HOOK = At(hook_env=True)  # the repository a server hook runs in (GIT_DIR and the quarantine kept)


def outside(git_dir: str, work_tree: str, *, cwd: str | None = None) -> At:
    """A worktree addressed from outside it (``--git-dir``/``--work-tree``), run in its git dir unless
    ``cwd`` says otherwise: one agent's inspection is then never "a process with its working directory in it"
    for another's."""
    return At(cwd=cwd or git_dir, git_dir=git_dir, work_tree=work_tree)


def with_index(where: Where, index: str) -> At:
    """``where`` with a temporary index file (``GIT_INDEX_FILE``)."""
    return dataclasses.replace(_at(where), index=index)


def _at(where: Where) -> At:
    return where if isinstance(where, At) else At(cwd=os.fspath(where))


def _git(
    where: Where,
    args: Sequence[str],
    *,
    input: bytes | None = None,
    check: bool = False,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Result:
    at = _at(where)
    pre = ["--git-dir", at.git_dir, "--work-tree", at.work_tree or at.git_dir] if at.git_dir else []
    extra = dict(env or {})
    if at.index:
        extra["GIT_INDEX_FILE"] = at.index
    return gitcmd.run(
        [*pre, *args],
        cwd=at.cwd,
        input=input,
        check=check,
        timeout=timeout,
        env=extra or None,
        keep_repo_env=at.hook_env,
    )


def _answer(res: Result) -> str | None:
    """The first line git printed when it succeeded with something to say, else None."""
    out = res.out.strip()
    return out or None if res.returncode == 0 else None


def _lines(items: Iterable[str]) -> str:
    return "".join(f"{x}\n" for x in items)


# ----------------------------------------------------------------------------- the repository


def version() -> str:
    """``git --version`` as git prints it ("" when git cannot say)."""
    return gitcmd.run(["--version"], check=False).out


def git_dir(where: Where) -> str:
    """The absolute git directory of the worktree at ``where`` (GitError outside a repository)."""
    return _git(where, ["rev-parse", "--path-format=absolute", "--git-dir"], check=True).out.strip()


def common_dir(where: Where) -> str:
    """The absolute common git directory (shared by every worktree) at ``where``."""
    return _git(where, ["rev-parse", "--path-format=absolute", "--git-common-dir"], check=True).out.strip()


def git_path(where: Where, name: str) -> str | None:
    """Where git keeps ``name`` (``hooks``: ``core.hooksPath`` followed), absolute; None outside a repository."""
    return _answer(_git(where, ["rev-parse", "--path-format=absolute", "--git-path", name]))


def toplevel(where: Where) -> str | None:
    """The top of the worktree at ``where``; None outside one (or in a bare repository)."""
    return _answer(_git(where, ["rev-parse", "--show-toplevel"]))


def object_format(where: Where) -> str:
    """``sha1`` or ``sha256``."""
    return _git(where, ["rev-parse", "--show-object-format"]).out.strip() or "sha1"


# ------------------------------------------------------------------------------- names, refs


def rev_parse(where: Where, name: str) -> str | None:
    """The object ``name`` names, or None."""
    return _answer(_git(where, ["rev-parse", "--verify", "--quiet", "--end-of-options", name]))


def rev_parse_commit(where: Where, name: str) -> str | None:
    """The commit ``name`` names (a tag peeled), or None when it names no commit here."""
    return rev_parse(where, f"{name}^{{commit}}")


def has_tree(where: Where, name: str) -> bool:
    """Whether ``name`` names a tree (or a commit, which has one) here."""
    return rev_parse(where, f"{name}^{{tree}}") is not None


def head_commit(where: Where) -> str:
    """The commit HEAD is on (GitError when there is none)."""
    return _git(where, ["rev-parse", "--verify", "--end-of-options", "HEAD"], check=True).out.strip()


def is_commit(where: Where, oid: str) -> bool:
    """Whether the commit ``oid`` is in this repository's objects."""
    return _git(where, ["cat-file", "-e", f"{oid}^{{commit}}"]).returncode == 0


def symbolic_full_name(where: Where, name: str) -> str | None:
    """The full ref name ``name`` stands for (``main`` -> ``refs/heads/main``), or None when it names no ref."""
    full = _answer(_git(where, ["rev-parse", "--symbolic-full-name", name]))
    return full if full and full.startswith("refs/") else None


def upstream(where: Where, branch: str) -> str | None:
    """The short name of ``branch``'s upstream (``origin/main``), or None."""
    return _answer(_git(where, ["rev-parse", "--abbrev-ref", "--symbolic-full-name", f"{branch}@{{upstream}}"]))


def symbolic_ref(where: Where, name: str = "HEAD") -> str | None:
    """The short name of the ref the symbolic ref ``name`` points at; None when it is not symbolic."""
    return _answer(_git(where, ["symbolic-ref", "--quiet", "--short", name]))


def current_branch(where: Where) -> str | None:
    """The branch checked out (short name), or None when HEAD is detached."""
    return symbolic_ref(where, "HEAD")


def valid_ref_name(where: Where, ref: str) -> bool:
    """Whether ``ref`` is a well-formed full ref name (``check-ref-format``)."""
    return _git(where, ["check-ref-format", ref]).returncode == 0


def valid_branch_name(where: Where, branch: str) -> bool:
    """Whether ``branch`` is a name a new branch may take (``check-ref-format --branch``; never ``-x``)."""
    return not branch.startswith("-") and _git(where, ["check-ref-format", "--branch", branch]).returncode == 0


def ref_exists(where: Where, ref: str) -> bool:
    """Whether the full ref ``ref`` exists here."""
    return _git(where, ["show-ref", "--verify", "--quiet", ref]).returncode == 0


def refs(where: Where, *patterns: str, check: bool = False) -> dict[str, str]:
    """{ref: oid} of the refs here under ``patterns`` (``for-each-ref``: a prefix, or a glob)."""
    res = _git(where, ["for-each-ref", "--format=%(objectname) %(refname)", *patterns], check=check)
    return parse_oid_ref_lines(res.out, " ") if res.returncode == 0 else {}


def update_ref(
    where: Where, ref: str, new: str, old: str | None = None, *, message: str | None = None, check: bool = True
) -> bool:
    """Set ``ref`` to ``new``; with ``old``, only when it is ``old`` now (all zeros: when it does not exist).
    GitError when git refuses, unless not ``check`` (then False)."""
    args = ["update-ref", *(["-m", message] if message else []), ref, new, *([old] if old is not None else [])]
    return _git(where, args, check=check).returncode == 0


def delete_ref(where: Where, ref: str, old: str) -> bool:
    """Delete ``ref`` only while it is ``old``. False when git refuses."""
    return _git(where, ["update-ref", "-d", ref, old]).returncode == 0


# ---------------------------------------------------------------------------- commit walks


def count_commits(where: Where, tip: str, exclude: Sequence[str] = ()) -> int:
    """How many commits ``tip`` reaches that none of ``exclude`` does."""
    out = _git(where, ["rev-list", "--count", tip, "--not", *exclude, "--"], check=True).out.strip()
    return int(out or 0)


def count_unshared(where: Where, tip: str, except_branch: str | None = None) -> int | None:
    """How many commits ``tip`` reaches that no branch (but ``except_branch``), remote-tracking branch or tag
    holds; None when git cannot tell."""
    args = ["rev-list", "--count", tip, "--not"]
    if except_branch:
        args.append(f"--exclude={except_branch}")  # --exclude before --branches takes names without refs/heads/
    res = _git(where, [*args, "--branches", "--remotes", "--tags"])
    out = res.out.strip()
    return int(out) if res.returncode == 0 and out.isdigit() else None


def rev_list(where: Where, include: Sequence[str], exclude: Sequence[str] = ()) -> list[str]:
    """The commits ``include`` reaches and ``exclude`` does not."""
    return _git(where, ["rev-list", *include, "--not", *exclude, "--"], check=True).out.split()


def walk(where: Where, tips: Sequence[str], exclude: Sequence[str] = (), *, parents: bool = False) -> list[str]:
    """``rev-list`` of ``tips`` not reached from ``exclude`` (given on stdin: any number); with ``parents``,
    in topological order (children first), each line ``<commit> <parent>...``."""
    extra = ["--parents", "--topo-order"] if parents else []
    stdin = _lines(tips) + _lines(f"^{o}" for o in exclude)
    return _git(where, ["rev-list", *extra, "--stdin"], input=stdin.encode(), check=True).out.splitlines()


def first_parents(where: Where, tip: str, stop: str | None = None, *, limit: int) -> list[str] | None:
    """At most ``limit`` commits along ``tip``'s first parents, newest first, down to (without) ``stop``;
    None when git cannot walk them."""
    args = ["rev-list", "--first-parent", f"--max-count={limit}", tip, *([f"^{stop}"] if stop else [])]
    res = _git(where, args)
    return res.out.split() if res.returncode == 0 else None


def first_parent_chain(where: Where, tip: str, *, limit: int) -> dict[str, tuple[str, ...]]:
    """{commit: its parents} of at most ``limit`` commits along ``tip``'s first parents (empty when git
    cannot walk them)."""
    res = _git(where, ["rev-list", "--first-parent", "--parents", f"--max-count={limit}", tip, "--"])
    out: dict[str, tuple[str, ...]] = {}
    for line in res.out.splitlines() if res.returncode == 0 else ():
        parts = line.split()
        if parts:
            out[parts[0]] = tuple(parts[1:])
    return out


def root_commits(where: Where, oid: str) -> list[str]:
    """The commits without parents that ``oid`` reaches."""
    res = _git(where, ["rev-list", "--max-parents=0", oid])
    return res.out.split() if res.returncode == 0 else []


def is_ancestor(where: Where, ancestor: str, commit: str) -> bool:
    """Whether ``commit`` reaches ``ancestor`` (or is it)."""
    return _git(where, ["merge-base", "--is-ancestor", ancestor, commit]).returncode == 0


def all_reached(where: Where, tip: str, commits: Sequence[str]) -> bool:
    """Whether ``tip`` reaches every one of ``commits`` (each is it or an ancestor), in one walk; False also when
    git cannot tell (a commit it does not have, or one not named by its full object id: no argument here is taken
    for an option): ask ``is_ancestor`` of each then."""
    if not all(OID_RE.fullmatch(c) for c in commits):
        return False
    res = _git(where, ["rev-list", "--max-count=1", *commits, "--not", tip, "--"])
    return res.returncode == 0 and not res.out.strip()


def octopus_bases(where: Where, commits: Sequence[str]) -> list[str]:
    """Common ancestors of all ``commits`` (``merge-base --octopus``); none when they share no history."""
    res = _git(where, ["merge-base", "--octopus", *commits])
    return res.out.split() if res.returncode == 0 else []


def log_commits(where: Where, heads: Sequence[str]) -> list[str]:
    """Every commit ``heads`` reach, newest first (``git log``)."""
    res = _git(where, ["log", "--format=%H", *heads, "--"])
    return [line for line in res.out.splitlines() if line]


def branches_containing(where: Where, commit: str) -> list[str]:
    """The remote-tracking branches (short names: ``origin/main``) that hold ``commit``."""
    return _git(where, ["branch", "-r", "--format=%(refname:short)", "--contains", commit]).out.split()


# ------------------------------------------------------------------------ paths of commits


def touched_paths(where: Where, include: Sequence[str], exclude: Sequence[str]) -> list[str]:
    """Every path changed by the commits ``include`` reaches and ``exclude`` does not, sorted: deletions, both
    sides of renames and what a merge itself changes (``log --name-only --no-renames --cc -z``)."""
    return sorted(set(zsplit_bytes(_git(where, touched_paths_args(include, exclude), check=True).stdout)))


def paths_of_commits(where: Where, oids: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(commit, the paths it changes) for exactly ``oids``, in that order, from one ``git log``; ValueError when
    git's answer does not read as exactly those commits (fail closed: a misread listing could hide a path)."""
    if not oids:
        return []
    args = ["log", "--no-walk=unsorted", "--stdin", "-z", "--format=%x00%H", "--name-only", "--no-renames", "--cc"]
    found = parse_log_paths(_git(where, args, input=_lines(oids).encode(), check=True).stdout, oids)
    if [oid for oid, _paths in found] != list(oids):
        raise ValueError("git log and rev-list disagree")
    return found


def trailers_of(where: Where, oids: Sequence[str], key: str) -> dict[str, list[str]]:
    """{commit: the values of its ``key:`` trailers} for ``oids``, from one ``git log``."""
    if not oids:
        return {}
    fmt = f"--format=%H%x00%(trailers:key={key},valueonly,separator=%x01)%x00"
    out = _git(where, ["log", "--no-walk=unsorted", "--stdin", fmt], input=_lines(oids).encode(), check=True)
    items = out.stdout.split(b"\0")
    found: dict[str, list[str]] = {}
    for i in range(0, len(items) - 1, 2):
        oid = items[i].decode("ascii", "replace").strip()
        found.setdefault(oid, []).extend(v.strip() for v in items[i + 1].decode("utf-8", "replace").split("\x01"))
    return found


def trailers_between(where: Where, head: str, base: str, key: str) -> list[str]:
    """The values of the ``key:`` trailers of the commits ``head`` has and ``base`` has not."""
    fmt = f"--format=%(trailers:key={key},valueonly,separator=%x00)%x00"
    return [v.strip() for v in zsplit_bytes(_git(where, ["log", fmt, head, "--not", base, "--"], check=True).stdout)]


def tree_blobs(where: Where, rev: str, pathspecs: Sequence[str]) -> list[tuple[str, str]]:
    """(path, blob oid) of every blob in ``rev``'s tree under the literal ``pathspecs``, in git's order; empty
    when ``rev`` has no such tree."""
    args = ["--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", rev, "--", *pathspecs]
    res = _git(where, args)
    out = []
    for item in zsplit(res.out) if res.returncode == 0 else ():
        meta, _, name = item.partition("\t")
        mode_kind_oid = meta.split()
        if len(mode_kind_oid) == 3 and mode_kind_oid[1] == "blob":
            out.append((name, mode_kind_oid[2]))
    return out


def tree_paths(where: Where, rev: str, *, timeout: float | None = None) -> list[str]:
    """Every file path in ``rev``'s tree (GitError when it has none)."""
    args = ["ls-tree", "-r", "--name-only", "-z", "--full-tree", rev]
    return zsplit(_git(where, args, check=True, timeout=timeout).out)


# --------------------------------------------------------------------------------- objects


def read_objects(where: Where, names: Iterable[str]) -> dict[str, tuple[str, bytes]]:
    """{name: (type, content)} of the objects ``names`` name (``<oid>``, ``<rev>:<path>``, ``<rev>^{tree}``),
    from one ``cat-file --batch``; a name that names nothing is left out."""
    wanted = list(names)
    if not wanted:
        return {}
    res = _git(
        where,
        ["cat-file", "--batch=%(objecttype) %(objectsize) %(rest)"],
        input=_lines(f"{n} {n}" for n in wanted).encode(),
    )
    return parse_batch(res.stdout)


def commits_of(where: Where, oids: Iterable[str]) -> dict[str, str]:
    """{oid: the commit it names} for those of ``oids`` that name a commit here (a tag peeled), from one
    ``cat-file --batch-check``."""
    wanted = sorted(set(oids))
    stdin = _lines(f"{o}^{{commit}} {o}" for o in wanted).encode()
    res = _git(where, ["cat-file", "--batch-check=%(objectname) %(objecttype) %(rest)"], input=stdin)
    out = {}
    for line in res.out.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[1] == "commit" and parts[2] in wanted:
            out[parts[2]] = parts[0]
    return out


def hash_object(where: Where, data: bytes) -> str:
    """Write ``data`` as a blob; its id."""
    return _git(where, ["hash-object", "-w", "--stdin"], input=data, check=True).out.strip()


def write_tree(where: Where, *, check: bool = True) -> str | None:
    """Write the index (``where``'s, or ``At.index``) as a tree; its id. None when it cannot (an unmerged
    index) and not ``check``."""
    res = _git(where, ["write-tree"], check=check)
    return res.out.strip() if res.returncode == 0 else None


def commit_tree(
    where: Where,
    tree: str,
    parents: Sequence[str],
    message: str,
    *,
    sign: bool = False,
    ident: tuple[str, str] | None = None,
) -> str:
    """Write a commit of ``tree`` on ``parents``; its id. ``sign``: signed as ``commit.gpgSign`` would;
    ``ident``: (name, email) as author and committer."""
    env = None
    if ident is not None:
        env = {
            f"GIT_{who}_{what}": value
            for who in ("AUTHOR", "COMMITTER")
            for what, value in zip(("NAME", "EMAIL"), ident)
        }
    args = ["commit-tree", *(["-S"] if sign else []), tree, *(x for p in parents for x in ("-p", p)), "-m", message]
    return _git(where, args, check=True, env=env).out.strip()


# ----------------------------------------------------------------------------------- index


def read_tree(where: Where, tree: str) -> None:
    """Load ``tree`` into the index (give ``where`` a temporary one: ``with_index``)."""
    _git(where, ["read-tree", tree], check=True)


def index_add(where: Where, path: str, blob: str, *, mode: str = "100644") -> None:
    """Put the blob ``blob`` at ``path`` in the index."""
    _git(where, ["update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}"], check=True)


def index_remove(where: Where, path: str) -> None:
    """Take ``path`` out of the index."""
    _git(where, ["update-index", "--force-remove", "--", path], check=True)


def add_all(where: Where, *, ignored: bool = False) -> None:
    """Stage every change of the work tree, untracked files included (``ignored``: ignored files too)."""
    _git(where, ["add", "--all", *(["-f"] if ignored else []), "--", "."], check=True)


def is_tracked(where: Where, path: str) -> bool:
    """Whether ``path`` (relative to ``where``) is in the index."""
    return _git(where, ["ls-files", "--error-unmatch", "--", path]).returncode == 0


def flagged_paths(where: Where) -> list[str]:
    """Index entries marked skip-worktree or assume-unchanged (``ls-files -v``: ``S``, or a lower-case tag)."""
    return [
        path
        for tag, path in parse_ls_files_tags(_git(where, ["ls-files", "-v", "-z"]).out)
        if tag == "S" or tag.islower()
    ]


def clear_flags(where: Where, paths: Sequence[str]) -> bool:
    """Clear skip-worktree and assume-unchanged of ``paths`` (given from the top of the worktree, so run
    ``where`` there). One flag per call: update-index applies only the first of ``--no-assume-unchanged`` and
    ``--no-skip-worktree`` to a path. False when git refuses."""
    for flag in ("--no-assume-unchanged", "--no-skip-worktree"):
        for i in range(0, len(paths), 500):
            if _git(where, ["update-index", flag, "--", *paths[i : i + 500]]).returncode != 0:
                return False
    return True


def refresh_index(where: Where) -> None:
    """Refresh the index's stat data (so a file touched but not changed is not told as changed)."""
    _git(where, ["update-index", "-q", "--refresh"])


def changed_files(where: Where) -> list[str] | None:
    """Tracked files whose content on disk differs from the index (``diff-files``); None when git cannot say."""
    res = _git(where, ["diff-files", "--name-only", "-z"])
    return zsplit(res.out) if res.returncode == 0 else None


# ---------------------------------------------------------------------------- work tree state


class StatusEntry(NamedTuple):
    """One line of ``git status --porcelain=v2``: ``kind`` is ``1`` (changed), ``2`` (renamed or copied),
    ``u`` (unmerged), ``?`` (untracked) or ``!`` (ignored); ``xy`` the index and work tree states (``.``:
    unchanged); ``orig`` a rename's source."""

    kind: str
    xy: str
    path: str
    orig: str | None = None


def status(
    where: Where, *, ignored: bool = False, untracked: bool = True, submodules: bool = False
) -> list[StatusEntry]:
    """What ``git status`` tells of the work tree: every untracked file (with ``untracked``), ignored ones with
    ``ignored`` (``--ignored=matching``: a directory whole, ``dir/``); ``submodules``: changes inside
    submodules too (``--ignore-submodules=none``). GitError when git cannot tell."""
    args = ["status", "--porcelain=v2", "-z", f"--untracked-files={'all' if untracked else 'no'}"]
    args += ["--ignored=matching"] if ignored else []
    args += ["--ignore-submodules=none"] if submodules else []
    return parse_status_v2(_git(where, args, check=True).out)


def stash_subjects(where: Where) -> list[str]:
    """The subject of every stash entry (``WIP on BRANCH: ...``), newest first."""
    return _git(where, ["stash", "list", "--format=%gs"]).out.splitlines()


def checkout_new_branch(where: Where, branch: str, start: str) -> None:
    """Create ``branch`` at ``start`` and check it out; git refuses (GitError) rather than overwrite a local
    change."""
    _git(where, ["checkout", "--quiet", "--no-track", "-b", branch, start], check=True)


def reset_hard(where: Where, commit: str) -> None:
    """Make the branch, the index and the work tree ``commit``."""
    _git(where, ["reset", "--quiet", "--hard", commit], check=True)


def rebase(where: Where, onto: str) -> str | None:
    """Rebase the current branch onto ``onto``. None when it did; else it is aborted (the branch as it was) and
    git's last word on why is returned."""
    res = _git(where, ["rebase", "--quiet", onto])
    if res.returncode == 0:
        return None
    _git(where, ["rebase", "--abort"])
    said = (res.err or res.out).strip().splitlines()
    return said[-1] if said else "conflict"


# ---------------------------------------------------------------------------------- worktrees


def worktree_list(where: Where, *, check: bool = True) -> list[dict[str, str]]:
    """Every worktree git knows, each a dict of its ``worktree list --porcelain`` attributes (``worktree``,
    ``HEAD``, ``branch``, and ``detached``, ``locked``, ``prunable`` with their reason, or "")."""
    res = _git(where, ["worktree", "list", "--porcelain", "-z"], check=check)
    return parse_worktree_list(res.out) if res.returncode == 0 else []


def worktree_add(where: Where, path: str, start: str, *, branch: str, lock_reason: str) -> None:
    """A new worktree at ``path`` on a new ``branch`` at ``start``, locked with ``lock_reason`` from birth."""
    args = ["worktree", "add", "--quiet", "--lock", "--reason", lock_reason, "--no-track", "-b", branch, path, start]
    _git(where, args, check=True)


def worktree_lock(where: Where, path: str, reason: str, *, check: bool = True) -> bool:
    """Lock the worktree at ``path`` with ``reason`` (``prune`` and ``remove`` leave it alone)."""
    return _git(where, ["worktree", "lock", "--reason", reason, path], check=check).returncode == 0


def worktree_unlock(where: Where, path: str) -> bool:
    """Unlock the worktree at ``path``; False when it was not locked (or is unknown)."""
    return _git(where, ["worktree", "unlock", path]).returncode == 0


def worktree_move(where: Where, path: str, new: str) -> bool:
    """Move the (unlocked) worktree at ``path`` to ``new``; False when git refuses."""
    return _git(where, ["worktree", "move", path, new]).returncode == 0


def worktree_remove(where: Where, path: str, *, force: bool = False) -> Result:
    """Remove the worktree at ``path`` (``force``: with its local changes); git's answer, failed or not."""
    return _git(where, ["worktree", "remove", *(["-f"] if force else []), path])


def worktree_prune(where: Where) -> None:
    """Forget worktrees whose directory is gone (and not locked)."""
    _git(where, ["worktree", "prune"], check=True)


def worktree_repair(where: Where, path: str) -> bool:
    """Put back the link (``.git`` file) of the worktree at ``path``."""
    return _git(where, ["worktree", "repair", path]).returncode == 0


# ------------------------------------------------------------------------------------ config


def config_get(
    where: Where, key: str, *, type: str | None = None, file: str | None = None, scope: str | None = None
) -> str | None:
    """The value of ``key`` (``type``: ``bool``..., as git canonicalises it), from ``file`` or a ``scope``
    (``local``, ``worktree``, ``global``) when given; None when unset."""
    args = ["config", *(["--file", file] if file else []), *([f"--{scope}"] if scope else [])]
    return _answer(_git(where, [*args, *([f"--type={type}"] if type else []), "--get", key]))


def config_set(where: Where, key: str, value: str, *, file: str | None = None, scope: str | None = None) -> None:
    """Set ``key`` to ``value`` in ``file``, in a ``scope`` (``local``, ``worktree``, ``global``) or in the
    repository's config."""
    args = ["config", *(["--file", file] if file else []), *([f"--{scope}"] if scope else [])]
    _git(where, [*args, key, value], check=True)


def config_unset(
    where: Where, key: str, *, file: str | None = None, scope: str | None = None, check: bool = True
) -> bool:
    """Remove every value of ``key``; False when there was none (GitError when ``check``)."""
    args = ["config", *(["--file", file] if file else []), *([f"--{scope}"] if scope else [])]
    return _git(where, [*args, "--unset-all", key], check=check).returncode == 0


def config_matching(where: Where, pattern: str) -> dict[str, str]:
    """{key: value} of the keys matching the regular expression ``pattern`` (``config --get-regexp``; the last
    value wins). ValueError when a key has no value (a bare boolean)."""
    return parse_config_z(_git(where, ["config", "-z", "--get-regexp", pattern]).out)


# ----------------------------------------------------------------------------------- remotes


def remote_names(where: Where) -> list[str]:
    """The names of the configured remotes."""
    return _git(where, ["remote"], check=True).out.split()


def remote_url(where: Where, remote: str) -> str | None:
    """The URL configured for ``remote`` (as written, ``insteadOf`` not applied), or None."""
    return _answer(_git(where, ["remote", "get-url", remote]))


def resolved_url(where: Where, remote: str) -> str:
    """The URL git would reach ``remote`` at (``insteadOf`` applied); ``remote`` itself when it is one."""
    return _git(where, ["ls-remote", "--get-url", remote]).out.strip() or remote


@dataclass(frozen=True)
class Listed:
    """What ``git ls-remote`` said: ``refs`` {ref: oid} (``HEAD`` included when asked), ``symrefs`` {name:
    target} (with ``symref``); its exit code and stderr."""

    returncode: int
    refs: dict[str, str]
    symrefs: dict[str, str]
    err: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def ls_remote(
    where: Where,
    remote: str,
    *patterns: str,
    symref: bool = False,
    refs_only: bool = False,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Listed:
    """The refs of ``remote`` matching ``patterns`` (``HEAD`` is one), read now; ``refs_only``: no peeled tags
    and no ``HEAD``. A timeout raises gitcmd.Timeout."""
    args = ["ls-remote", *(["--symref"] if symref else []), *(["--refs"] if refs_only else []), remote, *patterns]
    res = _git(where, args, timeout=timeout, env=env)
    found, targets = parse_ls_remote(res.out)
    return Listed(res.returncode, found, targets, res.err)


def fetch_oids(where: Where, remote: str, oids: Sequence[str], *, timeout: float | None = 60) -> bool:
    """Fetch the commits ``oids`` from ``remote`` by id (no tags, no FETCH_HEAD, no gc); False when git fails."""
    args = ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-auto-gc", "--no-recurse-submodules"]
    return _git(where, [*args, "--stdin", remote], input=_lines(oids).encode(), timeout=timeout).returncode == 0


def fetch_ref(where: Where, remote: str, src: str, dst: str, *, timeout: float | None = None) -> str | None:
    """Fetch ``remote``'s ``src`` into the local ref ``dst`` (replaced whatever it was). None when fetched,
    else git's stderr."""
    res = _git(where, ["fetch", "--quiet", "--no-tags", remote, f"+{src}:{dst}"], timeout=timeout)
    return None if res.returncode == 0 else res.err


def push(
    where: Where,
    remote: str,
    updates: Sequence[RefUpdate],
    *,
    atomic: bool = True,
    hooks_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> Result:
    """The store's push of ``updates`` (``store.push_argv``: every ref pinned with ``--force-with-lease``,
    never forced), with our own ``hooks_dir`` (then the hooks run) and environment: the doctor's probes. A
    timeout raises gitcmd.Timeout."""
    argv = push_argv(remote, updates, atomic=atomic, run_hooks=hooks_dir is not None)
    pre = ["-c", f"core.hooksPath={hooks_dir}"] if hooks_dir is not None else []
    return _git(where, [*pre, *argv], timeout=timeout, env=env)


# ----------------------------------------------------------------------------- pure parsers


def zsplit_bytes(data: bytes) -> list[str]:
    """The non-empty NUL-terminated items (``-z``) of raw output, decoded (a path may be any bytes: kept as
    surrogate escapes)."""
    return [p for p in data.decode("utf-8", "surrogateescape").split("\0") if p]


def parse_oid_ref_lines(out: str, sep: str = "\t") -> dict[str, str]:
    """``<oid><sep><ref>`` lines (``for-each-ref``, ``ls-remote``) -> {ref: oid}; ``ref: `` lines skipped."""
    found = {}
    for line in out.splitlines():
        oid, _, ref = line.partition(sep)
        if ref and not oid.startswith("ref: "):
            found[ref] = oid.strip()
    return found


def parse_ls_remote(out: str) -> tuple[dict[str, str], dict[str, str]]:
    """``ls-remote [--symref]`` output -> ({ref: oid}, {symbolic ref: its target})."""
    targets = {}
    for line in out.splitlines():
        left, _, right = line.partition("\t")
        if left.startswith("ref: ") and right:
            targets[right] = left[len("ref: ") :]
    return parse_oid_ref_lines(out), targets


def parse_worktree_list(out: str) -> list[dict[str, str]]:
    """``worktree list --porcelain -z`` -> one dict per worktree: each attribute ``key value`` (a bare
    ``key``: "")."""
    found: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    for item in out.split("\0"):
        if not item:
            if cur.get("worktree"):
                found.append(cur)
            cur = {}
            continue
        key, _, value = item.partition(" ")
        cur[key] = value
    return found


def parse_status_v2(out: str) -> list[StatusEntry]:
    """``status --porcelain=v2 -z`` -> StatusEntry each (header lines, ``#``, skipped). A path may hold
    spaces: the fixed fields before it are split off by count; a rename's source is the next item."""
    fields = {"1": 8, "2": 9, "u": 10}  # fields before the path
    items = out.split("\0")
    found = []
    i = 0
    while i < len(items):
        item = items[i]
        i += 1
        kind = item[:1]
        if kind in fields:
            parts = item.split(" ", fields[kind])
            if len(parts) <= fields[kind]:
                continue
            orig = None
            if kind == "2" and i < len(items):
                orig, i = items[i], i + 1
            found.append(StatusEntry(kind, parts[1], parts[-1], orig))
        elif kind in ("?", "!") and item[1:2] == " ":
            found.append(StatusEntry(kind, "", item[2:]))
    return found


def parse_ls_files_tags(out: str) -> list[tuple[str, str]]:
    """``ls-files -v -z`` -> (tag, path) each (``H`` cached, ``S`` skip-worktree, lower case: assume-unchanged)."""
    return [(item[0], item[2:]) for item in out.split("\0") if len(item) > 2 and item[1] == " "]


def parse_config_z(out: str) -> dict[str, str]:
    """``config -z --get-regexp`` -> {key: value} (the last value wins). ValueError for a key without a value."""
    return dict(item.split("\n", 1) for item in zsplit(out))


def commit_parents(body: bytes) -> tuple[str, ...]:
    """The parents a raw commit object names (its ``parent <oid>`` header lines), in order."""
    head = body.split(b"\n\n", 1)[0].split(b"\n")
    return tuple(line[len(b"parent ") :].decode("ascii", "replace") for line in head if line.startswith(b"parent "))


def parse_log_paths(out: bytes, oids: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``git log -z --format=%x00%H --name-only`` of exactly ``oids``, in that order -> (commit, paths) each.
    Each commit starts with an empty field (a path is never empty) and its id, then its paths: right after the
    id, the first one led by a newline; for a merge (``--cc``), after one more empty field. A field after an
    empty one starts the next commit only when it is that commit's id; anything else is a path of the one
    before (a path spelled like the next id lists that commit twice: the caller sees it, never a path lost).
    ValueError for what is not git's output."""
    found: list[tuple[str, list[str]]] = []
    after_empty, after_oid = True, False
    for tok in out.split(b"\0"):
        if not tok:
            after_empty, after_oid = True, False
            continue
        nxt = oids[len(found)] if len(found) < len(oids) else None
        if after_empty and (not found or tok == (nxt or "").encode()):
            oid = tok.decode("ascii", "replace")
            if not _is_oid(oid):
                raise ValueError("unexpected git log output")
            found.append((oid, []))
            after_empty, after_oid = False, True
            continue
        if after_oid and tok.startswith(b"\n"):
            tok = tok[1:]
        after_empty = after_oid = False
        if tok:
            found[-1][1].append(tok.decode("utf-8", "surrogateescape"))
    return found


OID_RE = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # SHA-1 or SHA-256, as git writes them
REF_RE = re.compile(r"[^\x00-\x20\x7f]+")  # a ref name has no space or control character (check-ref-format)


def parse_pre_push(data: bytes) -> list[tuple[str, str, str, str]]:
    """The pre-push hook's stdin: ``<local ref> SP <local oid> SP <remote ref> SP <remote oid> LF`` per ref.
    The local ref is whatever the user wrote (``:/fix bug``, ``HEAD^{/msg}``: spaces included), so the fields
    are taken from the right."""

    def fields(line: str) -> list[str] | None:
        parts = line.rsplit(" ", 3)
        ok = len(parts) == 4 and parts[0] and OID_RE.fullmatch(parts[1]) and OID_RE.fullmatch(parts[3])
        return parts if ok and REF_RE.fullmatch(parts[2]) else None

    got = _hook_input(data, fields, "<local ref> <local oid> <remote ref> <remote oid>")
    return [(p[0], p[1], p[2], p[3]) for p in got]


def parse_pre_receive(data: bytes) -> list[tuple[str, str, str]]:
    """The pre-receive hook's stdin: ``<old oid> SP <new oid> SP <ref name> LF`` per ref."""

    def fields(line: str) -> list[str] | None:
        parts = line.split(" ", 2)
        ok = len(parts) == 3 and OID_RE.fullmatch(parts[0]) and OID_RE.fullmatch(parts[1])
        return parts if ok and REF_RE.fullmatch(parts[2]) else None

    return [(p[0], p[1], p[2]) for p in _hook_input(data, fields, "<old oid> <new oid> <ref>")]


def _hook_input(data: bytes, fields: Callable[[str], list[str] | None], shape: str) -> list[list[str]]:
    """The lines of a hook's stdin, each split by ``fields``. Lines end at LF only (a ref name may hold U+2028
    or U+0085; ref names are bytes, not always UTF-8: kept as surrogate escapes). A line ``fields`` does not
    take is not what git gives: UsageError (exit 2) naming it, never skipped (a line skipped is a push not
    checked)."""
    out = []
    for number, line in enumerate(data.decode("utf-8", "surrogateescape").split("\n"), 1):
        if not line:
            continue
        parts = fields(line)
        if parts is None:
            raise UsageError(f"line {number} of the hook's input is not '{shape}' ({line[:80]!r}); refusing")
        out.append(parts)
    return out


def _is_oid(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)
