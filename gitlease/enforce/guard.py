"""The edit-time guard: a coding agent's file edit is checked against the leases before the file is written.

    git-lease-hook pre-edit          # an agent's pre-tool hook payload (JSON) on stdin; exit 2 refuses
    git-lease-hook post-shell        # after a shell tool: changed or new paths outside the leases; exit 2
    git-lease-hook check-path PATH...  # for any other agent or script; exit 4 refuses

The rule is the pre-commit hook's (gitlease/enforce/rules.py), with the same readers (the worktree's
``held.json``, the repository's lease refs or the last fetched listing): an edit is refused exactly when a
commit of that path would be. Which worktree's leases count is decided by where the file is (through
symlinks: what is written is the target), so an agent editing a file of another worktree meets that
worktree's leases; a file outside every repository is not gitlease's business; a file inside a ``.git``
folder is always refused (no agent needs to edit git's own files, and a hook or a ref written there would
get around every check).

Fail closed: an error (unreadable payload, corrupt lease state, git failing) refuses the edit, unless
``lease.enforce`` is ``warn`` or ``off`` in the repository concerned. Payload formats: Claude Code
(``tool_input.file_path`` / ``notebook_path``, ``cwd``), Codex CLI (``apply_patch``: ``tool_input.command`` holds
the patch, whose ``*** Add/Update/Delete File:`` and ``*** Move to:`` lines name the paths), Gemini CLI
(``tool_input.file_path``), and a top-level ``file_path`` / ``workspace_roots`` (Cursor's file events);
docs/agents.md.

Speed: this runs on every edit an agent makes. Standard library only, and little of it, as the pre-commit
hook (gitlease/enforce/entry.py): one ``git config`` per repository, ``held.json``, and the lease refs (or
their cached listing) only when a path needs them. Pure apart from the files and git calls it reads; it
prints nothing: the entry prints what it returns.
"""

from __future__ import annotations

import os

from gitlease.core.errors import GitLeaseError
from gitlease.enforce import rules as enforce

# Tools that write the file their payload names: a payload of one of these without a path is refused.
EDIT_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit", "apply_patch", "write_file", "replace"})
PATH_KEYS = ("file_path", "notebook_path", "path")
PATCH_HEADERS = ("*** Add File: ", "*** Update File: ", "*** Delete File: ", "*** Move to: ")
GIT_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY")

REFUSE = 2  # what an agent's hook runner treats as "block, and tell the model why" (stderr)
CHECK_REFUSED = 4  # check-path: the pre-commit hook's code for a path that may not be written


class Outcome:
    """What the entry prints (to stderr) and the exit code."""

    __slots__ = ("code", "lines")

    def __init__(self, code: int = 0, lines=()) -> None:
        self.code, self.lines = code, list(lines)


# ----------------------------------------------------------------------------- payloads


def parse_payload(data: bytes) -> dict:
    try:
        doc = enforce.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict):
        raise GitLeaseError("the hook's input is not a JSON object (is this hook wired to an agent's tool hook?)")
    return doc


def payload_cwd(doc: dict) -> str:
    cwd = doc.get("cwd")
    if isinstance(cwd, str) and cwd:
        return cwd
    roots = doc.get("workspace_roots")
    if isinstance(roots, list) and roots and isinstance(roots[0], str):
        return roots[0]
    return os.getcwd()


def edited_paths(doc: dict) -> list[str]:
    """The paths an edit tool's payload names (as given: absolute, or relative to the payload's cwd)."""
    tool_input = doc.get("tool_input")
    out: list[str] = []
    if isinstance(tool_input, dict):
        for key in PATH_KEYS:
            val = tool_input.get(key)
            if isinstance(val, str) and val:
                out.append(val)
                break
        command = tool_input.get("command")
        if not out and doc.get("tool_name") == "apply_patch" and isinstance(command, str):
            out += patch_paths(command)
    val = doc.get("file_path")
    if not out and isinstance(val, str) and val:
        out.append(val)
    return out


def patch_paths(patch: str) -> list[str]:
    """Every path a Codex ``apply_patch`` patch adds, updates, deletes or moves a file to."""
    out = []
    for line in patch.split("\n"):
        line = line.rstrip("\r")
        for head in PATCH_HEADERS:
            if line.startswith(head) and line[len(head) :].strip():
                out.append(line[len(head) :].strip())
    return out


# ------------------------------------------------------------------------------- paths


def locate(path: str, *, folder: bool = False) -> tuple[str, str] | None:
    """(worktree root, path relative to it) of the file ``path`` (absolute) writes: symlinks resolved (a
    missing tail is kept as it is), the root the nearest folder above it (or, ``folder``, at it) that has a
    ``.git``. None outside every git worktree."""
    real = os.path.realpath(path)
    here = real if folder else os.path.dirname(real)
    while True:
        if os.path.lexists(os.path.join(here, ".git")):
            rel = os.path.relpath(real, here)
            return here, ("." if rel == os.curdir else rel.replace(os.sep, "/"))
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def inside_git_dir(rel: str) -> bool:
    return any(part == ".git" for part in rel.split("/"))


# ------------------------------------------------------------------------------- checks


