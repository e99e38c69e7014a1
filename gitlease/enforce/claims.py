"""The commits an update brings, their paths and their lease claims, and the rule applied to each commit.

Used where a change is judged after the fact by someone else than its writer: the server's pre-receive hook and
``git lease verify`` in CI. A commit *claims* a lease with a ``Lease: lease_...`` trailer, a push with
``-o lease=lease_...`` (and ``verify`` with ``--lease`` or the branch name). On a **signed store** (a trust file
on the default branch) a claim to lease L is honoured for a commit only when that commit carries a git SSH
signature (``gpg.format=ssh``) that verifies with L's owner key, the key L's own records are signed with (and
the trust file vouches for); anybody can write a trailer, only L's holder can sign with its key. On an
**unsigned store** claims are honoured as they are: unverified (docs/limits.md).

Then the rule (``gitlease.enforce.rules.check``) runs once per set of honoured leases, over the paths of the
commits that have that set: a commit's paths may use only the leases it may claim.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gitlease.core import gitq
from gitlease.core.errors import UsageError
from gitlease.enforce import rules as enforce

LEASE_ID = re.compile(r"lease_[0-9a-z]{6,40}")


@dataclass
class Commit:
    oid: str
    paths: list[str] = field(default_factory=list)  # what it changes (both sides of renames, deletes; --cc)
    trailers: set[str] = field(default_factory=set)  # lease ids its Lease: trailers name


Range = tuple[str, Sequence[str]]  # (a new value, the commits it is judged against: none for its whole history)
MAX_OCTOPUS = 4000  # distinct bases merge-base is asked about in one call; more: the walk is not narrowed


def commits_between(where: gitq.Where, include: Sequence[str], exclude: Sequence[str]) -> list[Commit]:
    """Every commit reachable from ``include`` and not from ``exclude``, with its paths and claims."""
    return gained(where, [(new, tuple(exclude)) for new in include])


def gained(where: gitq.Where, ranges: Iterable[Range], *, trailers: bool = True) -> list[Commit]:
    """Every commit that some range gains (reachable from its new value, not from any of its bases), with its
    paths (``git log --name-only --no-renames --cc``: deletions, both sides of renames, what a merge itself
    changes) and, with ``trailers``, its ``Lease:`` claims. All the ranges in one walk, whatever their number:
    one ``rev-list`` (with ``--parents`` when the ranges have different bases, each commit then told which
    ranges reach it from their new value and which from their bases), one ``log`` for the paths of exactly
    those commits and one for their trailers: a handful of git processes for 1,000 pushed refs. The commits
    ``log`` lists must be exactly those asked for: anything else raises (fail closed: a misread listing could
    hide a path)."""
    todo = list(dict.fromkeys((new, tuple(sorted(set(bases)))) for new, bases in ranges))
    if not todo:
        return []
    if len({bases for _new, bases in todo}) == 1:  # one set of bases (one push, or new refs only): no graph
        oids = gitq.walk(where, [new for new, _b in todo], todo[0][1])
    else:
        oids = _walk_ranges(where, todo)
    return _described(where, oids, trailers)


def _walk_ranges(where: gitq.Where, ranges: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """The commits ranges with different bases gain, from one ``rev-list --parents --topo-order`` of every new
    value and base, cut below a common ancestor of all the bases (nothing below it is gained by any range).
    Each commit carries two bit sets, of the ranges whose new value reaches it and of those whose bases do,
    handed from child to parent in topological order (children first): gained where the first has a range the
    second has not."""
    reps = {bases[0] for _new, bases in ranges if bases}
    floor: list[str] = []
    if all(bases for _new, bases in ranges):
        floor = list(reps) if len(reps) == 1 else _common_ancestors(where, sorted(reps))
    tips = {o for new, bases in ranges for o in (new, *bases)}
    new_bits: dict[str, int] = {}
    base_bits: dict[str, int] = {}
    for k, (new, bases) in enumerate(ranges):
        new_bits[new] = new_bits.get(new, 0) | 1 << k
        for b in bases:
            base_bits[b] = base_bits.get(b, 0) | 1 << k
    out = []
    for line in gitq.walk(where, sorted(tips), floor, parents=True):
        oid, *parents = line.split()
        nb, bb = new_bits.pop(oid, 0), base_bits.pop(oid, 0)
        if nb & ~bb:
            out.append(oid)
        for p in parents:
            if nb:
                new_bits[p] = new_bits.get(p, 0) | nb
            if bb:
                base_bits[p] = base_bits.get(p, 0) | bb
    return out


def _common_ancestors(where: gitq.Where, commits: list[str]) -> list[str]:
    """Common ancestors of all ``commits`` (none when they share no history, or when they are too many to ask
    about at once)."""
    if len(commits) > MAX_OCTOPUS:
        return []
    return gitq.octopus_bases(where, commits)


def _described(where: gitq.Where, oids: list[str], trailers: bool) -> list[Commit]:
    """``oids`` as Commits, their paths and (with ``trailers``) claims read by one ``git log`` each."""
    try:
        found = [Commit(oid, paths) for oid, paths in gitq.paths_of_commits(where, oids)]
    except ValueError as exc:
        raise UsageError(f"cannot read the pushed commits' paths ({exc}); refusing") from None
    if not trailers:
        return found
    by_oid = {c.oid: c for c in found}
    for oid, values in gitq.trailers_of(where, oids, "Lease").items():
        commit = by_oid.get(oid)
        if commit is not None:
            commit.trailers.update(v for v in values if LEASE_ID.fullmatch(v))
    return found


def raw_commits(where: gitq.Where, oids: Iterable[str]) -> dict[str, bytes]:
    """{oid: the raw commit object} for those of ``oids`` that are commits here."""
    got = gitq.read_objects(where, sorted(set(oids)))
    return {name: body for name, (kind, body) in got.items() if kind == "commit"}


@dataclass
class Judged:
    violations: list[enforce.Violation]
    notes: list[str]  # claims not honoured, and why
    unsigned: list[str] = field(default_factory=list)  # commits whose claim failed for want of an SSH signature


def unsigned_hint(unsigned: Sequence[str], base: str) -> str:
    """One line: why an unsigned commit's claim does not count, and how to fix it (``base``: where the change's
    commits start)."""
    n = len(unsigned)
    which = f"commit {unsigned[0][:12]} is" if n == 1 else f"{n} commits ({unsigned[0][:12]}, ...) are"
    return (
        f"{which} not SSH-signed, so a Lease: claim in it does not count on this signed store: run git lease init "
        f"in the clone that made it (it sets gpg.format=ssh, user.signingKey, commit.gpgSign), sign again with "
        f"git rebase --force-rebase --gpg-sign {base}, and push again"
    )


def judge(
    commits: Sequence[Commit],
    claims: Callable[[Commit], set[str]],
    snap,
    mode: str,
    now: float,
    skew: int,
    *,
    signed: bool,
    raw: Callable[[Iterable[str]], dict[str, bytes]] | None = None,
    object_format: str = "sha1",
    who: str = "this push",
    proven: set[str] = frozenset(),  # type: ignore[assignment]
) -> Judged:
    """The rule applied per commit: a commit may use the leases it claims that are live on the store (and, on
    a signed store, whose owner key signed it, unless the claim is ``proven`` otherwise: a fenced push renews
    the lease in the same push, with a version the server verified against the owner key). ``snap``: a
    Snapshot of the store, read now."""
    from gitlease.enforce.verify import others_lookup

    notes: list[str] = []
    live = {}
    for lid in {lid for c in commits for lid in claims(c)}:
        view = snap.find(lid)
        if view is None:
            notes.append(f"lease {lid} is not on the lease store")
            continue
        if not view.valid or view.record is None:
            notes.append(f"lease {lid} is invalid: {'; '.join(view.problems) or 'unreadable'}")
            continue
        if view.state(now, skew) == "expired":
            notes.append(f"lease {lid} has expired")
            continue
        live[lid] = view
    signers: dict[str, tuple[str | None, str | None]] = {}
    if signed and live and raw is not None:
        from gitlease.identity.commitsig import signer

        wanted = [c.oid for c in commits if (claims(c) & set(live)) - set(proven)]
        for oid, body in raw(wanted).items():
            signers[oid] = signer(body, object_format)
    groups: dict[frozenset[str], set[str]] = {}
    unsigned: list[str] = []
    for c in commits:
        honoured = set()
        for lid in sorted(claims(c) & set(live)):
            if signed and lid not in proven:
                from gitlease.identity.commitsig import key_words

                key, why = signers.get(c.oid, (None, "the commit could not be read"))
                owner = key_words(live[lid].record.owner.key)
                if owner is None:
                    notes.append(f"commit {c.oid[:12]} claims lease {lid}, which has no owner key: not honoured")
                    continue
                if key != owner:
                    if key is None and why and "not signed" in why and c.oid not in unsigned:
                        unsigned.append(c.oid)
                    why = why or "it is signed by another key"
                    notes.append(
                        f"commit {c.oid[:12]} claims lease {lid} but is not signed by its owner's key "
                        f"({why}): not honoured"
                    )
                    continue
            honoured.add(lid)
        groups.setdefault(frozenset(honoured), set()).update(c.paths)
    seen: set[str] = set()
    violations: list[enforce.Violation] = []
    for owners, paths in sorted(groups.items(), key=lambda kv: sorted(kv[0])):
        mine = [
            enforce.Mine(lid, live[lid].record.paths, live[lid].record.expires_at, live[lid].grant_oid)
            for lid in sorted(owners)
        ]
        for v in enforce.check(sorted(paths), mine, mode, now, others_lookup(snap, set(owners), now, skew), who=who):
            if v.path not in seen:
                seen.add(v.path)
                violations.append(v)
    violations.sort(key=lambda v: v.path)
    return Judged(violations, sorted(set(notes)), unsigned if violations else [])


__all__ = ["Commit", "Range", "commits_between", "gained", "raw_commits", "judge", "Judged", "unsigned_hint"]
