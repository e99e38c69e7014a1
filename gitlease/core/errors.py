"""One small error base; every error a user can cause maps to an exit code here.

Only the CLI and the hook entry turn these into messages and exit codes.
"""

from __future__ import annotations

# Exit codes: the one table (docs/cli.md repeats it).
OK = 0
ERROR = 1
USAGE = 2
HELD = 3
SCOPE_VIOLATION = 4
INVALID = 5
LOST = 6
INTERRUPTED = 130


class GitLeaseError(Exception):
    """Base of every error gitlease raises on purpose. ``str(err)`` is a one-line message."""

    exit_code = ERROR
    kind = "error"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class UsageError(GitLeaseError):
    exit_code = USAGE
    kind = "usage"


class ScopeError(UsageError):
    """A scope argument that is not a valid repository path prefix."""

    kind = "invalid-scope"


class ConfigError(GitLeaseError):
    kind = "config"


class GitError(GitLeaseError):
    """A git command failed in a way we did not expect."""

    kind = "git"

    def __init__(
        self,
        message: str,
        *,
        cmd: list[str] | None = None,
        returncode: int | None = None,
        stdout: str = "",
        stderr: str = "",
    ) -> None:
        super().__init__(message, cmd=cmd, returncode=returncode)
        self.cmd = cmd or []
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


class RemoteUnavailable(GitLeaseError):
    """The lease store could not be reached (or did not answer in time): writes fail closed."""

    kind = "remote-unavailable"


class HeldError(GitLeaseError):
    """The scope is held by someone else."""

    exit_code = HELD
    kind = "held"


class ScopeViolation(GitLeaseError):
    exit_code = SCOPE_VIOLATION
    kind = "scope-violation"


class InvalidRecord(GitLeaseError):
    """A lease record, ref or signature that does not verify."""

    exit_code = INVALID
    kind = "invalid"


class LeaseLost(GitLeaseError):
    """The lease changed, vanished or expired under its holder: stop writing."""

    exit_code = LOST
    kind = "lost"


class PushRejected(GitLeaseError):
    """A fenced push refused for a reason of its own (not fast-forward, a hook): nothing landed, and the
    lease is intact."""

    kind = "push-rejected"


class NotHeld(GitLeaseError):
    """This worktree does not hold the lease it was asked to act on."""

    kind = "not-held"


class Forbidden(GitLeaseError):
    """The key in use may not do this (a forced release or a live reclaim needs a ``gitlease-admin`` key)."""

    kind = "forbidden"


class DoctorFailed(GitLeaseError):
    """``git lease doctor`` found a check that failed: the remote (or this set-up) cannot safely host leases."""

    kind = "doctor-failed"
