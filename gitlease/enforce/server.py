"""The server side: ``git lease server-hook pre-receive`` on a self-hosted remote (a bare repository over ssh,
Gitea or GitLab server hooks). Hooks on clients can be skipped; this cannot.

It refuses, for the whole push (git applies all or none of a push a pre-receive hook refuses):

* lease ref updates that are not what gitlease itself writes: a create must be version 1 of a canonical
  record, without parents, with its id ref and exactly its scope refs created together at that commit; a
  renewal must be a commit whose only parent is the version it replaces, ``version + 1``, the same lease
  (id, owner, acquiredAt, repo, workspace), renewed before the old version expired (by the records'
  own timestamps: no server clock involved); a renewal that changes the scope (extend, narrow) must create,
  at the lease's grant, exactly the scope refs of the paths it adds and delete exactly those of the paths it
  removes, in the same push; scope refs never move; nothing else lives under ``refs/leases/``. Deletes
  (release, clearing an expired lease) are compare-and-swap updates the client pins; they pass.
  Signatures: ``signature_problem`` verifies each version against the server's trust file.
* branch and tag updates whose new commits touch a path inside a lease held by someone else: a push claims
  leases with push options (``git push -o lease=lease_...``) or ``Lease:`` trailers in its commits; without
  signatures such a claim is not proof (docs/limits.md).

The pushed objects are still in git's quarantine while this runs: every read of them keeps git's
environment (``keep_repo_env``), which points at the quarantine.
"""

from __future__ import annotations

import os
import re

from gitlease.core import gitcmd
from gitlease.core import record as records
from gitlease.core.errors import InvalidRecord, RemoteUnavailable, UsageError
from gitlease.core.objects import RECORD_FILE, SIGNATURE_FILE
from gitlease.core.refnames import ID_PREFIX, NAMESPACE, SCOPE_REF, path_of_scope_ref
from gitlease.core.store import Blob, parse_batch
from gitlease.enforce import rules as enforce

ZERO = re.compile(r"^0+$")
OID_RE = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # as verify.OID_RE (not imported: it pulls in the service)
REF_RE = re.compile(r"[^\x00-\x20\x7f]+")
LEASE_OPTION = re.compile(r"lease=(lease_[0-9a-z]{6,40})")  # fullmatch: "lease=ID\n" is no claim


def _read(args, *, input: bytes | None = None, check: bool = True) -> gitcmd.Result:
    return gitcmd.run(args, input=input, check=check, keep_repo_env=True)


def read_objects(oids) -> tuple[dict[str, Blob], dict[str, tuple[str, ...]]]:
    """Record and signature bytes, and parents, of lease commits (quarantined or not)."""
    oids = sorted(set(oids))
    if not oids:
        return {}, {}
    names = [n for o in oids for n in (o, f"{o}:{RECORD_FILE}", f"{o}:{SIGNATURE_FILE}")]
    res = _read(
        ["cat-file", "--batch=%(objecttype) %(objectsize) %(rest)"],
        input="".join(f"{n} {n}\n" for n in names).encode(),
        check=False,
    )
    got = parse_batch(res.stdout)
    blobs, parents = {}, {}
    for o in oids:
        kind, body = got.get(o, (None, b""))
        parents[o] = (
            tuple(line[7:].decode() for line in body.split(b"\n\n", 1)[0].split(b"\n") if line.startswith(b"parent "))
            if kind == "commit"
            else ()
        )
        rec = got.get(f"{o}:{RECORD_FILE}")
        sig = got.get(f"{o}:{SIGNATURE_FILE}")
        problem = None if kind == "commit" and rec and rec[0] == "blob" else "not a lease commit (no lease.json)"
        blobs[o] = Blob(
            rec[1] if rec and rec[0] == "blob" and len(rec[1]) <= records.MAX_RECORD_BYTES else None,
            sig[1] if sig and sig[0] == "blob" else None,
            problem,
        )
    return blobs, parents


