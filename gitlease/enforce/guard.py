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
# Tools that only read: never refused, whatever path they name.
READ_TOOLS = frozenset(
    {
        "Read",
        "NotebookRead",
        "Glob",
        "Grep",
        "LS",
        "WebFetch",
        "WebSearch",
        "read_file",
        "read_many_files",
        "list_directory",
        "glob",
        "search_file_content",
        "grep_search",
        "web_fetch",
        "google_web_search",
    }
)
READ_EVENTS = frozenset({"beforeReadFile"})  # Cursor
PATCH_HEADERS = ("*** Add File:", "*** Update File:", "*** Delete File:", "*** Move to:")
GIT_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY")

REFUSE = 2  # what an agent's hook runner treats as "block, and tell the model why" (stderr)
CHECK_REFUSED = 4  # check-path: the pre-commit hook's code for a path that may not be written


class Outcome:
    """What the entry prints (to stderr) and the exit code."""

    __slots__ = ("code", "lines", "stdout")

    def __init__(self, code: int = 0, lines=(), stdout: str = "") -> None:
        self.code, self.lines, self.stdout = code, list(lines), stdout


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
    for line in patch.splitlines():
        line = line.strip()  # Codex's parser trims each header line: leading spaces and tabs too
        for head in PATCH_HEADERS:
            if line.startswith(head) and line[len(head) :].strip():
                out.append(line[len(head) :].strip())
    return out


# ------------------------------------------------------------------------------- paths

# The agents' own hook settings: what keeps the fence up. No agent edits them (pre-edit refuses, post-shell puts
# them back); matched by their last two path components, wherever they are.
FENCE_FILES = frozenset(
    {
        ".claude/settings.json",
        ".claude/settings.local.json",
        ".codex/hooks.json",
        ".codex/config.toml",
        ".gemini/settings.json",
        ".cursor/hooks.json",
        "claude-code/managed-settings.json",
        "gemini-cli/settings.json",
    }
)


def is_fence_file(path: str) -> bool:
    head, _, name = path.rpartition("/")
    return f"{head.rpartition('/')[2]}/{name}" in FENCE_FILES


def is_git_dir(d: str) -> bool:
    """Whether ``d`` is a git directory (git's own test, in short: a HEAD, and objects and refs or, for a linked
    worktree's, a commondir): a bare repository, a ``.git`` folder, a worktree's admin folder."""
    j = os.path.join
    if not os.path.isfile(j(d, "HEAD")):
        return False
    return os.path.isfile(j(d, "commondir")) or (os.path.isdir(j(d, "objects")) and os.path.isdir(j(d, "refs")))


def worktree_git_dir(top: str) -> str | None:
    """The git dir of the worktree whose top is ``top``: its ``.git`` folder, or where its ``.git`` file points,
    if that is a real git dir (as git finds repositories: an empty ``.git`` folder is no repository)."""
    dot = os.path.join(top, ".git")
    if os.path.isdir(dot):
        return dot if is_git_dir(dot) else None
    try:
        with open(dot, encoding="utf-8") as fh:
            first = fh.readline().strip()
    except OSError:
        return None
    if not first.startswith("gitdir: "):
        return None
    target = os.path.normpath(os.path.join(top, first[len("gitdir: ") :]))
    return target if is_git_dir(target) else None


class Place:
    """Where an absolute path lies: in a worktree (``root``, ``rel``), inside a git directory (``git``: a
    ``.git`` folder, a bare repository such as a lease store), or outside every repository (both None)."""

    __slots__ = ("root", "rel", "git")

    def __init__(self, root: str | None = None, rel: str = "", git: str | None = None) -> None:
        self.root, self.rel, self.git = root, rel, git


def locate(path: str, *, folder: bool = False) -> Place:
    """The Place of ``path`` (absolute, taken as it is: callers resolve it first), found from the folder it is
    in (``folder``: from itself) upwards."""
    here = path if folder else os.path.dirname(path)
    while True:
        if worktree_git_dir(here) is not None:
            rel = os.path.relpath(path, here)
            rel = "." if rel == os.curdir else rel.replace(os.sep, "/")
            if inside_git_dir(rel):
                return Place(git=os.path.join(here, ".git"))
            return Place(here, rel)
        if is_git_dir(here):
            return Place(git=here)
        parent = os.path.dirname(here)
        if parent == here:
            return Place()
        here = parent


def inside_git_dir(rel: str) -> bool:
    return any(part == ".git" for part in rel.split("/"))


class Target:
    """One path an edit writes: as the client reads it (``lexical``: joined to the cwd and normalised without
    following links, as the agents do) and the file the kernel then writes (``real``: links followed)."""

    __slots__ = ("given", "lexical", "real", "lex_place", "real_place")

    def __init__(self, given: str, cwd: str) -> None:
        self.given = given
        self.lexical = os.path.normpath(os.path.join(cwd, given))  # an absolute path stays itself
        self.real = os.path.realpath(self.lexical)
        self.real_place = locate(self.real)
        self.lex_place = self.real_place if self.real == self.lexical else locate(self.lexical)

    def shown(self) -> str:
        p = self.lex_place if self.lex_place.root else self.real_place
        return enforce.show_path(p.rel if p.root else self.lexical)

    def refusal(self) -> str | None:
        """Why the path is refused whatever the leases say (a git directory, the fence's own files), or None."""
        if self.real_place.git or self.lex_place.git:
            where = self.real_place.git or self.lex_place.git or ""
            return f"is inside a git directory ({enforce.show_path(where)}: git's own files); leave it alone"
        if is_fence_file(self.lexical) or is_fence_file(self.real):
            return "is an agent's hook settings (what keeps the leases enforced); agents may not change it"
        return None


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

    def cover(self, rel: str, now: float) -> str | None:
        """The scope of this worktree's current lease that holds ``rel`` (as ``lease scope``), or None."""
        for m in self.mine:
            s = enforce.covering(m.paths, rel) if m.usable(now) else None
            if s is not None:
                return f"{m.lease_id} {s}"
        return None


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
        v.mine = entry.narrow_to_store(v.mine, lookup)
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


