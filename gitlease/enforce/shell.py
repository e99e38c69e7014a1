"""What an agent's shell command changed, judged by the leases: ``git-lease-hook pre-shell`` and ``post-shell``.

    git-lease-hook pre-shell     # the agent's pre-tool hook on its shell tool: a snapshot, keyed by the call id
    git-lease-hook post-shell    # its post-tool hook: what the command changed, compared with the snapshot

The snapshot (``<git dir>/gitlease/shell/<call id>``, ``marshal``) holds what ``git status`` lists (each path
with its stat), HEAD, the stash, the fence (the agents' hook settings, git's hooks, ``lease.enforce`` and
``core.hooksPath``). After the command, post-shell reports only what the command changed: paths outside the
leases (worktree changes, commits, stashes), a ``held.json`` that lists paths the store does not grant; and it
puts back any part of the fence the command changed or removed, and says so. The report goes to the model as
additional context next to the command's output (JSON on stdout, exit 0): the output is never replaced. The
command has run: this cannot undo it; the commit hook, the fenced push and the server hook still refuse it.

pre-shell also refuses (exit 2) a shell command carrying a Codex ``apply_patch`` patch that writes outside the
leases, as pre-edit would. Standard library only, as the rest of the guard.
"""

from __future__ import annotations

import os

from gitlease.core.errors import GitLeaseError
from gitlease.enforce import guard
from gitlease.enforce import rules as enforce

# the fence's files, relative to a worktree's top and to the home folder (the system-wide ones are not written
# by an agent's shell command: root only)
HOME_FENCE = tuple(sorted(f for f in guard.FENCE_FILES if f.startswith(".")))
WATCHED_CONFIG = ("lease.enforce", "core.hookspath")
LIMIT = 50


# ----------------------------------------------------------------------------- reading


def _git(args: list[str], root: str) -> bytes:
    from gitlease.enforce import entry

    rc, out = entry._git(args, cwd=root)
    if rc != 0:
        raise GitLeaseError(f"cannot read the worktree (git {args[0]} failed)")
    return out


def status(root: str) -> dict:
    """{path: (status letters, mtime, size, inode)} of every path ``git status`` lists (untracked included)."""
    out = _git(["status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all"], root)
    got = {}
    for item in enforce.zsplit(out):
        if len(item) <= 3:
            continue
        path = item[3:]
        try:
            st = os.lstat(os.path.join(root, path))
            got[path] = (item[:2], st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            got[path] = (item[:2], 0, -1, 0)
    return got


def fence_files(root: str, gdir: str) -> list[str]:
    """Absolute paths of what keeps the fence up: every agent's hook settings in the worktree and the home
    folder, and git's hooks (those not ending in .sample)."""
    home = os.path.expanduser("~")
    out = [os.path.join(root, p) for p in HOME_FENCE] + [os.path.join(home, p) for p in HOME_FENCE]
    hooks = os.path.join(enforce.common_dir(gdir), "hooks")
    try:
        out += [os.path.join(hooks, n) for n in sorted(os.listdir(hooks)) if not n.endswith(".sample")]
    except OSError:
        pass
    return sorted(set(out))


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def watched_config(root: str) -> dict[str, str]:
    from gitlease.enforce import entry

    pattern = "^(" + "|".join(k.replace(".", r"\.") for k in WATCHED_CONFIG) + ")$"
    rc, out = entry._git(["config", "--local", "-z", "--get-regexp", pattern], cwd=root)
    cfg = {}
    for item in out.decode("utf-8", "surrogateescape").split("\0"):
        if item:
            key, _, value = item.partition("\n")
            cfg[key.lower()] = value
    return cfg


def head_and_stash(gdir: str) -> tuple[str | None, str | None]:
    from gitlease.enforce import entry

    refs = entry.RefView(enforce.common_dir(gdir), {})
    head = (read_bytes(os.path.join(gdir, "HEAD")) or b"").decode("utf-8", "replace").strip()
    if head.startswith("ref: "):
        head = refs.get(head[5:].strip()) or ""
    return (head or None), refs.get("refs/stash")


def snapshot(root: str, gdir: str) -> dict:
    fence = {p: read_bytes(p) for p in fence_files(root, gdir)}
    head, stash = head_and_stash(gdir)
    return {"status": status(root), "fence": fence, "config": watched_config(root), "head": head, "stash": stash}


# ----------------------------------------------------------------------------- storing


def call_key(doc: dict) -> str:
    """The tool call's id (Claude Code, Codex: ``tool_use_id``), else one made of the session and command."""
    for key in ("tool_use_id", "tool_call_id", "call_id"):
        val = doc.get(key)
        if isinstance(val, str) and val:
            raw = val
            break
    else:
        tool_input = doc.get("tool_input")
        command = tool_input.get("command") if isinstance(tool_input, dict) else None
        raw = f"{doc.get('session_id')}:{command}"
        import hashlib

        raw = hashlib.sha1(raw.encode("utf-8", "surrogateescape")).hexdigest()
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in raw)[:120]