def signature_problem(blob: Blob, rec: records.Record, previous: records.Record | None) -> str | None:
    """Why a pushed lease version's signature does not verify against the server's own trust file (the
    allowed_signers file on this repository's HEAD branch, the one clients read), or None.

    No trust file on the server: unsigned mode, nothing to verify (a signed version must still carry a good
    signature by the key its record names). The owner binding (the key never changes between versions) is
    checked with the other fields that must stay the same."""
    from gitlease.core.clock import SYSTEM
    from gitlease.identity.trust import INVALID

    trust = _server_trust()
    got = trust.check_version(rec, blob.record, blob.signature, SYSTEM.now())
    return got.problem if got.status == INVALID else None


_TRUST_CACHE: list = []


def _server_trust():
    """The trust file at this repository's HEAD, read once per hook run."""
    if _TRUST_CACHE:
        return _TRUST_CACHE[0]
    from gitlease.core.config import resolve
    from gitlease.identity.trust import Trust, _parse

    try:
        config = dict(
            line.split("\n", 1)
            for line in gitcmd.zsplit(
                gitcmd.run(["config", "-z", "--get-regexp", r"^lease\."], check=False, keep_repo_env=True).out
            )
        )
    except ValueError:
        config = {}
    path = resolve(config, env={}).allowed_signers
    res = gitcmd.run(["cat-file", "blob", f"HEAD:{path}"], check=False, keep_repo_env=True)
    if res.returncode != 0:
        trust = Trust(None, f"no trust file ({path} not on this repository's HEAD)")
    else:
        trust = Trust(_parse(res.stdout, f"{path} on HEAD"), f"{path} on HEAD")
    _TRUST_CACHE.append(trust)
    return trust


def _parse(blob: Blob | None) -> tuple[records.Record | None, str | None]:
    if blob is None or blob.record is None:
        return None, (blob.problem if blob else None) or "missing record"
    try:
        return records.parse(blob.record), None
    except InvalidRecord as exc:
        return None, exc.message


SAME = ("lease_id", "acquired_at", "owner", "repo", "workspace_id", "schema")  # the scope: see scope_changes


