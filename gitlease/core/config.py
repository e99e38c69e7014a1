"""Settings: git config ``lease.*``, then environment, then flags, in that rising order."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gitlease.core.durations import seconds as _int
from gitlease.core.errors import ConfigError
from gitlease.core.modes import parse_mode

DEFAULT_TTL = 300
DEFAULT_SKEW = 30
DEFAULT_TIMEOUT = 30.0
# Build and test leftovers that never hold work: cleaned before a worktree is pooled (lease.worktree.disposable)
DISPOSABLE = (
    "__pycache__",
    "*.pyc",
    "*.pyo",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "node_modules/.cache",
)
LOCAL = "local"  # lease.remote / --remote value that chooses this repository's own refs on purpose
NO_STORE = (
    "lease.remote is not set and this repository has remotes: point it at the shared lease store "
    "('git lease init --remote origin'), or choose this repository's own refs on purpose "
    "('git config lease.remote local', or --remote local)"
)


@dataclass(frozen=True)
class Settings:
    remote: str | None
    ttl: int
    skew: int
    agent: str
    task: str
    timeout: float
    repo_name: str | None
    signing_key: str | None
    allowed_signers: str
    workspace: str | None
    # sweeping (docs/sweeping.md): each reclaim rule can be turned off; progressTimeout None: rule off
    sweep_expired: bool = True
    sweep_missed_heartbeats: bool = True
    sweep_dead_holder: bool = True
    progress_timeout: int | None = None
    enforce: str | None = None  # lease.enforce: strict | others | warn | off; None: the default rule (enforce.py)
    worktree_root: str | None = None  # lease.worktreeRoot: where attached worktrees go
    renew_agent: bool = True  # lease.renewAgent: hold() and git lease run renew through the per-host agent
    require_doctor: bool = False  # lease.requireDoctor: acquire refuses a store without a passing doctor verdict
    store_unset: bool = False  # no lease.remote and no --remote: the local store by default, not by choice
    # lease.worktree.disposable: ignored files a pooled worktree may lose (cleaned before pooling)
    worktree_disposable: tuple[str, ...] = ()
    task_timeout: int | None = None  # lease.taskTimeout: git lease work stops a task's command after this long
    prune_after: int = 30 * 86400  # lease.pruneAfter: git lease work --prune's default age of outcomes to delete


def _bool(name: str, value: str | None, default: bool) -> bool:
    """git's boolean spellings: true/false, yes/no, on/off, 1/0 (an empty value is true, as in git)."""
    if value is None:
        return default
    text = value.strip().lower()
    if text in ("", "true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def parse_duration(name: str, value: str, lo: int = 0, hi: int = 366 * 86400) -> int:
    """'300', '300s', '5m', '2h' -> seconds."""
    return _int(name, value, 0, lo, hi)


def resolve(config: Mapping[str, str], env: Mapping[str, str] | None = None, **flags: object) -> Settings:
    env = os.environ if env is None else env

    def pick(flag: str, key: str, env_name: str | None = None) -> str | None:
        val = flags.get(flag)
        if val is not None:
            return str(val)
        if env_name and env.get(env_name):
            return env[env_name]
        return config.get(key)

    remote = pick("remote", "lease.remote")
    store_unset = remote is None or remote.strip() == ""
    if remote is not None and remote.strip() in ("", LOCAL):
        remote = None
    agent = pick("agent", "lease.agent", "GITLEASE_AGENT") or default_agent(env)
    task = pick("task", "lease.task", "GITLEASE_TASK") or "manual"
    for label, text in (("agent", agent), ("task", task)):
        if len(text) > 200 or any(ord(c) < 0x20 for c in text):
            raise ConfigError(f"{label} id must be at most 200 printable characters")
    timeout = float(_int("lease.timeout", pick("timeout", "lease.timeout"), int(DEFAULT_TIMEOUT), 1, 3600))
    return Settings(
        remote=remote,
        ttl=_int("lease.ttl", pick("ttl", "lease.ttl"), DEFAULT_TTL, 5, 366 * 86400),
        skew=_int("lease.skew", pick("skew", "lease.skew"), DEFAULT_SKEW, 0, 3600),
        agent=agent,
        task=task,
        timeout=timeout,
        repo_name=pick("repo_name", "lease.repo"),
        signing_key=pick("signing_key", "lease.signingkey"),
        allowed_signers=pick("allowed_signers", "lease.allowedsignersfile") or ".gitlease/allowed_signers",
        workspace=pick("workspace", "lease.workspace"),
        sweep_expired=_bool("lease.sweep.expired", pick("sweep_expired", "lease.sweep.expired"), True),
        sweep_missed_heartbeats=_bool(
            "lease.sweep.missedHeartbeats", pick("sweep_missed_heartbeats", "lease.sweep.missedheartbeats"), True
        ),
        sweep_dead_holder=_bool("lease.sweep.deadHolder", pick("sweep_dead_holder", "lease.sweep.deadholder"), True),
        progress_timeout=_int(
            "lease.progressTimeout", pick("progress_timeout", "lease.progresstimeout"), 0, 0, 366 * 86400
        )
        or None,
        enforce=parse_mode(pick("enforce", "lease.enforce")),
        worktree_root=pick("worktree_root", "lease.worktreeroot"),
        renew_agent=_bool("lease.renewAgent", pick("renew_agent", "lease.renewagent", "GITLEASE_RENEW_AGENT"), True),
        store_unset=store_unset,
        require_doctor=_bool("lease.requireDoctor", pick("require_doctor", "lease.requiredoctor"), False),
        worktree_disposable=_patterns(pick("worktree_disposable", "lease.worktree.disposable")),
        task_timeout=_int("lease.taskTimeout", pick("task_timeout", "lease.tasktimeout"), 0, 0, 366 * 86400) or None,
        prune_after=_int("lease.pruneAfter", pick("prune_after", "lease.pruneafter"), 30 * 86400, 1, 3660 * 86400),
    )


def _patterns(value: str | None) -> tuple[str, ...]:
    """``lease.worktree.disposable``: patterns separated by spaces or commas; unset: DISPOSABLE; empty: none."""
    if value is None:
        return DISPOSABLE
    return tuple(p for p in value.replace(",", " ").split() if p)


def default_agent(env: Mapping[str, str] | None = None, uid: int | None = None, host: str | None = None) -> str:
    """``<user>@<host>``: the user's name from ``$USER``, ``$LOGNAME`` or the password database; the host's name
    alone where the uid has no name (a container run as a uid without a passwd entry). Never ``uid0``: root
    in a container is ``root@<host>``."""
    env = os.environ if env is None else env
    host = host or os.uname().nodename or "localhost"
    name = env.get("USER") or env.get("LOGNAME")
    if not name:
        import pwd

        try:
            name = pwd.getpwuid(os.getuid() if uid is None else uid).pw_name
        except KeyError:
            name = None
    return f"{name}@{host}" if name else host