def snapshot_path(gdir: str, key: str) -> str:
    return os.path.join(gdir, "gitlease", "shell", key)


def save(path: str, snap: dict) -> None:
    import marshal

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(marshal.dumps(snap))
    os.replace(tmp, path)


def take(path: str) -> dict | None:
    """The snapshot saved for this call (removed: each is read once), or None."""
    import marshal

    data = read_bytes(path)
    if data is None:
        return None
    try:
        os.unlink(path)
    except OSError:
        pass
    try:
        snap = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return None
    return snap if isinstance(snap, dict) else None


# ------------------------------------------------------------------------------ hooks


def worktree_of(doc: dict) -> tuple[str, str] | None:
    """(worktree top, its git dir) of the payload's cwd, or None outside every worktree."""
    place = guard.locate(os.path.realpath(guard.payload_cwd(doc)), folder=True)
    if place.root is None:
        return None
    gdir = guard.worktree_git_dir(place.root)
    return (place.root, gdir) if gdir else None


def pre_shell(data: bytes, now: float) -> guard.Outcome:
    """Before a shell command: refuse a patch it carries that writes outside the leases; take the snapshot."""
    doc = guard.parse_payload(data)
    tool_input = doc.get("tool_input")
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    if isinstance(command, str) and "*** Begin Patch" in command:
        paths = guard.patch_paths(command)
        if paths:
            got = guard.judge(paths, guard.payload_cwd(doc), now)
            if got.refused:
                return guard.Outcome(guard.REFUSE, got.refused + got.warned)
    where = worktree_of(doc)
    if where is None:
        return guard.Outcome()
    root, gdir = where
    save(snapshot_path(gdir, call_key(doc)), snapshot(root, gdir))
    return guard.Outcome()


def post_shell(data: bytes, now: float) -> guard.Outcome:
    """After a shell command: what it changed outside the leases, and the fence put back, as context for the
    model next to the command's output (JSON on stdout, exit 0)."""
    doc = guard.parse_payload(data)
    where = worktree_of(doc)
    if where is None:
        return guard.Outcome()
    root, gdir = where
    before = take(snapshot_path(gdir, call_key(doc)))
    lines = restore_fence(root, gdir, before)
    lines += judge_changes(root, gdir, before, now)
    if not lines:
        return guard.Outcome()
    event = doc.get("hook_event_name")
    event = event if isinstance(event, str) else "PostToolUse"
    return guard.Outcome(0, [], stdout=context_json(event, "\n".join(lines)))