def check_lease_updates(updates: list[tuple[str, str, str]]) -> list[str]:
    """Problems with the lease ref updates of one push (``(old, new, ref)``, zero oids for none)."""
    from gitlease.core import store

    reserved = tuple(getattr(store, "RESERVED", ()))  # e.g. `git lease doctor`'s throw-away probe refs
    lease = [
        (o, n, r)
        for o, n, r in updates
        if (r == SCOPE_REF or r.startswith(NAMESPACE + "/")) and not (reserved and r.startswith(reserved))
    ]
    if not lease:
        return []
    problems: list[str] = []
    wanted = {x for o, n, _ in lease for x in (o, n) if not ZERO.match(x)}
    blobs, parents = read_objects(wanted)
    scope_creates: dict[str, set[str]] = {}  # oid -> paths of the scope refs created at it
    scope_deletes: dict[str, set[str]] = {}  # oid -> paths of the scope refs deleted (pinned to it)
    id_creates: dict[str, str] = {}  # oid -> lease id
    scope_changes: list[tuple[str, str, set[str], set[str]]] = []  # (id ref, new version, added, removed)
    for old, new, ref in lease:
        if ZERO.match(new):
            # a delete: release, or clearing an expired lease (pinned by the pusher), or a narrow's
            if ref == SCOPE_REF or ref.startswith(SCOPE_REF + "/"):
                try:
                    scope_deletes.setdefault(old, set()).add(path_of_scope_ref(ref))
                except ValueError:
                    pass
            continue
        if ref.startswith(ID_PREFIX):
            lid = ref[len(ID_PREFIX) :]
            rec, why = _parse(blobs.get(new))
            if rec is None:
                problems.append(f"{ref}: invalid record: {why}")
                continue
            if rec.lease_id != lid:
                problems.append(f"{ref}: the record names lease {rec.lease_id}")
                continue
            prev = None
            if ZERO.match(old):
                if rec.version != 1 or parents.get(new):
                    problems.append(f"{ref}: a new lease must be version 1 without a parent commit")
                    continue
                id_creates[new] = lid
            else:
                prev, pwhy = _parse(blobs.get(old))
                if prev is None:
                    problems.append(f"{ref}: the version it replaces is invalid ({pwhy})")
                    continue
                if parents.get(new) != (old,):
                    problems.append(f"{ref}: not a next version (its parent must be exactly {old[:12]})")
                    continue
                if rec.version != prev.version + 1:
                    problems.append(f"{ref}: version {rec.version} does not follow version {prev.version}")
                    continue
                changed = [f for f in SAME if getattr(rec, f) != getattr(prev, f)]
                if rec.paths != prev.paths:
                    scope_changes.append((ref, new, set(rec.paths) - set(prev.paths), set(prev.paths) - set(rec.paths)))
                if changed:
                    problems.append(f"{ref}: a renewal may not change {', '.join(changed)}")
                    continue
                if rec.renewed_at >= prev.expires_at:
                    problems.append(f"{ref}: renewed at {rec.renewed_at}, after the lease expired at {prev.expires_at}")
                    continue
            sig = signature_problem(blobs[new], rec, prev)
            if sig:
                problems.append(f"{ref}: signature: {sig}")
        elif ref == SCOPE_REF or ref.startswith(SCOPE_REF + "/"):
            if not ZERO.match(old):
                problems.append(f"{ref}: scope refs never move while their lease lives")
                continue

            try:
                path = path_of_scope_ref(ref)
            except ValueError:
                problems.append(f"{ref}: not a gitlease scope ref")
                continue
            scope_creates.setdefault(new, set()).add(path)
        else:
            problems.append(f"{ref}: not a gitlease ref (only {ID_PREFIX}* and {SCOPE_REF}/* live here)")
    for ref, new, added, removed in scope_changes:
        grant = _root(new)
        made = scope_creates.get(grant, set()) if grant not in id_creates else set()
        if grant is None or made != added or scope_deletes.get(grant, set()) != removed:
            problems.append(
                f"{ref}: a renewal may not change paths unless the same push creates, at the lease's grant, "
                f"exactly the scope refs of the paths it adds ({' '.join(sorted(added)) or 'none'}) and deletes "
                f"exactly those of the paths it removes ({' '.join(sorted(removed)) or 'none'})"
            )
        elif grant in scope_creates:
            del scope_creates[grant]  # an extend's: accounted for
    for oid, paths in scope_creates.items():
        rec, _ = _parse(blobs.get(oid))
        if oid not in id_creates or rec is None:
            problems.append(
                f"scope refs {', '.join(sorted(paths))} created without their lease's id ref in the same push"
            )
        elif set(rec.paths) != paths:
            problems.append(
                f"lease {rec.lease_id}: its scope refs must be created together and match its "
                f"scope ({' '.join(rec.paths)})"
            )
    for oid, lid in id_creates.items():
        if oid not in scope_creates:
            problems.append(f"lease {lid}: created without its scope refs")
    return problems


def _root(oid: str) -> str | None:
    """Version 1 of the lease whose version ``oid`` is: the root of its history (one parent per version)."""
    res = _read(["rev-list", "--max-parents=0", oid], check=False)
    roots = res.out.split() if res.returncode == 0 else []
    return roots[0] if len(roots) == 1 else None


def push_claims(cwd: str, new_oids: list[str]) -> set[str]:
    """Leases a push says it is made under: ``-o lease=ID`` push options and ``Lease:`` commit trailers."""
    claims = set()
    for value in push_options():
        m = LEASE_OPTION.fullmatch(value)
        if m:
            claims.add(m.group(1))
    if new_oids:
        res = _read(
            ["log", "--format=%(trailers:key=Lease,valueonly,separator=%x00)%x00", *new_oids, "--not", "--all", "--"],
            check=False,
        )
        for item in enforce.zsplit(res.stdout):
            if re.fullmatch(r"lease_[0-9a-z]{6,40}", item.strip()):
                claims.add(item.strip())
    return claims


def push_options() -> list[str]:
    """GIT_PUSH_OPTION_0 .. GIT_PUSH_OPTION_<COUNT-1>. A COUNT that is not a plain number gives none (fewer
    claims: fail closed); a huge one costs no more than the environment holds."""
    count = os.environ.get("GIT_PUSH_OPTION_COUNT", "")
    n = int(count) if count.isascii() and count.isdigit() else 0
    prefix = "GIT_PUSH_OPTION_"
    found = {
        int(k[len(prefix) :]): v
        for k, v in os.environ.items()
        if k.startswith(prefix) and k[len(prefix) :].isascii() and k[len(prefix) :].isdigit()
    }
    return [found[i] for i in sorted(found) if i < n]