class Verdict:
    """The check of some paths of one worktree."""

    __slots__ = ("root", "mode", "violations", "mine", "warn", "error")

    def __init__(self, root: str) -> None:
        self.root = root
        self.mode = "others"
        self.violations: list = []
        self.mine: list = []
        self.warn = False
        self.error: GitLeaseError | None = None


def check_worktree(root: str, rels: list[str], now: float) -> Verdict:
    """Check ``rels`` (paths relative to the worktree at ``root``) as the pre-commit hook would check them
    staged there. Errors are kept in the verdict: the caller fails closed unless the mode says otherwise."""
    from gitlease.enforce import entry

    v = Verdict(root)
    for var in GIT_ENV:  # they would point git at another repository than the one the file is in
        os.environ.pop(var, None)
    try:
        os.chdir(root)
        gdir = entry.git_dir()
        cfg = entry.lease_config()
        configured = enforce.parse_mode(cfg.get("lease.enforce"))
    except GitLeaseError as exc:
        v.error = exc
        return v
    if configured == "off":
        v.mode = "off"
        return v
    v.warn = configured == "warn"
    try:
        v.mine = enforce.load_held(os.path.join(gdir, "gitlease", "held.json"))
        mode = enforce.effective_mode(configured, bool(v.mine))
        v.mode = "others" if mode == "warn" and not v.mine else ("strict" if mode == "warn" else mode)
        lookup = entry.LocalLookup(gdir, cfg, v.mine, now, read_records)
        v.violations = enforce.check(rels, v.mine, v.mode, now, lookup, who="this worktree")
    except GitLeaseError as exc:
        v.error = exc
    except (OSError, ValueError) as exc:
        v.error = GitLeaseError(f"{type(exc).__name__}: {exc}")
    return v


def read_records(oids) -> dict:
    """{oid: record dict or None}: the few records a refusal names, one ``git cat-file`` each, parsed without
    ``json`` (the pre-commit hook's reader imports ``subprocess`` and ``json``: tens of ms on every refusal)."""
    from gitlease.enforce import entry

    out: dict = {}
    for oid in sorted(oids):
        rc, data = entry._git(["cat-file", "blob", f"{oid}:lease.json"])
        try:
            out[oid] = enforce.loads(data.decode("utf-8")) if rc == 0 else None
        except (ValueError, UnicodeDecodeError):
            out[oid] = None
    return out


def group(paths: list[str], cwd: str) -> tuple[dict[str, list[str]], list[str]]:
    """{worktree root: [relative paths]} of the files ``paths`` write, and the paths inside a .git folder."""
    by_root: dict[str, list[str]] = {}
    in_git: list[str] = []
    for p in paths:
        found = locate(os.path.join(cwd, p))  # an absolute p stays itself
        if found is None:
            continue  # outside every repository: not gitlease's business
        root, rel = found
        if inside_git_dir(rel):
            in_git.append(rel)
            continue
        if rel != ".":
            by_root.setdefault(root, []).append(rel)
    return by_root, in_git


def explain(v, verdict: Verdict, now: float) -> tuple[str, str]:
    """(why a path is refused, what to do), for a model to act on."""
    path = enforce.show_path(v.path)
    if v.holder is not None:
        scope = enforce.show_path(v.scope)
        return (
            f"is {v.holder.describe()} on {scope}",
            f"leave the file alone (git lease can-start --scope {scope} says when it is free)",
        )
    if v.reason.startswith("not leased by"):
        usable = [m for m in verdict.mine if m.usable(now)]
        if len(usable) == 1:
            m = usable[0]
            return (
                f"is outside this worktree's leases ({m.lease_id}: {' '.join(m.paths)})",
                f"to edit it, run git lease extend {m.lease_id} --scope {path}, or leave the file alone",
            )
        if usable:
            ids = " ".join(m.lease_id for m in usable)
            return (
                f"is outside this worktree's leases ({ids})",
                f"to edit it, run git lease extend LEASE --scope {path} (one of {ids}), or leave the file alone",
            )
        return (
            "is outside this worktree's leases (it holds none that is current)",
            f"to edit it, run git lease acquire --scope {path}, or leave the file alone",
        )
    return (f"({v.reason})", "stop writing, and acquire the lease again (git lease status shows what is held)")


def _mode_label(verdict: Verdict) -> str:
    return "warn" if verdict.warn else verdict.mode


# ------------------------------------------------------------------------------ commands


