"""Checks against the lease store itself: the pre-push hook and ``git lease verify`` (CI on a pull request).

Both take every path the commits in question touch (``git log --name-only --no-renames --cc``: deletions and
both sides of renames, and what a merge commit itself changes), read the store (``snapshot(use_cache=False)``:
an unreachable store or an unreadable record refuses, fail closed) and apply the rule of ``enforce.check``:
inside a lease the writer holds that is still current on the store, outside every other lease that is not
expired beyond the skew margin (invalid ones included).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from gitlease.core import gitq
from gitlease.core.errors import InvalidRecord, RemoteUnavailable, UsageError
from gitlease.enforce import rules as enforce
from gitlease.service.leases import LeaseService, Listing
from gitlease.service.views import LeaseView, Snapshot

ZERO_RE = re.compile(r"^0+$")
GITLEASE_REFS = ("refs/leases/", "refs/leases-audit/", "refs/leases-quarantine/")
LEASE_IN_TEXT = re.compile(r"(lease_[0-9a-z]{6,40})")
TRAILER = "Lease"  # commit trailer naming the lease a commit was made under: "Lease: lease_..."


touched_paths = gitq.touched_paths  # every path changed by the commits ``include`` reaches, ``exclude`` not


def holder(v: LeaseView, scope: str, now: float) -> enforce.Holder:
    """What a refusal names of the lease ``v`` holding ``scope``: its task, agent and time left, or why its
    record cannot be trusted."""
    if not v.valid or v.record is None:
        return enforce.Holder(v.lease_id, scope, invalid="; ".join(v.problems) or "unreadable")
    r = v.record
    return enforce.Holder(v.lease_id, scope, r.owner.task_id, r.owner.agent_id, int(r.expires - now))


def others_lookup(snap: Snapshot, mine_ids: set[str], now: float, skew: int):
    """``enforce.check``'s lookup from a fresh snapshot: {path: Holder} of other leases that still block."""
    blocking = [v for v in snap.leases if v.lease_id not in mine_ids and v.state(now, skew) != "expired"]
    first: dict[str, int] = {}  # scope -> the first blocking lease (in snapshot order) holding exactly it
    for k, v in enumerate(blocking):
        for s in v.paths:
            first.setdefault(s, k)

    def lookup(paths):
        """Each path's holder: the first blocking lease with a scope containing it, found by looking up the
        path's prefixes (``.``, ``a``, ``a/b``, ...: the only scopes that contain ``a/b/...``), not by a loop
        over every lease."""
        out = {}
        for p in paths:
            k = first.get(enforce.ROOT)
            i = p.find("/")
            while i >= 0:
                got = first.get(p[:i])
                if got is not None and (k is None or got < k):
                    k = got
                i = p.find("/", i + 1)
            got = first.get(p)
            if got is not None and (k is None or got < k):
                k = got
            if k is None:
                continue
            v = blocking[k]
            s = enforce.covering(v.paths, p)
            if s is None:
                continue
            out[p] = holder(v, s, now)
        return out

    return lookup


def _mine_from_held(svc: LeaseService, snap: Snapshot) -> list[enforce.Mine]:
    """This worktree's leases as the store has them. ``held.json`` says which leases are ours and may only
    narrow what they hold: the paths come from the lease's record on the store (verified with the snapshot on
    a signed store) and its scope refs (``LeaseView.granted``), the deadline from that record's stop deadline.
    A path the local file lists that the store does not grant is refused, and the refusal says so."""
    out = []
    for h in svc.held_here().values():
        view = snap.find(h.lease_id)
        problem = None
        paths: tuple[str, ...] = ()
        ungranted: tuple[str, ...] = ()
        deadline = h.expires_at
        if h.store != svc.store.name:
            problem = f"is on store {h.store!r}, not the configured {svc.store.name!r}"
        elif view is None:
            problem = "is gone from the lease store (released, or cleared and lost)"
        elif not view.valid or view.record is None:
            problem = "is invalid on the lease store: " + "; ".join(view.problems)
        elif view.current_oid not in (h.current, h.pending):
            problem = "was replaced on the lease store (lost)"
        else:
            granted = view.granted()
            paths = tuple(p for p in h.paths if enforce.covering(granted, p) is not None)
            ungranted = tuple(p for p in h.paths if enforce.covering(granted, p) is None)
            deadline = view.record.stop_by or view.record.expires_at
        if problem is not None:
            paths = tuple(h.paths)  # named in the refusal ("this worktree's lease ... is gone")
        out.append(enforce.Mine(h.lease_id, paths, deadline, h.grant, problem, ungranted))
    return out


# ------------------------------------------------------------------------------------ pre-push