def check_branch_updates(updates: list[tuple[str, str, str]]) -> tuple[list[str], list[str]]:
    """Refusal lines (and notes) for branch and tag updates touching paths leased to someone else."""
    from gitlease.core.config import resolve
    from gitlease.core.repo import Repo
    from gitlease.enforce.verify import others_lookup
    from gitlease.service.leases import LeaseService

    news = list(
        dict.fromkeys(
            n for o, n, r in updates if not ZERO.match(n) and not (r == SCOPE_REF or r.startswith(NAMESPACE + "/"))
        )
    )
    if not news:
        return [], []
    repo = Repo.discover(".")
    settings = resolve(repo.config)
    mode = settings.enforce or "others"
    if mode == "off":
        return [], []
    res = _read(["log", "--format=", "--name-only", "--no-renames", "--cc", "-z", *news, "--not", "--all", "--"])
    paths = sorted(set(enforce.zsplit(res.stdout)))
    if not paths:
        return [], []
    svc = LeaseService(repo, settings)
    untrusted = None
    try:
        snap = svc.snapshot(use_cache=False)
    except RemoteUnavailable as exc:
        return [f"cannot read the lease store ({exc.message}); refusing rather than guessing"], []
    except InvalidRecord as exc:
        # The trust file on HEAD does not parse. Refusing every push would also refuse the push that fixes it
        # (this hook cannot be skipped): read the leases without trust, honour no claim, so that every path
        # inside any lease is refused and only paths outside all leases pass.
        import dataclasses

        untrusted = exc.message
        unread = os.path.join(repo.git_dir, "gitlease", "no-trust-file")  # absent: no trust, nothing required
        svc = LeaseService(repo, dataclasses.replace(settings, allowed_signers=unread))
        snap = svc.snapshot(use_cache=False)
    now = svc.clock.now()
    claims = push_claims(repo.cwd, news) if untrusted is None else set()
    mine = []
    for lid in sorted(claims):
        view = snap.find(lid)
        if view and view.valid and view.record and view.state(now, settings.skew) != "expired":
            mine.append(enforce.Mine(lid, view.record.paths, view.record.expires_at, view.grant_oid))
    check_mode = "strict" if mode == "strict" else "others"
    violations = enforce.check(
        paths,
        mine,
        check_mode,
        now,
        others_lookup(snap, {m.lease_id for m in mine}, now, settings.skew),
        who="this push",
    )
    if not violations:
        return [], []
    lines = [
        ln.removeprefix("gitlease: ")
        for ln in enforce.refusal(
            "push", check_mode, violations, warn=mode == "warn", why="server", mine="the leases this push names"
        )
    ]
    lines[-1] = (
        "name your lease with git push -o lease=LEASE_ID (needs receive.advertisePushOptions) or a "
        "'Lease: LEASE_ID' commit trailer; see git lease status"
    )
    if untrusted is not None:
        lines[-1] = f"no lease claim is honoured until the trust file is fixed: {untrusted}"
    if mode == "warn":
        return [], lines
    return lines, []


def parse_receive_lines(data: bytes) -> list[tuple[str, str, str]]:
    """The pre-receive hook's stdin: ``<old oid> SP <new oid> SP <ref name> LF`` per ref. Lines end at LF only
    (a ref name may hold U+2028). Anything else is not what git gives: UsageError (exit 2), never skipped."""
    text = data.decode("utf-8", "surrogateescape")  # ref names are bytes: not always UTF-8
    updates = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        parts = line.split(" ", 2)
        if (
            len(parts) != 3
            or not OID_RE.fullmatch(parts[0])
            or not OID_RE.fullmatch(parts[1])
            or not REF_RE.fullmatch(parts[2])
        ):
            raise UsageError(
                f"line {number} of the hook's input is not '<old oid> <new oid> <ref>' ({line[:80]!r}); refusing"
            )
        updates.append((parts[0], parts[1], parts[2]))
    return updates


def pre_receive(data: bytes) -> tuple[list[str], list[str]]:
    updates = parse_receive_lines(data)
    problems = check_lease_updates(updates)
    refusals, notes = check_branch_updates(updates)
    return problems + refusals, notes