def pre_edit(data: bytes, now: float) -> Outcome:
    """The agent's pre-tool hook: refuse (exit 2, one line per path) an edit the leases do not allow."""
    doc = parse_payload(data)
    paths = edited_paths(doc)
    if not paths:
        if doc.get("tool_name") in EDIT_TOOLS:
            raise GitLeaseError(f"cannot tell which file the {doc.get('tool_name')} call writes (no file_path)")
        return Outcome()
    by_root, in_git = group(paths, payload_cwd(doc))
    lines = [
        f"gitlease: edit refused: {enforce.show_path(p)} is inside a .git folder (git's own files); leave it alone"
        for p in in_git
    ]
    warnings: list[str] = []
    for root, rels in by_root.items():
        verdict = check_worktree(root, rels, now)
        if verdict.error is not None:
            if verdict.warn:
                warnings.append(f"gitlease: warning (lease.enforce=warn): edit not checked: {verdict.error.message}")
                continue
            lines.append(f"gitlease: edit refused: {verdict.error.message}")
            continue
        for v in verdict.violations:
            why, todo = explain(v, verdict, now)
            line = f"{enforce.show_path(v.path)} {why}; {todo}"
            if verdict.warn:
                warnings.append(f"gitlease: warning (lease.enforce=warn): edit of {line}")
            else:
                lines.append(f"gitlease: edit refused: {line}")
    if lines:
        return Outcome(REFUSE, lines + warnings)
    return Outcome(0, warnings)


def changed_paths(root: str) -> list[str]:
    """Paths of the worktree at ``root`` that differ from HEAD (staged or not), new (not ignored) or deleted."""
    from gitlease.enforce import entry

    rc, out = entry._git(["status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all"], cwd=root)
    if rc != 0:
        raise GitLeaseError("cannot list the worktree's changes (git status failed)")
    return sorted({item[3:] for item in enforce.zsplit(out) if len(item) > 3})


def post_shell(data: bytes, now: float) -> Outcome:
    """After a shell tool: every changed or new path of the worktree that the leases do not allow, reported
    (exit 2) so that the model reverts it or extends its lease. The command has run: this cannot undo it."""
    doc = parse_payload(data)
    found = locate(payload_cwd(doc), folder=True)
    if found is None:
        return Outcome()
    root = found[0]
    paths = changed_paths(root)
    in_git = [p for p in paths if inside_git_dir(p)]
    paths = [p for p in paths if not inside_git_dir(p)]
    if not paths and not in_git:
        return Outcome()
    verdict = check_worktree(root, paths, now)
    if verdict.error is not None:
        if verdict.warn:
            return Outcome(0, [f"gitlease: warning (lease.enforce=warn): changes not checked: {verdict.error.message}"])
        return Outcome(REFUSE, [f"gitlease: the command's changes could not be checked: {verdict.error.message}"])
    rows = [(enforce.show_path(p), "is inside a .git folder (git's own files)", "") for p in in_git]
    for v in verdict.violations:
        why, todo = explain(v, verdict, now)
        rows.append((enforce.show_path(v.path), why, todo))
    if not rows:
        return Outcome()
    n = len(rows)
    head = (
        f"gitlease: after this command, {n} changed path{'s' if n != 1 else ''} of the worktree "
        f"{'lie' if n != 1 else 'lies'} outside what this worktree may write (lease.enforce={_mode_label(verdict)}):"
    )
    lines = [head] + [f"  {p} {why}" for p, why, _ in rows[:50]]
    if n > 50:
        lines.append(f"  ... and {n - 50} more")
    lines.append(_revert_hint(verdict, now))
    if verdict.warn:
        return Outcome(0, ["gitlease: warning (lease.enforce=warn): " + lines[0][len("gitlease: ") :]] + lines[1:-1])
    return Outcome(REFUSE, lines)


def _revert_hint(verdict: Verdict, now: float) -> str:
    outside = [v.path for v in verdict.violations if v.holder is None and v.reason.startswith("not leased by")]
    usable = [m for m in verdict.mine if m.usable(now)]
    scopes = " ".join(f"--scope {enforce.show_path(p)}" for p in outside[:10])
    hint = "gitlease: revert them (git checkout -- PATH; delete what is new)"
    if outside and len(usable) == 1:
        hint += f", or extend the lease: git lease extend {usable[0].lease_id} {scopes}"
    elif outside and usable:
        hint += f", or extend one of your leases: git lease extend LEASE {scopes}"
    elif outside:
        hint += f", or acquire them: git lease acquire {scopes}"
    return hint + "; the commit hook refuses them as they are"


def check_path(paths: list[str], now: float) -> Outcome:
    """``check-path PATH...`` (relative to the current folder): exit 0 when each may be written (this
    worktree's, or free and allowed by lease.enforce, or outside every repository), 4 when one may not."""
    by_root, in_git = group(paths, os.getcwd())
    lines = [f"gitlease: {enforce.show_path(p)} is inside a .git folder (git's own files): refused" for p in in_git]
    warnings: list[str] = []
    for root, rels in by_root.items():
        verdict = check_worktree(root, rels, now)
        if verdict.error is not None:
            if verdict.warn:
                warnings.append(f"gitlease: warning (lease.enforce=warn): not checked: {verdict.error.message}")
                continue
            raise verdict.error
        for v in verdict.violations:
            why, todo = explain(v, verdict, now)
            line = f"{enforce.show_path(v.path)} {why}; {todo}"
            (warnings if verdict.warn else lines).append(
                f"gitlease: warning (lease.enforce=warn): {line}" if verdict.warn else f"gitlease: refused: {line}"
            )
    return Outcome(CHECK_REFUSED if lines else 0, lines + warnings)


__all__ = ["Outcome", "pre_edit", "post_shell", "check_path", "locate", "edited_paths", "patch_paths"]