def pre_push(
    remote: str, url: str, data: bytes, given: tuple[str, tuple[int, bool] | None] | None = None
) -> tuple[bool, list[str], int]:
    """The pre-push hook. Returns (allowed, lines for stderr, exit code). ``given``: the lease store's listing
    as the hook's lean path already read it (enforce/quickpush.py), read instead of listing again."""
    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo

    repo = Repo.discover(".")
    settings = resolve(repo.config)
    configured = settings.enforce
    if configured == "off":
        return True, [], 0
    svc = LeaseService(repo, settings)
    warn = configured == "warn"
    try:
        held = svc.held_here()
    except InvalidRecord as exc:
        return _refuse_or_warn(warn, f"push refused: {exc.message}", exc.exit_code)
    mode = enforce.effective_mode(configured, bool(held))
    check_mode = mode if mode in ("strict", "others") else ("strict" if held else "others")
    pushed = parse_push_lines(data)
    wiped = sorted(r for _l, local_oid, r, _o in pushed if ZERO_RE.match(local_oid) and r.startswith(GITLEASE_REFS))
    if wiped or _mirror_push(repo.cwd, remote):  # gitlease's own writes push without hooks: a person's push
        what = (
            f"deletes {len(wiped)} of gitlease's refs ({wiped[0]}{' ...' if len(wiped) > 1 else ''})"
            if wiped
            else ("is a mirror (or --prune) push, which deletes every lease the remote has and this clone lacks")
        )
        return _refuse_or_warn(
            warn,
            f"push refused: it {what}; leases are given back with git lease release and reclaimed by git lease "
            "sweep-stale (push branches by name)",
            4,
        )
    updates = [
        (local_oid, remote_ref, remote_oid)
        for _local_ref, local_oid, remote_ref, remote_oid in pushed
        if not ZERO_RE.match(local_oid) and not remote_ref.startswith(("refs/leases/", "refs/leases-audit/"))
    ]  # a delete touches no path; lease refs are checked by the server hook
    if not updates:
        return True, [], 0
    try:
        listed: list[Listing] = []  # the store's listing, read once, and only when needed

        def listing() -> Listing:
            if not listed:
                listed.append(svc.listing(given))
            return listed[0]

        # a push to the lease store itself: the one ls-remote that lists the lease refs answers its HEAD too;
        # no listing at all when nothing pushed is new to the remote and no path is gained (nothing is held)
        to_store = getattr(svc.store, "remote", None) in (remote, url)
        paths = paths_gained(repo.cwd, remote, updates, listing=listing if to_store else None)
        if not paths:
            return True, [], 0
        # only the leases bearing on these paths, and this worktree's (bearing.restrict_refs)
        snap = svc.snapshot(use_cache=False, paths=paths, keep=held, listing=listing() if to_store else None)
    except RemoteUnavailable as exc:
        return _refuse_or_warn(
            warn,
            f"push refused: cannot read the lease store ({exc.message}); refusing rather than guessing (fail closed)",
            exc.exit_code,
        )
    now = svc.clock.now()
    mine = _mine_from_held(svc, snap)
    usable_ids = {m.lease_id for m in mine if m.problem is None}
    violations = enforce.check(paths, mine, check_mode, now, others_lookup(snap, usable_ids, now, settings.skew))
    if not violations:
        return True, [], 0
    lines = enforce.refusal("push", check_mode, violations, warn=warn)
    return warn, lines, enforce.exit_code(violations)


def _mirror_push(cwd: str, remote: str) -> bool:
    """Whether the ``git push`` running this hook deletes what the remote has and this clone lacks: git lists
    those deletions to no pre-push hook, so they are found here: its command line (``--mirror``, ``--prune``;
    read from /proc, Linux) or a mirror remote (``remote.<name>.mirror``)."""
    from gitlease.enforce.quickpush import mirror_command

    if mirror_command():
        return True
    return gitq.config_get(cwd, f"remote.{remote}.mirror", type="bool") == "true"


def paths_gained(
    cwd: str,
    remote: str,
    updates: list[tuple[str, str, str]],
    *,
    listing: Listing | Callable[[], Listing] | None = None,
) -> list[str]:
    """Every path of the commits each updated ref gains: those its new value has and its value on the remote
    has not; a new ref (or an old value that cannot be fetched): those the remote's default branch has not
    (fetched when missing here); with neither, those the remote's remote-tracking refs here do not have. Not
    "those no remote ref has": a branch pushed before a lease was taken is judged again when it moves onto
    another branch. ``listing``: the remote listed just now, HEAD included (no second ``ls-remote``), or what
    lists it when HEAD is needed.

    Every ref in one walk (``claims.gained``, as the server hook does): the old values looked up in one
    ``cat-file``, those missing fetched in one ``fetch``, so 1,000 pushed refs cost a handful of git processes."""
    from gitlease.enforce import claims

    have = _have_all(cwd, remote, {o for _l, _r, o in updates if not ZERO_RE.match(o)})
    fallback: dict[str, tuple[str, ...]] = {}  # "head" -> the default branch (or, without one, what the remote
    # is known to have: its remote-tracking refs here), read once, only when some ref needs it
    ranges: list[tuple[str, tuple[str, ...]]] = []
    for local_oid, _remote_ref, remote_oid in updates:
        if remote_oid in have:
            ranges.append((local_oid, (have[remote_oid],)))
            continue
        if "head" not in fallback:  # a new ref, or an old value that cannot be had: against the default branch
            head = _remote_head(cwd, remote, listing)
            fallback["head"] = (head,) if head else _remote_tracking(cwd, remote)
        ranges.append((local_oid, fallback["head"]))
    return sorted({p for c in claims.gained(cwd, ranges, trailers=False) for p in c.paths})


