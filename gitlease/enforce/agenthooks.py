"""Installing the edit-time guard (gitlease/enforce/guard.py) into coding agents' hook settings, next to the
user's own hooks: ``git lease agent-hooks install|uninstall AGENT [--user]``.

Each agent gets a pre-tool hook on its file-editing tools (``git-lease-hook pre-edit``: exit 2 blocks the call
and its stderr goes to the model) and a post-tool hook on its shell tool (``git-lease-hook post-shell``: reports
changed paths outside the leases). Formats, from each agent's own documentation and source (docs/agents.md):

* claude (Claude Code): ``.claude/settings.json`` (``--user``: ``~/.claude/settings.json``); ``PreToolUse`` on
  Edit, Write, MultiEdit, NotebookEdit; ``PostToolUse`` on Bash.
* codex (Codex CLI): ``.codex/hooks.json`` (``~/.codex/hooks.json``); ``PreToolUse`` on apply_patch (Codex
  also matches it as Edit and Write); ``PostToolUse`` on Bash.
* gemini (Gemini CLI): ``.gemini/settings.json`` (``~/.gemini/settings.json``); ``BeforeTool`` on write_file
  and replace; ``AfterTool`` on run_shell_command.

All three read ``{"hooks": {EVENT: [{"matcher": REGEX, "hooks": [{"type": "command", "command": ...}]}]}}``.
Install merges: every other key, event, group and hook of the file is kept as it was; gitlease's own entries
(recognised by their command) are replaced, so installing twice changes nothing. Uninstall removes only them.
A project file is written at the top of the current worktree. A file that is not a JSON object is an error and
is left untouched.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass

from gitlease.core import gitq
from gitlease.core.errors import ConfigError, UsageError
from gitlease.core.fsutil import atomic_write

MARKERS = ("gitlease.enforce.entry", "gitlease/enforce/hookmain.py", "git-lease-hook ")
ACTIONS = ("pre-edit", "pre-shell", "post-shell")
# The agents' hook timeout (seconds): far above what the guard takes, and above its own deadline (entry.py:
# DEADLINE), so that the guard, never the agent's timer, decides (a timed-out hook lets the call through).
TIMEOUT = 120


@dataclass(frozen=True)
class Format:
    name: str
    title: str
    project: str  # relative to the worktree's top
    user: str  # relative to the home folder
    events: tuple[tuple[str, str, str], ...]  # (event, matcher, action)
    timeout: int  # in the unit the agent reads (seconds, or milliseconds for Gemini CLI)
    named: bool = False  # hook entries carry a "name" (Gemini CLI: /hooks enable|disable NAME)
    note: str = ""


AGENTS: dict[str, Format] = {
    "claude": Format(
        "claude",
        "Claude Code",
        ".claude/settings.local.json",  # the project's local settings: personal, not committed
        ".claude/settings.json",
        (
            ("PreToolUse", "Edit|Write|MultiEdit|NotebookEdit", "pre-edit"),
            ("PreToolUse", "Bash", "pre-shell"),
            ("PostToolUse", "Bash", "post-shell"),
        ),
        timeout=TIMEOUT,
    ),
    "codex": Format(
        "codex",
        "Codex CLI",
        ".codex/hooks.json",
        ".codex/hooks.json",
        (
            ("PreToolUse", "apply_patch|Edit|Write", "pre-edit"),
            ("PreToolUse", "Bash", "pre-shell"),
            ("PostToolUse", "Bash", "post-shell"),
        ),
        timeout=TIMEOUT,
        note="Codex runs project hooks only in a trusted project, and each hook only once you trust it (codex's "
        "/hooks); git lease agent-hooks status codex says whether they will run",
    ),
    "gemini": Format(
        "gemini",
        "Gemini CLI",
        ".gemini/settings.json",
        ".gemini/settings.json",
        (
            ("BeforeTool", "write_file|replace", "pre-edit"),
            ("BeforeTool", "run_shell_command", "pre-shell"),
            ("AfterTool", "run_shell_command", "post-shell"),
        ),
        timeout=TIMEOUT * 1000,
        named=True,
        note="Gemini CLI loads a project's hooks only in a trusted folder, never with --skip-trust; "
        "git lease agent-hooks status gemini says whether they will run",
    ),
}


@dataclass(frozen=True)
class Change:
    agent: str
    path: str
    action: str  # installed | updated | unchanged | removed | absent
    note: str = ""

    def to_json(self) -> dict[str, str]:
        return {"agent": self.agent, "path": self.path, "action": self.action, "note": self.note}


def package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hook_command(
    action: str, agent: str = "", *, portable: bool = False, python: str | None = None, root: str | None = None
) -> str:
    """The shell command an agent runs. Default: this Python, without site packages (``-S``), on the hooks'
    script; a refusing hook that cannot start (that Python gone) still refuses (``|| exit 2``: any other code
    lets the call through). ``portable``: ``git-lease-hook ACTION`` from PATH, for a settings file shared by
    people whose Python lives elsewhere (it pays the site start-up)."""
    tail = f"{action} {agent}".strip()
    if portable:
        cmd = f"git-lease-hook {tail}"
    else:
        script = os.path.join(root or package_root(), "gitlease", "enforce", "hookmain.py")
        cmd = f"{shlex.quote(python or sys.executable)} -S {shlex.quote(script)} {tail}"
    return cmd if action == "post-shell" else f"{cmd} || exit 2"


def is_ours(hook: object) -> bool:
    cmd = hook.get("command") if isinstance(hook, dict) else None
    return isinstance(cmd, str) and any(m in cmd for m in MARKERS) and any(a in cmd for a in ACTIONS)


def settings_path(agent: str, *, user: bool, cwd: str = ".") -> str:
    fmt = agent_format(agent)
    if user:
        return os.path.join(os.path.expanduser("~"), fmt.user)
    top = gitq.toplevel(cwd)
    if not top:
        raise UsageError(f"not inside a git worktree ({os.path.abspath(cwd)}): run it in one, or use --user")
    return os.path.join(top, fmt.project)


def agent_format(agent: str) -> Format:
    fmt = AGENTS.get(agent)
    if fmt is None:
        raise UsageError(
            f"unknown agent {agent!r}: one of {', '.join(AGENTS)} (any other agent: docs/agents.md has a recipe "
            "over git-lease-hook check-path)"
        )
    return fmt


def _load(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}); fix it first (nothing was changed)") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a JSON object; fix it first (nothing was changed)")
    hooks = doc.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise ConfigError(f'{path}: "hooks" is not an object; fix it first (nothing was changed)')
    return doc


def _strip(hooks: dict) -> bool:
    """Remove gitlease's hook entries (and the groups and events only they filled); True if any was there."""
    found = False
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):  # e.g. Gemini CLI's "disabled": [names]
            continue
        kept = []
        for group in groups:
            inner = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(inner, list) or not any(is_ours(h) for h in inner):
                kept.append(group)
                continue
            found = True
            rest = [h for h in inner if not is_ours(h)]
            if rest:
                kept.append(dict(group, hooks=rest))
        if kept:
            hooks[event] = kept
        else:
            del hooks[event]
    return found