class Checked:
    """Every path of one tool call judged: lines refusing, lines warning."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self.warned: list[str] = []


def judge(
    paths: list[str], cwd: str, now: float, prefix: str = "edit refused: ", what: str = "edit", raises: bool = False
) -> Checked:
    """Judge the files ``paths`` (relative to ``cwd``) write: git directories and the fence's files always
    refused; the rest by the leases of the worktree each is in, the path as the client reads it and the file
    it writes (through links) both, and refused when the two lie in different scopes. ``raises``: a worktree
    that cannot be checked raises its error (check-path's exit codes) instead of a refusal line."""
    out = Checked()
    targets = [Target(p, cwd) for p in paths]
    by_root: dict[str, list[str]] = {}
    for t in targets:
        why = t.refusal()
        if why is not None:
            out.refused.append(f"gitlease: {prefix}{t.shown()} {why}")
            continue
        for place in (t.lex_place, t.real_place):
            if place.root is not None and place.rel != "." and place.rel not in by_root.get(place.root, ()):
                by_root.setdefault(place.root, []).append(place.rel)
    verdicts = {}
    for root, rels in by_root.items():
        verdict = verdicts[root] = check_worktree(root, rels, now)
        if raises and verdict.error is not None and not verdict.warn:
            raise verdict.error
        report(verdict, now, out, prefix, what)
    for t in targets:
        if t.lexical != t.real and t.refusal() is None and disagree(t, verdicts, now):
            real = enforce.show_path(t.real_place.rel or t.real)
            out.refused.append(
                f"gitlease: {prefix}{t.shown()} writes {real} through a symbolic link, in another scope than its "
                f"own path; edit {real} by its own path, or leave it alone"
            )
    return out


def disagree(t: Target, verdicts: dict, now: float) -> bool:
    """Whether a path written through a link lies in another scope (worktree, or lease of it) than the path as
    given. A link out of every repository writes nothing gitlease guards: no disagreement."""
    real, lex = t.real_place, t.lex_place
    if real.root is None:
        return False
    if lex.root is None or os.path.realpath(lex.root) != os.path.realpath(real.root):
        return True
    v = verdicts.get(real.root)
    return v is None or v.cover(lex.rel, now) != v.cover(real.rel, now)


def report(verdict: Verdict, now: float, out: Checked, prefix: str, what: str) -> None:
    """One worktree's verdict as lines: an error (fail closed unless warn), and each violation."""
    warn = "gitlease: warning (lease.enforce=warn): "
    if verdict.error is not None:
        if verdict.warn:
            out.warned.append(f"{warn}{what} not checked: {verdict.error.message}")
        else:
            out.refused.append(f"gitlease: {prefix}{verdict.error.message}")
        return
    for v in verdict.violations:
        why, todo = explain(v, verdict, now)
        line = f"{enforce.show_path(v.path)} {why}; {todo}"
        if verdict.warn:
            out.warned.append(f"{warn}{what} of {line}")
        else:
            out.refused.append(f"gitlease: {prefix}{line}")


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


# ------------------------------------------------------------------------------ commands


def pre_edit(data: bytes, now: float) -> Outcome:
    """The agent's pre-tool hook: refuse (exit 2, one line per path) an edit the leases do not allow. A read
    is never refused."""
    doc = parse_payload(data)
    if doc.get("tool_name") in READ_TOOLS or doc.get("hook_event_name") in READ_EVENTS:
        return Outcome()
    paths = edited_paths(doc)
    if not paths:
        if doc.get("tool_name") in EDIT_TOOLS:
            raise GitLeaseError(f"cannot tell which file the {doc.get('tool_name')} call writes (no file_path)")
        return Outcome()
    got = judge(paths, payload_cwd(doc), now)
    return Outcome(REFUSE if got.refused else 0, got.refused + got.warned)


def revert_hint(verdict: Verdict, now: float) -> str:
    outside = [v.path for v in verdict.violations if v.holder is None and v.reason.startswith("not leased by")]
    usable = [m for m in verdict.mine if m.usable(now)]
    scopes = " ".join(f"--scope {enforce.show_path(p)}" for p in outside[:10])
    hint = "gitlease: undo those changes (git checkout -- PATH, or remove a file the command created)"
    if outside and len(usable) == 1:
        hint += f", or extend the lease: git lease extend {usable[0].lease_id} {scopes}"
    elif outside and usable:
        hint += f", or extend one of your leases: git lease extend LEASE {scopes}"
    elif outside:
        hint += f", or acquire them: git lease acquire {scopes}"
    return hint


def check_path(paths: list[str], now: float) -> Outcome:
    """``check-path PATH...`` (relative to the current folder): exit 0 when each may be written (this
    worktree's, or free and allowed by lease.enforce, or outside every repository), 4 when one may not."""
    got = judge(paths, os.getcwd(), now, prefix="refused: ", what="write", raises=True)
    return Outcome(CHECK_REFUSED if got.refused else 0, got.refused + got.warned)


__all__ = ["Outcome", "pre_edit", "check_path", "locate", "judge", "edited_paths", "patch_paths"]