def _remote_tracking(cwd: str, remote: str) -> tuple[str, ...]:
    """The commits of ``remote``'s remote-tracking refs here (``--remotes=<remote>``)."""
    return tuple(sorted(set(gitq.refs(cwd, f"refs/remotes/{remote}/").values())))


def _remote_head(cwd: str, remote: str, listing: Listing | Callable[[], Listing] | None = None) -> str | None:
    """The commit of ``remote``'s default branch (local when possible), or None."""
    if callable(listing):
        listing = listing()
    if listing is not None:
        oid = listing.head or ""
    else:
        listed = gitq.ls_remote(cwd, remote, "HEAD", timeout=60)
        oid = listed.refs.get("HEAD", "") if listed.ok else ""
    if OID_RE.fullmatch(oid) and _have_all(cwd, remote, {oid}):
        return oid
    return gitq.rev_parse_commit(cwd, f"refs/remotes/{remote}/HEAD")


FETCH_EACH = 8  # when one fetch of several missing commits fails, at most this many are fetched one by one


def _have_all(cwd: str, remote: str, oids: set[str]) -> dict[str, str]:
    """{oid: its commit} for each of ``oids`` that is a commit here (a tag: the commit it points at), those
    missing fetched from ``remote`` first, all in one fetch (one by one only when that fails for a few)."""
    if not oids:
        return {}
    found = gitq.commits_of(cwd, oids)
    missing = sorted(oids - set(found))
    if missing:
        gitq.fetch_oids(cwd, remote, missing)
        found.update(gitq.commits_of(cwd, missing))
        left = [o for o in missing if o not in found]
        if 1 < len(missing) and left and len(left) <= FETCH_EACH:  # one bad oid fails a fetch of several
            for oid in left:
                gitq.fetch_oids(cwd, remote, [oid])
            found.update(gitq.commits_of(cwd, left))
    return found


OID_RE = gitq.OID_RE
parse_push_lines = gitq.parse_pre_push  # the pre-push hook's stdin (UsageError, exit 2, for a line git never gives)


def _refuse_or_warn(warn: bool, message: str, code: int) -> tuple[bool, list[str], int]:
    if warn:
        return True, [f"gitlease: warning (lease.enforce=warn): {message}"], 0
    return False, [f"gitlease: {message}"], code


# -------------------------------------------------------------------------------------- verify


@dataclass
class Verdict:
    base: str
    head: str
    commits: int
    paths: list[str]
    leases: list[str]  # the leases the changes were checked against
    found_by: str  # flag | trailer | branch | none
    mode: str  # strict (a lease is named) | others (none named)
    violations: list[enforce.Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    signed: bool | None = None  # whether the store is signed (claims need the owner key's commit signature)
    unsigned: list[str] = field(default_factory=list)  # commits whose claim failed for want of an SSH signature

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "base": self.base,
            "head": self.head,
            "commits": self.commits,
            "paths": self.paths,
            "leases": self.leases,
            "foundBy": self.found_by,
            "mode": self.mode,
            "violations": [v.to_json() for v in self.violations],
            "notes": self.notes,
            "signed": self.signed,
            "unsigned": self.unsigned,
        }


def _rev(cwd: str, name: str, what: str) -> str:
    oid = gitq.rev_parse_commit(cwd, name)
    if oid is None:
        raise UsageError(
            f"{what} {name!r} is not a commit here (in CI, fetch it first: actions/checkout with fetch-depth: 0)"
        )
    return oid


def leases_named(cwd: str, head: str, base: str, head_name: str | None) -> tuple[list[str], str]:
    """The leases a change says it was made under: ``Lease:`` trailers of its commits, else a lease id in
    the branch name (``head_name``, or $GITHUB_HEAD_REF in GitHub Actions, $CI_MERGE_REQUEST_SOURCE_BRANCH_NAME in
    GitLab CI)."""
    values = gitq.trailers_between(cwd, head, base, TRAILER)
    ids = sorted({m.group(1) for item in values for m in [LEASE_IN_TEXT.fullmatch(item)] if m})
    if ids:
        return ids, "trailer"
    for name in (head_name, os.environ.get("GITHUB_HEAD_REF"), os.environ.get("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME")):
        m = LEASE_IN_TEXT.search(name or "")
        if m:
            return [m.group(1)], "branch"
    return [], "none"