def _write(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8"), mode=0o644)


def install(agent: str, *, user: bool = False, cwd: str = ".", portable: bool = False) -> Change:
    fmt = agent_format(agent)
    path = settings_path(agent, user=user, cwd=cwd)
    doc = _load(path)
    existed = doc is not None
    doc = doc or {}
    before = json.dumps(doc, sort_keys=True)
    hooks = dict(doc.get("hooks") or {})
    had = _strip(hooks)
    for event, matcher, action in fmt.events:
        entry: dict[str, object] = {"type": "command", "command": hook_command(action, agent, portable=portable)}
        if fmt.named:
            entry = {"name": f"gitlease-{action}", **entry, "description": f"gitlease: git-lease-hook {action}"}
        entry["timeout"] = fmt.timeout
        groups = hooks.get(event)
        hooks[event] = (groups if isinstance(groups, list) else []) + [{"matcher": matcher, "hooks": [entry]}]
    doc["hooks"] = hooks
    note = fmt.note if user else "; ".join(n for n in (fmt.note, keep_out_of_git(path, cwd)) if n)
    if json.dumps(doc, sort_keys=True) == before:
        return Change(agent, path, "unchanged", note)
    _write(path, doc)
    return Change(agent, path, "updated" if existed and had else "installed", note)


EXCLUDE_MARK = "# git lease agent-hooks: the agents' hook settings stay out of commits"


def keep_out_of_git(path: str, cwd: str) -> str:
    """Keep a project settings file the install wrote out of ``git status`` and ``git add -A``: a line in the
    repository's ``info/exclude`` (shared by its worktrees). A file git already tracks cannot be excluded:
    the returned note says so."""
    top = os.path.dirname(os.path.dirname(path))
    rel = os.path.relpath(path, top).replace(os.sep, "/")
    if gitq.is_tracked(top, rel):
        return f"{rel} is tracked by git: your change to it shows in git status (commit it, or use --user)"
    common = gitq.common_dir(top)
    exclude = os.path.join(common, "info", "exclude")
    try:
        with open(exclude, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        text = ""
    line = "/" + rel
    if line in text.splitlines():
        return ""
    os.makedirs(os.path.dirname(exclude), exist_ok=True)
    with open(exclude, "a", encoding="utf-8") as fh:
        fh.write(("" if not text or text.endswith("\n") else "\n") + f"{EXCLUDE_MARK}\n{line}\n")
    return ""


def uninstall(agent: str, *, user: bool = False, cwd: str = ".") -> Change:
    agent_format(agent)
    path = settings_path(agent, user=user, cwd=cwd)
    doc = _load(path)
    if doc is None or not isinstance(doc.get("hooks"), dict):
        return Change(agent, path, "absent")
    hooks = dict(doc["hooks"])
    if not _strip(hooks):
        return Change(agent, path, "absent")
    if hooks:
        doc["hooks"] = hooks
    else:
        del doc["hooks"]
    _write(path, doc)
    return Change(agent, path, "removed")


__all__ = ["AGENTS", "Change", "hook_command", "install", "uninstall", "settings_path", "is_ours"]


# ------------------------------------------------------------------------------ status

# Flags of each client's launcher that drop the hooks of a project install (docs/agents.md).
DROPPING_FLAGS = {
    "claude": ("--bare", "--safe-mode", "--setting-sources"),
    "codex": (),
    "gemini": ("--skip-trust",),
}


@dataclass(frozen=True)
class Status:
    agent: str
    active: bool
    where: str  # the settings file holding gitlease's hooks, or ""
    problems: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"agent": self.agent, "active": self.active, "where": self.where, "problems": list(self.problems)}


def _ours_in(path: str, fmt: Format) -> list[tuple[str, int, int, dict]]:
    """(event, group index, hook index, hook) of each gitlease hook in the settings file at ``path``."""
    try:
        doc = _load(path) or {}
    except ConfigError:
        return []
    out = []
    for event, groups in (doc.get("hooks") or {}).items():
        for gi, group in enumerate(groups if isinstance(groups, list) else []):
            for hi, hook in enumerate(group.get("hooks", []) if isinstance(group, dict) else []):
                if is_ours(hook):
                    out.append((event, gi, hi, hook))
    return out


def status(agent: str, *, cwd: str = ".") -> Status:
    """Whether gitlease's hooks will run for ``agent`` started in ``cwd``: installed (project or user), current
    (this install's command), and not switched off by the client's own trust gates or settings."""
    fmt = agent_format(agent)
    user = os.path.join(os.path.expanduser("~"), fmt.user)
    try:
        project = settings_path(agent, user=False, cwd=cwd)
    except UsageError:
        project = ""
    found = [(p, _ours_in(p, fmt)) for p in (project, user) if p]
    found = [(p, hooks) for p, hooks in found if hooks]
    if not found:
        return Status(agent, False, "", (f"not installed: git lease agent-hooks install {agent} (or --user)",))
    where, hooks = found[0]
    problems = []
    actions = {h["command"].split(" || ")[0].split()[-2] for _, _, _, h in hooks if h.get("command")}
    missing = [a for _, _, a in fmt.events if a not in actions]
    if missing:
        problems.append(f"{where} lacks {', '.join(missing)}: git lease agent-hooks install {agent} again")
    for _, _, _, h in hooks:
        cmd = str(h.get("command", "")).split(" || ")[0]
        if not cmd.startswith("git-lease-hook ") and not os.path.exists(shlex.split(cmd)[0]):
            problems.append(f"the hook's Python is gone ({shlex.split(cmd)[0]}): install the hooks again")
            break
    problems += GATES[agent](where, hooks, where != user)
    return Status(agent, not problems, where, tuple(problems))


def _claude_gates(where: str, hooks, project: bool) -> list[str]:
    home = os.path.join(os.path.expanduser("~"), ".claude")
    top = os.path.dirname(os.path.dirname(where)) if project else ""
    files = [os.path.join(home, "settings.json")]
    if top:
        files += [os.path.join(top, ".claude", n) for n in ("settings.json", "settings.local.json")]
    for f in files:
        try:
            if (_load(f) or {}).get("disableAllHooks") is True:
                return [f"{f} sets disableAllHooks: Claude Code runs no hook"]
        except ConfigError:
            continue
    return []


def _codex_gates(where: str, hooks, project: bool) -> list[str]:
    import tomllib

    home = os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    try:
        with open(os.path.join(home, "config.toml"), "rb") as fh:
            cfg = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError):
        cfg = {}
    problems = []
    top = os.path.dirname(os.path.dirname(where))
    projects = cfg.get("projects") or {}
    if project and (projects.get(top) or {}).get("trust_level") != "trusted":
        problems.append(f"Codex does not trust the project {top}: run codex there and trust it (or codex exec --trust)")
    states = ((cfg.get("hooks") or {}).get("state") or {}) if isinstance(cfg.get("hooks"), dict) else {}
    snake = {"PreToolUse": "pre_tool_use", "PostToolUse": "post_tool_use"}
    for event, gi, hi, _ in hooks:
        key = f"{where}:{snake.get(event, event)}:{gi}:{hi}"
        if not (states.get(key) or {}).get("trusted_hash"):
            problems.append(f"Codex has not trusted the hooks in {where}: review and trust them in codex's /hooks")
            break
    return problems


