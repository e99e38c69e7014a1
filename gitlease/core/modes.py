"""``lease.enforce``: the enforcement modes, read by the configuration and by the hooks.

Standard library only, and cheap: the pre-commit hook imports it on every commit.
"""

from __future__ import annotations

from gitlease.core.errors import ConfigError

MODES = ("strict", "others", "warn", "off")


def parse_mode(value: str | None) -> str | None:
    """``lease.enforce`` -> one of MODES, or None when unset. Anything else is a ConfigError."""
    if value is None or value.strip() == "":
        return None
    mode = value.strip().lower()
    if mode not in MODES:
        raise ConfigError(f"lease.enforce must be one of {', '.join(MODES)}, not {value[:40]!r}")
    return mode


def effective_mode(configured: str | None, holds_any: bool) -> str:
    """The mode that applies. Unset ``lease.enforce``: ``strict`` in a worktree that holds (or held, and
    its lease expired) a lease, ``others`` in any other worktree. A worktree attached by gitlease's worktree
    manager has ``lease.enforce=strict`` in its per-worktree config (``git config --worktree``)."""
    if configured is not None:
        return configured
    return "strict" if holds_any else "others"
