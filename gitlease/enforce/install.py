"""Installing and removing gitlease's git hooks, next to whatever hooks are already there.

The hooks go where git looks for them: ``git rev-parse --git-path hooks``, which follows ``core.hooksPath``
(absolute, or relative to the worktree) and, in a linked worktree, the common git dir (hooks are shared by
all worktrees of a repository). A hook already there that is not gitlease's is moved aside to
``<name>.gitlease-legacy`` and run first by gitlease's hook (its failure fails the commit or push); uninstall
puts it back. Not ``.legacy``: the pre-commit framework moves hooks there itself and would overwrite ours.
Re-installing is idempotent. The scripts are the files in the top-level ``hooks/`` folder of the source tree
(installed with the wheel as data files under ``<prefix>/share/gitlease/hooks``).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass

from gitlease.core import gitq
from gitlease.core.errors import GitLeaseError, UsageError
from gitlease.core.fsutil import atomic_write

CLIENT_HOOKS = ("pre-commit", "pre-push")
SERVER_HOOKS = ("pre-receive",)
LEGACY_SUFFIX = ".gitlease-legacy"
MARKER = b"(gitlease-hook v"


@dataclass(frozen=True)
class HookChange:
    name: str
    path: str
    action: str  # installed | updated | unchanged | removed | restored | absent | foreign
    legacy: str | None = None  # the hook kept aside (install) or put back (uninstall)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "path": self.path, "action": self.action, "legacy": self.legacy}


def package_root() -> str:
    """The folder that holds the ``gitlease`` package (what the hook puts on ``sys.path``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def template_dir() -> str:
    """Where the hook scripts are: the source tree's ``hooks/`` (a checkout or an editable install), else
    the wheel's data files."""
    import site
    import sysconfig

    candidates = [
        os.path.join(package_root(), "hooks"),
        os.path.join(sys.prefix, "share", "gitlease", "hooks"),
        os.path.join(sysconfig.get_path("data"), "share", "gitlease", "hooks"),
        os.path.join(site.USER_BASE or "", "share", "gitlease", "hooks"),
    ]
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "pre-commit")) and os.path.isfile(os.path.join(folder, "pre-push")):
            return folder
    raise GitLeaseError("gitlease's hook scripts are not installed (looked in " + ", ".join(candidates) + ")")


def hooks_dir(cwd: str = ".") -> str:
    found = gitq.git_path(cwd, "hooks")
    if found is None:
        raise UsageError(f"not a git repository: {os.path.abspath(cwd)}")
    return found


def render(name: str, *, python: str | None = None, root: str | None = None) -> bytes:
    with open(os.path.join(template_dir(), name), "rb") as fh:
        text = fh.read().decode("utf-8")
    text = text.replace("@PYTHON@", shlex.quote(python or sys.executable))
    text = text.replace("@ROOT@", shlex.quote(root or package_root()))
    return text.encode("utf-8")


def is_ours(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return MARKER in fh.read(4096)
    except OSError:
        return False


def _write(path: str, data: bytes) -> None:
    atomic_write(path, data, mode=0o755)


def install(cwd: str = ".", names=CLIENT_HOOKS, *, python: str | None = None) -> list[HookChange]:
    folder = hooks_dir(cwd)
    os.makedirs(folder, exist_ok=True)
    changes = []
    for name in names:
        path = os.path.join(folder, name)
        legacy = path + LEGACY_SUFFIX
        data = render(name, python=python)
        if os.path.lexists(path) and is_ours(path):
            with open(path, "rb") as fh:
                same = fh.read() == data
            if not same:
                _write(path, data)
            changes.append(
                HookChange(name, path, "unchanged" if same else "updated", legacy if os.path.lexists(legacy) else None)
            )
            continue
        kept = None
        if os.path.lexists(path):
            if os.path.lexists(legacy):
                raise GitLeaseError(
                    f"cannot install {name}: {path} is not gitlease's hook and {legacy} already "
                    "exists; move one of them away first (nothing was changed)"
                )
            os.replace(path, legacy)
            kept = legacy
        _write(path, data)
        changes.append(HookChange(name, path, "installed", kept))
    return changes


def uninstall(cwd: str = ".", names=CLIENT_HOOKS) -> list[HookChange]:
    folder = hooks_dir(cwd)
    changes = []
    for name in names:
        path = os.path.join(folder, name)
        legacy = path + LEGACY_SUFFIX
        if not os.path.lexists(path):
            if os.path.lexists(legacy):  # someone removed ours by hand: put theirs back
                os.replace(legacy, path)
                changes.append(HookChange(name, path, "restored", path))
            else:
                changes.append(HookChange(name, path, "absent"))
            continue
        if not is_ours(path):
            changes.append(HookChange(name, path, "foreign", legacy if os.path.lexists(legacy) else None))
            continue
        os.unlink(path)
        if os.path.lexists(legacy):
            os.replace(legacy, path)
            changes.append(HookChange(name, path, "restored", path))
        else:
            changes.append(HookChange(name, path, "removed"))
    return changes