def _gemini_gates(where: str, hooks, project: bool) -> list[str]:
    home = os.path.join(os.path.expanduser("~"), ".gemini")
    try:
        user = _load(os.path.join(home, "settings.json")) or {}
    except ConfigError:
        user = {}
    if (user.get("hooksConfig") or {}).get("enabled") is False:
        return ["Gemini CLI's hooks are off (hooksConfig.enabled: false in ~/.gemini/settings.json)"]
    if not project:
        return []
    top = os.path.dirname(os.path.dirname(where))
    try:
        with open(os.path.join(home, "trustedFolders.json"), encoding="utf-8") as fh:
            trusted = json.load(fh)
    except (OSError, ValueError):
        trusted = {}
    ok = any(
        (v == "TRUST_FOLDER" and top == k)
        or (v == "TRUST_PARENT" and top.startswith(k.rstrip("/") + "/"))
        or (v == "TRUST_FOLDER" and top.startswith(k.rstrip("/") + "/"))
        for k, v in (trusted.items() if isinstance(trusted, dict) else [])
    )
    if not ok:
        return [f"Gemini CLI does not trust the folder {top}: trust it when gemini asks (never --skip-trust)"]
    return []


GATES = {"claude": _claude_gates, "codex": _codex_gates, "gemini": _gemini_gates}


def unfenced(argv: list[str], cwd: str = ".") -> str | None:
    """Why the agent command ``argv`` would run without gitlease's hooks (a known client whose hooks are not
    active, or a flag of its launcher that drops them), with the one-line fix; None when it is fenced or not a
    client gitlease knows."""
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name not in AGENTS:
        return None
    for flag in DROPPING_FLAGS[name]:
        if any(a == flag or a.startswith(flag + "=") for a in argv[1:]):
            return f"{name} {flag} runs without the project's hooks: drop {flag}, or install with --user"
    st = status(name, cwd=cwd)
    return None if st.active else f"{name} would run unfenced: {st.problems[0]}"
