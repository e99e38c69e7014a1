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


class UntrustedWriter(InvalidRecord):
    """This client would write what every reader reports INVALID: the store's trust file does not trust its key
    (or its lack of one) for its agent id. Refused before anything is written."""

    kind = "untrusted-writer"


class LeaseLost(GitLeaseError):
    """The lease changed, vanished or expired under its holder: stop writing."""

    exit_code = LOST
    kind = "lost"

    @staticmethod
    def cause(reason: str, lease_id: str = "") -> str:
        """The bare cause of a loss, without the "lease lost: ID:" prefixes and "(stop writing)" suffixes that
        each layer adds (the agent, the delegate, the heartbeat), so the final message says it once."""
        text = reason.strip()
        prefixes = [f"lease lost: {lease_id}: "] if lease_id else []
        while True:
            before = text
            for prefix in prefixes:
                if text.startswith(prefix):
                    text = text[len(prefix) :]
            if text.endswith(" (stop writing)"):
                text = text[: -len(" (stop writing)")]
            if text == before:
                return text

    @classmethod
    def of(cls, lease_id: str, reason: str, **details: object) -> LeaseLost:
        """ "lease lost: ID: CAUSE (stop writing)", the cause stripped of what earlier layers added (and said
        once: a cause that already starts "lease lost" is not prefixed again)."""
        return cls(f"{cls.say(lease_id, reason)} (stop writing)", leaseId=lease_id, **details)

    @classmethod
    def say(cls, lease_id: str, reason: str) -> str:
        """ "lease lost: ID: CAUSE", or the cause alone when it already starts "lease lost"."""
        text = cls.cause(reason, lease_id)
        return text if text.startswith("lease lost") else f"lease lost: {lease_id}: {text}"


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


class Interrupted(GitLeaseError):
    """Stopped by the user (Ctrl-C): what ran was wound down and every lease released (exit 130)."""

    exit_code = INTERRUPTED
    kind = "interrupted"


class TasksFailed(GitLeaseError):
    """``git lease work`` finished, and some tasks failed (their outcomes and kept work are on the store)."""

    kind = "tasks-failed"


class DoctorFailed(GitLeaseError):
    """``git lease doctor`` found a check that failed: the remote (or this set-up) cannot safely host leases."""

    kind = "doctor-failed"