def restore_fence(root: str, gdir: str, before: dict | None) -> list[str]:
    """Put back each fence file and watched config key the command changed (the gravest finding)."""
    if before is None:
        return []
    put_back = []
    for path, old in sorted(before.get("fence", {}).items()):
        if read_bytes(path) == old:
            continue
        from gitlease.core.fsutil import put_file  # only when a fence file must be put back: not on every hook run

        put_file(path, old)
        put_back.append(enforce.show_path(os.path.relpath(path, root) if path.startswith(root + os.sep) else path))
    old_cfg, now_cfg = before.get("config", {}), watched_config(root)
    from gitlease.enforce import entry

    for key in WATCHED_CONFIG:
        if old_cfg.get(key) != now_cfg.get(key):
            args = ["config", "--local", key, old_cfg[key]] if key in old_cfg else ["config", "--local", "--unset", key]
            entry._git(args, cwd=root)
            put_back.append(f"git config {key}")
    if not put_back:
        return []
    return [
        f"gitlease: this command changed what keeps the leases enforced ({', '.join(put_back)}); gitlease put it "
        "back as it was. Agents may not change or delete hook settings, git hooks or lease settings."
    ]


def judge_changes(root: str, gdir: str, before: dict | None, now: float) -> list[str]:
    """Lines for the paths the command changed outside the leases: in the worktree, in commits HEAD gained, in
    a new stash; and for a held.json listing paths the store does not grant."""
    after = status(root)
    old = before.get("status", {}) if before is not None else {}
    changed = {p for p, st in after.items() if old.get(p) != st and not guard.is_fence_file(p)}
    kinds = {p: "changed" for p in changed}
    if before is not None:
        head, stash = head_and_stash(gdir)
        if head and before.get("head") and head != before["head"]:
            for p in diff_paths(root, before["head"], head):
                kinds.setdefault(p, "committed")
        if stash and stash != before.get("stash"):
            for p in diff_paths(root, f"{stash}^1", stash):
                kinds.setdefault(p, "stashed")
    verdict = guard.check_worktree(root, sorted(kinds), now)
    if verdict.mode == "off":
        return []
    if verdict.error is not None:
        word = "warning (lease.enforce=warn): " if verdict.warn else ""
        return [f"gitlease: {word}the command's changes could not be checked: {verdict.error.message}"]
    lines = forged(verdict)
    rows = [(v, kinds.get(v.path, "changed")) for v in verdict.violations]
    if rows:
        lines += report_rows(rows, verdict, now)
    return lines


def diff_paths(root: str, old: str, new: str) -> list[str]:
    from gitlease.enforce import entry

    rc, out = entry._git(["diff", "--name-only", "--no-renames", "-z", old, new], cwd=root)
    return enforce.zsplit(out) if rc == 0 else []


def forged(verdict: guard.Verdict) -> list[str]:
    out = []
    for m in verdict.mine:
        if m.ungranted:
            listed = " ".join(enforce.show_path(p) for p in m.ungranted[:10])
            out.append(
                f"gitlease: this worktree's held.json lists {listed} under lease {m.lease_id}, which the lease store "
                "does not grant it (held.json was changed outside gitlease): those paths stay refused"
            )
    return out


def report_rows(rows: list, verdict: guard.Verdict, now: float) -> list[str]:
    n = len(rows)
    label = "warn" if verdict.warn else verdict.mode
    lines = [
        f"gitlease: this command changed {n} path{'s' if n != 1 else ''} outside what this worktree may write "
        f"(lease.enforce={label}); the commit hook and the push refuse {'them' if n != 1 else 'it'}:"
    ]
    for v, kind in rows[:LIMIT]:
        why, _ = guard.explain(v, verdict, now)
        lines.append(f"  {enforce.show_path(v.path)} ({kind}) {why}")
    if n > LIMIT:
        lines.append(f"  ... and {n - LIMIT} more")
    lines.append(guard.revert_hint(verdict, now))
    return lines


def context_json(event: str, text: str) -> str:
    """The agents' hook output that adds context for the model (Claude Code, Codex: PostToolUse; Gemini CLI:
    AfterTool), without replacing the tool's output. JSON written by hand: the ``json`` module costs more
    than the rest of the hook."""
    inner = f'"hookEventName": {json_string(event)}, "additionalContext": {json_string(text)}'
    return '{"hookSpecificOutput": {' + inner + "}}"


def json_string(s: str) -> str:
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif ord(c) < 0x20 or 0xD800 <= ord(c) <= 0xDFFF:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


__all__ = ["pre_shell", "post_shell", "snapshot", "context_json"]
