"""The fenced push with the scope check in front of it: what ``git lease push`` (and the queue runner, and the
MCP tool) call to land a branch under a lease.

``fenced_push(svc, remote, refspecs, lease_id)``:

1. resolves each refspec the way ``git push`` reads one for a branch (``HEAD:main``, ``src:dst``,
   ``refs/heads/x``, a bare branch name; never ``+``, never a delete) into the commit it pushes and the branch
   it updates on the remote;
2. lists every path of every commit the push would land on each branch: the commits the branch gains relative
   to its value on the remote now (a new branch: relative to the remote's default branch), as the pre-push
   hook and the server hook judge them (``gitlease.enforce.verify.touched_paths``);
3. applies the hooks' rule (``gitlease.enforce.rules.check``, ``lease.enforce`` as for the hooks): every path
   inside the lease it fences with, outside every other live lease of the store, read now (fail closed);
   a violation raises ScopeViolation (exit 4) naming each path and its holder, and nothing is pushed;
4. pushes exactly the commits it checked (by object id) and the lease's renewal in one atomic push
   (``LeaseService.push_fenced``): a lease lost meanwhile lands nothing (LeaseLost, exit 6); a branch the
   server refuses (a hook, a protected branch, not a fast-forward) raises PushRejected with the server's own
   reason lines in ``details["server"]``.

Library code: raises gitlease errors, returns a ``PushResult``, prints nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gitlease.core import gitcmd, gitq
from gitlease.core.errors import LeaseLost, NotHeld, RemoteUnavailable, ScopeViolation, UsageError
from gitlease.enforce import rules as enforce
from gitlease.enforce.verify import _mine_from_held, others_lookup, touched_paths
from gitlease.service.leases import LeaseService
from gitlease.service.views import Snapshot

BRANCHES = "refs/heads/"


@dataclass(frozen=True)
class Target:
    """One refspec, resolved: the commit pushed, the branch it updates, and what its commits are judged
    against (the branch's value on the remote, or for a new branch the remote's default branch)."""

    spec: str  # as given
    src: str  # the source as a name (``refs/heads/feat``, ``HEAD``, an oid...)
    oid: str  # the commit pushed
    dst: str  # the full ref name on the remote (refs/heads/...)
    old: str | None  # its value on the remote before the push; None: a new branch
    base: str | None  # the commit the push is judged against; None: nothing (every commit of src)

    @property
    def refspec(self) -> str:
        """What is pushed: the checked commit itself, so the branch cannot move between check and push."""
        return f"{self.oid}:{self.dst}"

    def to_json(self) -> dict[str, object]:
        return {"refspec": self.spec, "src": self.src, "oid": self.oid, "dst": self.dst, "old": self.old}


@dataclass
class PushResult:
    lease_id: str
    remote: str
    targets: list[Target]
    version: int
    expires_at: str
    mode: str  # strict | others | warn | off: the rule that was applied (lease.enforce)
    commits: int
    paths: list[str]
    warnings: list[str] = field(default_factory=list)  # lease.enforce=warn: what strict would have refused

    def to_json(self) -> dict[str, object]:
        first = self.targets[0]
        return {
            "leaseId": self.lease_id,
            "remote": self.remote,
            "refspec": f"{first.src}:{first.dst}",
            "targets": [t.to_json() for t in self.targets],
            "version": self.version,
            "expiresAt": self.expires_at,
            "mode": self.mode,
            "commits": self.commits,
            "paths": self.paths,
            "warnings": self.warnings,
        }


# ----------------------------------------------------------------------------------- refspecs


def parse_refspec(cwd: str, spec: str) -> tuple[str, str]:
    """(source name, destination full ref) of a push refspec for a branch, as ``git push`` reads it:
    ``SRC:DST`` (DST without ``refs/`` is a branch), ``refs/heads/x`` or ``x`` alone (the same name on the
    remote), ``HEAD`` alone (the current branch, same name). UsageError for ``+``, deletes, tags and other
    namespaces."""
    if spec.startswith("-"):
        raise UsageError(f"refspec {spec!r} starts with '-'")
    if not spec or spec.startswith("+"):
        raise UsageError(f"refspec {spec!r}: a fenced push is a normal (fast-forward) push: drop the '+'")
    src, colon, dst = spec.partition(":")
    if colon and not src:
        raise UsageError(f"refspec {spec!r}: a fenced push does not delete branches")
    if colon and not dst:
        raise UsageError(f"refspec {spec!r}: name the branch to update after the ':'")
    full = gitq.symbolic_full_name(cwd, src)
    if not colon:
        if full is None or not full.startswith(BRANCHES):
            if src == "HEAD":
                raise UsageError("HEAD is detached: name the branch to update (git lease push REMOTE HEAD:BRANCH)")
            raise UsageError(f"refspec {spec!r}: {src!r} is not a local branch; give SRC:BRANCH")
        dst = full
    elif not dst.startswith("refs/"):
        dst = BRANCHES + dst
    if full is not None and src != "HEAD":
        src = full
    if not dst.startswith(BRANCHES):
        raise UsageError(f"refspec {spec!r}: a fenced push updates branches (refs/heads/...), not {dst}")
    if not gitq.valid_ref_name(cwd, dst):
        raise UsageError(f"refspec {spec!r}: {dst!r} is not a valid branch name")
    return src, dst


def _commit(cwd: str, src: str, spec: str) -> str:
    oid = gitq.rev_parse_commit(cwd, src)
    if oid is None:
        raise UsageError(f"refspec {spec!r}: {src!r} is not a commit here")
    return oid


def remote_heads(svc: LeaseService, remote: str, refs: Sequence[str]) -> tuple[dict[str, str], str | None]:
    """({ref: oid} of ``refs`` on ``remote`` now, the commit of the remote's default branch or None)."""
    try:
        listed = gitq.ls_remote(svc.repo.cwd, remote, "HEAD", *refs, symref=True, timeout=svc.settings.timeout)
    except gitcmd.Timeout as exc:
        raise RemoteUnavailable(f"remote {remote!r} did not answer: {exc}") from None
    if not listed.ok:
        raise RemoteUnavailable(f"cannot read remote {remote!r}: {listed.err.strip().splitlines()[-1:] or ''}")
    return {r: o for r, o in listed.refs.items() if r in refs and r != "HEAD"}, listed.refs.get("HEAD")


def resolve_targets(svc: LeaseService, remote: str, refspecs: Sequence[str]) -> list[Target]:
    """Each refspec resolved against this repository and the remote (whose objects it fetches when needed,
    so the commits can be told apart)."""
    cwd = svc.repo.cwd
    if not refspecs:
        raise UsageError("nothing to push: give a branch or SRC:DST")
    parsed = []
    for spec in refspecs:
        src, dst = parse_refspec(cwd, spec)
        parsed.append((spec, src, _commit(cwd, src, spec), dst))
    dsts = [d for _, _, _, d in parsed]
    if len(set(dsts)) != len(dsts):
        raise UsageError("two refspecs update the same branch")
    olds, head = remote_heads(svc, remote, dsts)
    wanted = sorted({o for o in [*olds.values(), head] if o})
    if wanted:
        svc.store.ensure_objects(wanted)  # the store is this remote (check_fence): fetched by oid
    out = []
    for spec, src, oid, dst in parsed:
        old = olds.get(dst)
        base = old if old is not None else head
        if base is not None and not gitq.is_commit(cwd, base):
            base = head if base != head and head is not None and gitq.is_commit(cwd, head) else None
        out.append(Target(spec, src, oid, dst, old, base))
    return out


def landing(cwd: str, targets: Sequence[Target]) -> tuple[list[str], int]:
    """(every path the push would land, sorted; the number of commits): per branch, the commits it gains
    relative to its own base."""
    paths: set[str] = set()
    commits: set[str] = set()
    for t in targets:
        exclude = [t.base] if t.base else []
        paths.update(touched_paths(cwd, [t.oid], exclude))
        commits.update(gitq.rev_list(cwd, [t.oid], exclude))
    return sorted(paths), len(commits)


# ------------------------------------------------------------------------------------ the push


def check_landing(
    svc: LeaseService,
    lease_id: str,
    paths: Sequence[str],
    snap: Snapshot | None = None,
) -> tuple[str, list[enforce.Violation], list[str]]:
    """(mode, violations, warning lines) of ``paths`` pushed under ``lease_id``: the hooks' rule, with the
    fencing lease as the only lease of the writer. ``lease.enforce`` applies as for the hooks (unset:
    strict, since the pusher holds a lease). ``snap``: the store read just now for these paths and this
    worktree's leases (at least), judged instead of reading it again."""
    configured = svc.settings.enforce
    mode = enforce.effective_mode(configured, True)
    if mode == "off" or not paths:
        return mode, [], []
    check_mode = "strict" if mode == "warn" else mode
    # RemoteUnavailable: nothing is pushed (fail closed). Only the leases bearing on these paths, and ours.
    if snap is None:
        snap = svc.snapshot(use_cache=False, paths=paths, keep=svc.held_here())
    now = svc.clock.now()
    mine = [m for m in _mine_from_held(svc, snap) if m.lease_id == lease_id]
    if not mine:  # forgotten here since the caller looked (its heartbeat found it lost): never "held by" itself
        raise LeaseLost(f"lease lost: {lease_id} is no longer held by this worktree; nothing was pushed (stop writing)")
    lost = next((m.problem for m in mine if m.problem), None)
    if lost:  # the push would be refused as a whole anyway: say it is the lease that is gone
        raise LeaseLost(f"lease lost or replaced: {lease_id} {lost}; nothing was pushed (stop writing)")
    violations = enforce.check(
        paths,
        mine,
        check_mode,
        now,
        others_lookup(snap, {m.lease_id for m in mine if m.problem is None}, now, svc.settings.skew),
        who="this push",
    )
    if mode == "warn":
        if not violations:
            return mode, [], []
        return mode, [], enforce.refusal("push", check_mode, violations, warn=True, mine=f"lease {lease_id}")
    return mode, violations, []


def fenced_push(
    svc: LeaseService,
    remote: str,
    refspecs: Sequence[str],
    lease_id: str,
    *,
    ttl: int | None = None,
    also: Sequence[str] = (),
    within: Sequence[str] | None = None,
) -> PushResult:
    """Check every commit the push would land, then push the branches and renew ``lease_id`` in one atomic
    push (module docstring). ``also``: more ``OID:REF`` refspecs outside ``refs/heads/`` (fast-forwards, never
    ``+``) landed in the same atomic push (the queue runner's task outcome: gitlease.service.outcomes).
    ``within``: scopes every landed path must also lie in (the queue runner's task scope: a lease extended
    mid-task lands no more than its task declared), whatever the lease holds now.
    Raises UsageError (exit 2), NotHeld, ScopeViolation (exit 4), LeaseLost (6),
    PushRejected (1, the server's reasons in ``details["server"]``), RemoteUnavailable (1)."""
    svc.check_fence(remote)
    if lease_id not in svc.held_here():
        raise NotHeld(f"lease {lease_id} is not held by this worktree ({svc.repo.cwd})")
    targets = resolve_targets(svc, remote, refspecs)
    paths, commits = landing(svc.repo.cwd, targets)
    mode, violations, warnings = check_landing(svc, lease_id, paths)
    if within is not None and mode != "off":
        violations = violations + _outside(paths, within, {v.path for v in violations})
    if violations:
        _refuse(lease_id, mode, violations, targets)
    got = svc.push_fenced(lease_id, remote, [t.refspec for t in targets] + list(also), ttl=ttl)
    return PushResult(
        lease_id=lease_id,
        remote=remote,
        targets=targets,
        version=got.record.version,
        expires_at=got.record.expires_at,
        mode=mode,
        commits=commits,
        paths=paths,
        warnings=warnings,
    )


def check_task_landing(
    svc: LeaseService,
    remote: str,
    lease_id: str,
    head: str,
    base: str | None,
    *,
    within: Sequence[str] | None = None,
    snap: Snapshot | None = None,
    paths: Sequence[str] | None = None,
) -> list[str]:
    """The check ``fenced_push`` makes, for one commit of a landing that pushes several (the queue runner's
    landing train, which pushes the branch and every task's renewal itself): every path of the commits ``head``
    brings over ``base`` (None: over the remote's default branch) must lie in ``lease_id`` as the store has it,
    outside every other live lease, and in ``within`` when given. Returns those paths; raises ScopeViolation (exit
    4) or LeaseLost (exit 6), as ``fenced_push`` does, and nothing is pushed. ``snap``: the train's one read of
    the store for all its riders' paths and leases, judged instead of reading it again; ``paths``: those the
    commits touch, when the caller has them already (``landing_paths``)."""
    svc.check_fence(remote)
    if lease_id not in svc.held_here():
        raise LeaseLost(f"lease lost: {lease_id} is no longer held by this worktree; nothing was pushed (stop writing)")
    if base is None:
        _olds, base = remote_heads(svc, remote, [])
    paths = landing_paths(svc, head, base) if paths is None else list(paths)
    mode, violations, _warnings = check_landing(svc, lease_id, paths, snap)
    if within is not None and mode != "off":
        violations = violations + _outside(paths, within, {v.path for v in violations})
    if violations:
        target = Target(head, head, head, "refs/heads/?", None, base)
        _refuse(lease_id, mode, violations, [target])
    return paths


def landing_paths(svc: LeaseService, head: str, base: str | None) -> list[str]:
    """Every path the commits ``head`` brings over ``base`` touch (in ``svc``'s worktree), sorted."""
    return sorted(touched_paths(svc.repo.cwd, [head], [base] if base else []))


def _outside(paths: Sequence[str], within: Sequence[str], seen: set[str]) -> list[enforce.Violation]:
    """A violation for each path outside ``within`` (and not refused already)."""
    why = f"outside the task's own scope ({' '.join(within)}; --allow-extend lets it grow)"
    return [
        enforce.Violation(p, enforce.suggest_scope(p), why)
        for p in paths
        if p not in seen and enforce.covering(within, p) is None
    ]


def _refuse(lease_id: str, mode: str, violations: list[enforce.Violation], targets: Sequence[Target]) -> None:
    lines = enforce.refusal("push", mode, violations, mine=f"lease {lease_id}")
    n = len(violations)
    shown = "; ".join(f"{enforce.show_path(v.path)} ({v.reason})" for v in violations[:10])
    more = f"; and {n - 10} more" if n > 10 else ""
    details = {
        "violations": [v.to_json() for v in violations],
        "lines": lines,
        "targets": [t.to_json() for t in targets],
        "mode": mode,
    }
    plural = "s" if n != 1 else ""
    message = f"push refused, nothing pushed: {n} path{plural} may not be pushed under {lease_id}: {shown}{more}"
    if enforce.exit_code(violations) == 6:
        raise LeaseLost(message, **details)
    raise ScopeViolation(message, **details)


# ---------------------------------------------------------------------------------- defaults


def push_defaults(cwd: str, remote: str | None, refspecs: Sequence[str] | None) -> tuple[str, list[str]]:
    """What ``git push`` would push when told less: the current branch to the same name, to that branch's
    push remote (``branch.B.pushRemote``, ``remote.pushDefault``, ``branch.B.remote``, else ``origin``)."""
    specs = list(refspecs or []) or [current_branch(cwd)]
    first = specs[0].lstrip("+").partition(":")[0] or specs[0]
    return remote or push_remote(cwd, _short_branch(cwd, first)), specs


def current_branch(cwd: str) -> str:
    branch = gitq.current_branch(cwd)
    if branch is None:
        raise UsageError("HEAD is detached: name the branch to push (git lease push REMOTE BRANCH)")
    return branch


def push_remote(cwd: str, branch: str) -> str:
    for key in (f"branch.{branch}.pushRemote", "remote.pushDefault", f"branch.{branch}.remote"):
        value = gitq.config_get(cwd, key)
        if value:
            return value
    return "origin"


def _short_branch(cwd: str, src: str) -> str:
    """The local branch name a push source names (for its push remote), or the source as given."""
    if src.startswith("-"):
        return src
    full = gitq.symbolic_full_name(cwd, src) or ""
    return full.removeprefix("refs/heads/") if full.startswith("refs/heads/") else src


__all__ = [
    "fenced_push",
    "PushResult",
    "Target",
    "parse_refspec",
    "resolve_targets",
    "landing",
    "check_landing",
    "check_task_landing",
    "push_defaults",
    "push_remote",
    "current_branch",
]