def default_head(cwd: str) -> str:
    """The current branch (its name may hold its lease's id), or HEAD when detached."""
    return gitq.current_branch(cwd) or "HEAD"


def default_base(cwd: str, head: str) -> str:
    """What ``head`` is compared with when no base is given: its upstream; the remote's default branch when the
    upstream is the branch's own copy on the remote (a pushed feature branch), or when there is none."""
    branch = head if head != "HEAD" and gitq.rev_parse(cwd, f"refs/heads/{head}") else ""
    remote = (gitq.config_get(cwd, f"branch.{branch}.remote") if branch else "") or "origin"
    if branch:
        upstream = gitq.upstream(cwd, branch)
        if upstream and gitq.config_get(cwd, f"branch.{branch}.merge") != f"refs/heads/{branch}":
            return upstream
    if remote == ".":  # tracking a branch of this repository: the remote's default is origin's
        remote = "origin"
    default = gitq.symbolic_ref(cwd, f"refs/remotes/{remote}/HEAD")
    for name in (default, f"{remote}/main", f"{remote}/master"):
        if name and gitq.rev_parse_commit(cwd, name):
            return name
    raise UsageError(
        f"no base to compare {head} with: it has no upstream and {remote} has no default branch here "
        "(pass --base, e.g. --base origin/main)"
    )


def verify(
    svc: LeaseService,
    *,
    base: str | None = None,
    head: str | None = None,
    lease_ids: list[str] | None = None,
    require_lease: bool = False,
) -> Verdict:
    """Check the commits of ``base..head`` (by default: the current branch against its upstream, see
    ``default_head`` and ``default_base``) against the store."""
    cwd = svc.repo.cwd
    head = head or default_head(cwd)
    base = base or default_base(cwd, head)
    head_oid, base_oid = _rev(cwd, head, "head"), _rev(cwd, base, "base")
    count = gitq.count_commits(cwd, head_oid, [base_oid])
    paths = touched_paths(cwd, [head_oid], [base_oid])
    if lease_ids:
        ids, found_by = sorted(set(lease_ids)), "flag"
    else:
        ids, found_by = leases_named(cwd, head_oid, base_oid, None if head == "HEAD" else head)
    if not ids and require_lease:
        raise UsageError(
            "no lease named: pass --lease ID, or put a 'Lease: lease_...' trailer in the commits, "
            "or the lease id in the branch name"
        )
    mode = "strict" if ids else "others"
    verdict = Verdict(base=base, head=head, commits=count, paths=paths, leases=ids, found_by=found_by, mode=mode)
    if not paths:
        return verdict
    # RemoteUnavailable: the caller fails (closed). Only the leases bearing on the paths, and those named.
    snap = svc.snapshot(use_cache=False, paths=paths, keep=ids)
    from gitlease.enforce import claims

    # Each commit may use the named leases: on a signed store only those whose owner key signed it.
    judged = claims.judge(
        claims.commits_between(cwd, [head_oid], [base_oid]),
        lambda c: set(ids),
        snap,
        verdict.mode,
        svc.clock.now(),
        svc.settings.skew,
        signed=snap.signed_store,
        raw=lambda oids: claims.raw_commits(cwd, oids),
        object_format=svc.repo.object_format,
        who="this change",
    )
    verdict.violations, verdict.notes, verdict.signed = judged.violations, judged.notes, snap.signed_store
    verdict.unsigned = judged.unsigned
    return verdict


def describe(verdict: Verdict) -> list[str]:
    span = f"{verdict.base}..{verdict.head}"
    n, c = len(verdict.paths), verdict.commits
    scope = (
        f"lease {', '.join(verdict.leases)} (from {verdict.found_by})"
        if verdict.leases
        else "no lease named: checked against others' leases only"
    )
    if verdict.ok:
        return [f"verify ok: {n} path{'s' if n != 1 else ''} in {c} commit{'s' if c != 1 else ''} ({span}), {scope}"]
    lines = [f"gitlease: {note}" for note in verdict.notes]
    if verdict.unsigned:
        from gitlease.enforce.claims import unsigned_hint

        lines.append(f"gitlease: {unsigned_hint(verdict.unsigned, verdict.base)}")
    lines += enforce.refusal("verify", verdict.mode, verdict.violations, why=scope, mine="the change's leases")
    if verdict.leases and verdict.signed is False:
        lines.append("gitlease: this store is unsigned: the lease a change names is taken on trust (docs/limits.md)")
    return lines


__all__ = ["pre_push", "verify", "Verdict", "describe", "touched_paths", "others_lookup"]
