"""The lease store: refs under ``refs/leases/`` changed only by compare-and-swap transactions.

Two stores speak one interface:

* ``RemoteStore``: any git remote (URL or remote name). Writes are ``git push --atomic --porcelain`` with
  every ref pinned by ``--force-with-lease=<ref>:<expected oid>`` (empty: must not exist). Never ``--force``,
  never a ``+`` refspec: ``push_argv`` is the one place push arguments are built, and tests check it.
* ``LocalStore``: the repository's own refs (shared by all its worktrees), changed with one
  ``git update-ref --stdin`` transaction per write. Many agents on one machine, zero network.

The store knows refs and objects, not leases: the service gives it ref updates and reads back bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gitlease.core import gitcmd
from gitlease.core.errors import InvalidRecord, RemoteUnavailable
from gitlease.core.hookgit import RESERVED, parse_listing
from gitlease.core.objects import RECORD_FILE, SIGNATURE_FILE
from gitlease.core.refnames import NAMESPACE, SCOPE_REF

if TYPE_CHECKING:
    from gitlease.core.pushgroup import PushGroup

ZERO = "0" * 40
DEFAULT_TIMEOUT = 30.0
PUSH_GRACE = 1.0  # seconds a timed-out push's children get to finish (gitcmd.run, grace)
MAX_BLOB_BYTES = 1024 * 1024  # larger "records" are reported invalid without being read

# a fetch of lease objects by id: nothing else written (no tags, FETCH_HEAD, gc or submodules)
_FETCH_OBJECTS = ("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-auto-gc", "--no-recurse-submodules")


@dataclass(frozen=True)
class RefUpdate:
    """Set ``ref`` from ``old`` to ``new``. ``old=None``: the ref must not exist. ``new=None``: delete."""

    ref: str
    new: str | None
    old: str | None

    def __post_init__(self) -> None:
        if not self.ref.startswith("refs/"):
            raise ValueError(f"not a full ref name: {self.ref}")
        if self.new is None and self.old is None:
            raise ValueError("a delete must name the value it expects")


@dataclass
class Outcome:
    """What a transaction did. ``ok``: every update landed. ``ambiguous``: we cannot tell (killed, timed
    out, connection lost mid-push): the caller must re-read before deciding anything."""

    ok: bool
    ambiguous: bool = False
    statuses: dict[str, str] = field(default_factory=dict)  # ref -> ok | uptodate | rejected:<reason>
    message: str = ""
    server: list[str] = field(default_factory=list)  # what the server said ("remote: " lines: its hooks' reasons)
    connected: bool = True  # False: git never reached the store (no such remote or host): nothing landed

    def check_reached(self) -> None:
        """RemoteUnavailable when git never reached the store: not an unknown outcome, nothing was written."""
        if not self.connected:
            raise RemoteUnavailable(self.message)

    def rejected(self) -> list[str]:
        return [r for r, s in self.statuses.items() if s.startswith("rejected")]

    @property
    def reason(self) -> str:
        """Why it did not land, in the server's own words when it gave some (its hooks' ``remote:`` lines),
        then git's: what a refusal reports."""
        said = "; ".join(line.strip() for line in self.server[:3])
        return f"{said} ({self.message})" if said and self.message else said or self.message


@dataclass(frozen=True)
class Transaction:
    """How ``Store.apply`` was asked to apply its updates (each kind's ``_transact`` reads it)."""

    timeout: float  # this call's bound
    extra_refspecs: tuple[str, ...] = ()  # branches pushed in the same transaction
    run_hooks: bool = False  # the client's pre-push hook judges it
    atomic: bool = True  # all or nothing; False: each ref judged on its own


@dataclass(frozen=True)
class Blob:
    record: bytes | None  # None: missing, not a lease commit, or too large
    signature: bytes | None
    problem: str | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a store can do, declared by each kind (callers ask these, never the store's class)."""

    shared: bool  # other clones (hosts) see its refs: a git remote
    branches: bool  # ``apply`` can carry branch refspecs in the same atomic push (a fenced push)
    hooks: bool  # a server hook may judge (and refuse) what is written
    network: bool  # its reads and writes cross a network: they can time out, and have an unclear outcome


class Store:
    """What every store offers (the contract tests/test_store_contract.py holds each kind to): compare-and-swap
    ref transactions, atomic over several refs, with git's directory/file rule (``apply``), the listing of the
    lease refs (``list_refs``), and the objects of what it lists, readable in the local repository
    (``ensure_objects``, then ``read``, ``file_at``, ``parents``, ``history``, shared here: cat-file)."""

    kind = "abstract"
    capabilities = Capabilities(shared=False, branches=False, hooks=False, network=False)

    def __init__(self, repo_dir: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.repo_dir = repo_dir
        self.timeout = timeout  # the default bound of one git call (a caller bounds its own: gitcmd.deadline)
        # told of every update that landed (the service keeps the local copy the hooks and the guard read)
        self.on_applied: Callable[[Sequence[RefUpdate]], None] | None = None
        # a store whose every write is a push (a remote): its plain pushes go with those of other threads that
        # meet them there (gitlease/core/pushgroup.py); the others write at once and ignore it
        self.group: PushGroup | None = None

    def _landed(self, updates: Sequence[RefUpdate], out: Outcome) -> Outcome:
        """``out``, after telling ``on_applied`` which of ``updates`` landed."""
        if self.on_applied is not None:
            done = [u for u in updates if out.ok or out.statuses.get(u.ref) in ("ok", "uptodate")]
            if done and not out.ambiguous:
                self.on_applied(done)
        return out

    # --- interface -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        raise NotImplementedError

    def apply(
        self,
        updates: Sequence[RefUpdate],
        *,
        timeout: float | None = None,
        extra_refspecs: Sequence[str] = (),
        run_hooks: bool = False,
        atomic: bool = True,
    ) -> Outcome:
        """One compare-and-swap transaction over ``updates`` (atomic unless ``atomic=False``: then each ref is
        judged on its own). ``extra_refspecs``: branch refspecs pushed in the same transaction (a store whose
        ``capabilities.branches``); ``run_hooks``: let the client's pre-push hook judge it; ``timeout``: this
        call's bound (default: the store's). What landed is told to ``on_applied``."""
        if extra_refspecs and not self.capabilities.branches:
            raise ValueError(f"the {self.kind} store does not push branches")
        tx = Transaction(timeout or self.timeout, tuple(extra_refspecs), run_hooks, atomic)
        return self._landed(updates, self._transact(updates, tx))

    def _transact(self, updates: Sequence[RefUpdate], tx: Transaction) -> Outcome:
        """``apply`` as each kind does it (``on_applied`` is told by ``apply``)."""
        raise NotImplementedError

    def list_refs(self, *, timeout: float | None = None, head: bool = False) -> dict[str, str]:
        """The lease refs. ``head``: also learn the default branch's HEAD in the same read, when the store
        can (a remote: one ``ls-remote``), for the next ``default_head``."""
        raise NotImplementedError

    def take_listing(self, text: str) -> dict[str, str]:
        """``list_refs(head=True)`` from an ``ls-remote`` a caller already ran (a remote store only)."""
        raise NotImplementedError

    def listed_head(self) -> str | None:
        return None

    def ensure_objects(self, oids: Iterable[str], *, timeout: float | None = None) -> None:
        """Make the objects of these commits readable locally."""

    def list_namespace(self, prefix: str, *, timeout: float | None = None) -> dict[str, str]:
        """Every ref under ``prefix`` on the store (refs outside ``refs/leases/``: parked work)."""
        raise NotImplementedError

    # --- shared ----------------------------------------------------------------------------------
    def read(self, oids: Iterable[str], *, timeout: float | None = None, fetch: bool = True) -> dict[str, Blob]:
        """Lease record and signature bytes of each commit oid (fetching what is missing, unless
        ``fetch`` is false: then only what is already in the local repository)."""
        wanted = sorted(set(oids))
        if not wanted:
            return {}
        if fetch:
            self.ensure_objects(wanted, timeout=timeout)
        names = [f"{oid}:{fname}" for oid in wanted for fname in (RECORD_FILE, SIGNATURE_FILE)]
        sizes = _batch_check(self.repo_dir, names)
        small = [n for n in names if sizes.get(n, (None, -1))[0] == "blob" and sizes[n][1] <= MAX_BLOB_BYTES]
        contents = _batch_contents(self.repo_dir, small) if small else {}
        out: dict[str, Blob] = {}
        for oid in wanted:
            rname, sname = f"{oid}:{RECORD_FILE}", f"{oid}:{SIGNATURE_FILE}"
            problem = None
            if rname not in contents:
                kind, size = sizes.get(rname, (None, -1))
                if kind is None:
                    problem = "not a lease commit (no lease.json)"
                elif kind != "blob":
                    problem = "lease.json is not a file"
                else:
                    problem = f"record is {size} bytes, over the limit"
            if problem is None and sname in sizes and sname not in contents:
                problem = "lease.sig is not a file, or over the size limit"
            out[oid] = Blob(contents.get(rname), contents.get(sname), problem)
        return out

    def parents(self, heads: Iterable[str], *, exclude: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
        """{commit: its parents} for every commit reachable from ``heads`` (already local), in one call.
        ``exclude``: commits whose history is not wanted (the walk stops there: they and what they reach are
        left out)."""
        heads = sorted(set(heads))
        if not heads:
            return {}
        stop = sorted(set(exclude) - set(heads))
        res = gitcmd.run(
            ["rev-list", "--parents", "--stdin"],
            cwd=self.repo_dir,
            input="".join([h + "\n" for h in heads] + [f"^{x}\n" for x in stop]).encode(),
            check=False,
        )
        if res.returncode != 0 and stop:
            return self.parents(heads)
        if res.returncode != 0 and len(heads) > 1:  # one unreadable head: the others still answer
            each: dict[str, tuple[str, ...]] = {}
            for h in heads:
                each.update(self.parents([h]))
            return each
        out: dict[str, tuple[str, ...]] = {}
        for line in res.out.splitlines():
            parts = line.split()
            if parts:
                out[parts[0]] = tuple(parts[1:])
        return out

    def default_head(self, *, timeout: float | None = None) -> tuple[str, str] | None:
        """(branch ref, commit) of the store's default branch (what trust is read from), or None if unborn."""
        raise NotImplementedError

    def file_at(self, commit: str, path: str, *, limit: int = MAX_BLOB_BYTES) -> bytes | None:
        """The bytes of ``path`` in ``commit`` (already local), or None when there is no such file."""
        name = f"{commit}:{path}"
        kind, size = _batch_check(self.repo_dir, [name]).get(name, (None, -1))
        if kind != "blob":
            return None
        if size > limit:
            raise InvalidRecord(f"{path} is {size} bytes, over the {limit}-byte limit")
        return _batch_contents(self.repo_dir, [name]).get(name)

    def history(self, oid: str, *, limit: int = 1000) -> list[tuple[str, tuple[str, ...]]]:
        """(commit, parents) from ``oid`` back to the grant, newest first."""
        res = gitcmd.run(["log", f"--max-count={limit}", "--format=%H %P", oid, "--"], cwd=self.repo_dir, check=False)
        if res.returncode != 0:
            return []
        rows = []
        for line in res.out.splitlines():
            parts = line.split()
            if parts:
                rows.append((parts[0], tuple(parts[1:])))
        return rows


# ---------------------------------------------------------------------------- remote


class RemoteStore(Store):
    kind = "remote"
    capabilities = Capabilities(shared=True, branches=True, hooks=True, network=True)

    def __init__(self, repo_dir: str, remote: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(repo_dir, timeout=timeout)
        self.remote = remote
        self._head: tuple[tuple[str, str] | None, bool] | None = None  # HEAD as the last listing saw it
        self._head_here: str | None = None  # that HEAD's commit, once ensure_objects made it readable here

    @property
    def name(self) -> str:
        return self.remote

    def _transact(self, updates: Sequence[RefUpdate], tx: Transaction) -> Outcome:
        if self.group is not None:
            from gitlease.core.pushgroup import plain

            if plain(tx):
                return self.group.push((self.repo_dir, self.remote), self._push, updates, tx)
        return self._push(updates, tx)

    def _push(self, updates: Sequence[RefUpdate], tx: Transaction) -> Outcome:
        """One ``git push`` of ``updates`` (and ``tx``'s branch refspecs)."""
        argv = push_argv(
            self.remote, updates, extra_refspecs=tx.extra_refspecs, run_hooks=tx.run_hooks, atomic=tx.atomic
        )
        try:
            res = gitcmd.run(argv, cwd=self.repo_dir, timeout=tx.timeout, check=False, grace=PUSH_GRACE)
        except gitcmd.Timeout as exc:
            return Outcome(ok=False, ambiguous=True, message=str(exc))
        statuses = parse_push_porcelain(res.out)
        wanted = [u.ref for u in updates]
        server = server_lines(res.err)
        if not statuses and _never_connected(res.err):
            # git says it never reached a repository (no such remote, host or path; refused; not allowed):
            # nothing can have landed. Still "ambiguous" for callers that only know that much (they re-read)
            return Outcome(
                ok=False,
                ambiguous=True,
                message=f"cannot reach the lease store {self.remote!r}: {_last_error(res.err)} (nothing was written)",
                connected=False,
            )
        if not statuses or any(r not in statuses for r in wanted):
            # No verdict for some ref: the connection failed before, or during, the push.
            return Outcome(ok=False, ambiguous=True, statuses=statuses, message=_last_error(res.err), server=server)
        ok = all(not s.startswith("rejected") for s in statuses.values()) and res.returncode == 0
        return Outcome(ok=ok, statuses=statuses, message="" if ok else _last_error(res.err), server=server)

    def list_refs(self, *, timeout: float | None = None, head: bool = False) -> dict[str, str]:
        """The lease refs, by one ``git ls-remote``. ``head``: the same call also answers the remote's ``HEAD``
        and the branch it names (``--symref``), kept for ``default_head`` (the trust file's branch): one round
        trip for both. Without ``head`` HEAD is not asked for."""
        argv = ["ls-remote", "--symref", self.remote, "HEAD", f"{NAMESPACE}/*"] if head else None
        res = self._ls_remote(argv or ["ls-remote", "--refs", self.remote, f"{NAMESPACE}/*"], timeout)
        return self._read_listing(res.out, head)

    def take_listing(self, text: str) -> dict[str, str]:
        """``list_refs(head=True)`` from its ``ls-remote`` output as a caller already read it (the pre-push
        hook's lean path lists the store before it knows it needs the library)."""
        return self._read_listing(text, True)

    def _read_listing(self, text: str, head: bool) -> dict[str, str]:
        try:
            refs, branch, oid = parse_listing(text)
        except ValueError:
            raise RemoteUnavailable(
                f"cannot read lease remote {self.remote!r}: a listing line git did not write"
            ) from None
        return self._listed(refs, head, branch, oid)

    def _listed(self, refs: dict[str, str], head: bool, branch: str | None, oid: str | None) -> dict[str, str]:
        """``refs``, with HEAD as the listing answered it kept for ``default_head`` (when asked for)."""
        if head:
            self._head = ((branch or "HEAD", oid) if oid else None, True)
            self._head_here = None
        return refs

    def list_namespace(self, prefix: str, *, timeout: float | None = None) -> dict[str, str]:
        """Every ref under ``prefix`` (``refs/leases-quarantine/``: parked work) on the store."""
        res = self._ls_remote(["ls-remote", "--refs", self.remote, f"{prefix.rstrip('/')}/*"], timeout)
        out = {}
        for line in res.out.splitlines():
            left, _, ref = line.partition("\t")
            if ref.startswith(prefix):
                out[ref] = left.strip()
        return out

    def _ls_remote(self, argv: list[str], timeout: float | None) -> gitcmd.Result:
        try:
            res = gitcmd.run(argv, cwd=self.repo_dir, timeout=timeout or self.timeout, check=False)
        except gitcmd.Timeout as exc:
            raise RemoteUnavailable(f"lease remote {self.remote!r} did not answer: {exc}") from None
        if res.returncode != 0:
            raise RemoteUnavailable(f"cannot read lease remote {self.remote!r}: {_last_error(res.err)}")
        return res

    def listed_head(self) -> str | None:
        """The commit of the remote's HEAD as the last ``list_refs(head=True)`` saw it (to fetch it with the
        lease objects), or None."""
        got = self._head
        return got[0][1] if got is not None and got[0] is not None else None

    def default_head(self, *, timeout: float | None = None) -> tuple[str, str] | None:
        """``git ls-remote --symref <remote> HEAD``: the branch the remote's HEAD names, and its commit
        (fetched by oid, like lease commits, when it is not local yet). Answered without a call when the last
        listing asked for HEAD too (``list_refs(head=True)``); that answer is used once."""
        if self._head is not None:
            got, self._head = self._head[0], None
        else:
            res = self._ls_remote(["ls-remote", "--symref", self.remote, "HEAD"], timeout)
            branch = oid = None
            for line in res.out.splitlines():
                left, _, right = line.partition("\t")
                if right != "HEAD":
                    continue
                if left.startswith("ref: "):
                    branch = left[5:].strip()
                else:
                    oid = left.strip()
            got = (branch or "HEAD", oid) if oid else None
        if got is None:
            return None
        if got[1] != self._head_here:  # fetched with the lease objects since the listing: no second look
            self.ensure_objects([got[1]], timeout=timeout)
        return got

    def ensure_objects(self, oids: Iterable[str], *, timeout: float | None = None) -> None:
        oids = list(oids)
        present = _batch_check(self.repo_dir, oids)
        missing = [o for o in oids if o not in present]
        listed = self._head[0][1] if self._head is not None and self._head[0] is not None else None
        if listed is not None and listed in present:
            self._head_here = listed
        if not missing:
            return
        try:
            res = gitcmd.run(
                [*_FETCH_OBJECTS, "--stdin", self.remote],
                cwd=self.repo_dir,
                input="".join(o + "\n" for o in missing).encode(),
                timeout=timeout or self.timeout,
                check=False,
            )
        except gitcmd.Timeout as exc:
            raise RemoteUnavailable(f"lease remote {self.remote!r} did not answer: {exc}") from None
        if res.returncode != 0:
            # A ref moved between ls-remote and fetch (its old object is gone): fetch what is still there.
            for oid in missing:
                gitcmd.run(
                    [*_FETCH_OBJECTS, self.remote, oid],
                    cwd=self.repo_dir,
                    timeout=timeout or self.timeout,
                    check=False,
                )


def push_argv(
    remote: str,
    updates: Sequence[RefUpdate],
    *,
    extra_refspecs: Sequence[str] = (),
    run_hooks: bool = False,
    atomic: bool = True,
) -> list[str]:
    """The one builder of push arguments. Each ref is pinned to the value we expect; no ``--force``,
    no ``+refspec``, ever (tests assert it)."""
    argv = ["push", "--porcelain", "--no-follow-tags", "--no-signed", "--recurse-submodules=no"]
    if atomic:
        argv.append("--atomic")
    if not run_hooks:
        argv.append("--no-verify")
    specs = []
    for u in updates:
        argv.append(f"--force-with-lease={u.ref}:{u.old or ''}")
        specs.append(f"{u.new}:{u.ref}" if u.new is not None else f":{u.ref}")
    for spec in extra_refspecs:
        if spec.startswith("+"):
            raise ValueError("a forced refspec would switch the compare-and-swap off")
        specs.append(spec)
    return argv + [remote, *specs]


def parse_push_porcelain(out: str) -> dict[str, str]:
    """``git push --porcelain`` lines -> {remote ref: ok | uptodate | rejected:<reason>}."""
    statuses: dict[str, str] = {}
    for line in out.splitlines():
        if len(line) < 3 or line[1] != "\t":
            continue
        flag, rest = line[0], line[2:]
        spec, _, summary = rest.partition("\t")
        dst = spec.rpartition(":")[2]
        if flag == "!":
            reason = summary[summary.find("(") + 1 : summary.rfind(")")] if "(" in summary else summary
            statuses[dst] = "rejected:" + (reason or summary.strip("[] ")).strip()
        elif flag == "=":
            statuses[dst] = "uptodate"
        elif flag in " +-*":
            statuses[dst] = "ok"
    return statuses


# What git prints when it never got to talk to a repository at all (so a push cannot have landed).
_NOT_CONNECTED = (
    "does not appear to be a git repository",
    "Could not resolve host",
    "Could not resolve hostname",
    "Connection refused",
    "No route to host",
    "Name or service not known",
    "Permission denied (publickey",
    "Repository not found",
    "repository not found",
    "Authentication failed",
    "unable to connect to",
)


def _never_connected(stderr: str) -> bool:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return any(m in ln for ln in lines[:3] for m in _NOT_CONNECTED)


def server_lines(stderr: str, limit: int = 50) -> list[str]:
    """The lines the server sent during a push (``remote: ...``: its hooks' own reasons), without the prefix."""
    out = [ln[len("remote: ") :].rstrip() for ln in stderr.splitlines() if ln.startswith("remote: ")]
    out = [ln for ln in out if ln.strip()]
    return out[:limit] + ([f"... and {len(out) - limit} more lines"] if len(out) > limit else [])


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    ours = [ln[len("remote: ") :] for ln in lines if ln.startswith("remote: gitlease:")]
    if ours:  # a server hook of ours said why (gitlease's pre-receive): that is the reason, not git's summary
        return "; ".join(ours[:3])
    for ln in lines:
        if ln.startswith(("fatal:", "ssh:")) or "Could not read" in ln or "unable to access" in ln:
            return ln.split(": ", 1)[-1] if ln.startswith("fatal:") else ln
    return lines[-1] if lines else ""


# ----------------------------------------------------------------------------- local


class LocalStore(Store):
    kind = "local"
    capabilities = Capabilities(shared=False, branches=False, hooks=False, network=False)

    @property
    def name(self) -> str:
        return "local"

    def _transact(self, updates: Sequence[RefUpdate], tx: Transaction) -> Outcome:
        lines = ["start"]
        for u in updates:
            if u.new is None:
                lines.append(f"delete {u.ref} {u.old}")
            elif u.old is None:
                lines.append(f"create {u.ref} {u.new}")
            else:
                lines.append(f"update {u.ref} {u.new} {u.old}")
        lines += ["prepare", "commit"]
        try:
            res = gitcmd.run(
                ["update-ref", "--stdin"],
                cwd=self.repo_dir,
                input=("\n".join(lines) + "\n").encode(),
                timeout=tx.timeout,
                check=False,
            )
        except gitcmd.Timeout as exc:
            return Outcome(ok=False, ambiguous=True, message=str(exc))
        if res.returncode == 0:
            return Outcome(ok=True, statuses={u.ref: "ok" for u in updates})
        msg = _last_error(res.err)
        return Outcome(ok=False, statuses={u.ref: "rejected:" + msg for u in updates}, message=msg)

    def default_head(self, *, timeout: float | None = None) -> tuple[str, str] | None:
        """The repository's own default branch: the branch its main worktree's HEAD names (the common git
        dir's HEAD, the same for every linked worktree), and its commit."""
        res = gitcmd.run(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=self.repo_dir)
        common = res.out.strip()
        # cwd: a process whose own working directory was removed (a long-lived agent) cannot run git without one
        ref = gitcmd.run(["--git-dir", common, "symbolic-ref", "-q", "HEAD"], cwd=common, check=False).out.strip()
        head = gitcmd.run(
            ["--git-dir", common, "rev-parse", "-q", "--verify", "HEAD^{commit}"], cwd=common, check=False
        ).out.strip()
        return (ref or "HEAD", head) if head else None

    def list_namespace(self, prefix: str, *, timeout: float | None = None) -> dict[str, str]:
        """Every ref under ``prefix`` in this repository."""
        res = gitcmd.run(
            ["for-each-ref", "--format=%(objectname) %(refname)", prefix],
            cwd=self.repo_dir,
            timeout=timeout or self.timeout,
        )
        return {ref: oid for oid, _, ref in (line.partition(" ") for line in res.out.splitlines()) if ref}

    def list_refs(self, *, timeout: float | None = None, head: bool = False) -> dict[str, str]:
        res = gitcmd.run(
            ["for-each-ref", "--format=%(objectname) %(refname)", SCOPE_REF, NAMESPACE + "/"],
            cwd=self.repo_dir,
            timeout=timeout or self.timeout,
        )
        refs = {}
        for line in res.out.splitlines():
            oid, _, ref = line.partition(" ")
            if not ref.startswith(RESERVED):
                refs[ref] = oid
        return refs


# --------------------------------------------------------------------- cat-file helpers


def _batch_check(repo_dir: str, names: Sequence[str]) -> dict[str, tuple[str, int]]:
    """{name: (type, size)} for each object name that exists."""
    if not names:
        return {}
    res = gitcmd.run(
        ["cat-file", "--batch-check=%(objecttype) %(objectsize) %(rest)"],
        cwd=repo_dir,
        input="".join(f"{n} {n}\n" for n in names).encode(),
        check=False,
    )
    found: dict[str, tuple[str, int]] = {}
    for line in res.out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1].isdigit():
            found[parts[2]] = (parts[0], int(parts[1]))
    return found


def parse_batch(data: bytes) -> dict[str, tuple[str, bytes]]:
    """``git cat-file --batch='%(objecttype) %(objectsize) %(rest)'`` output (each name given as its own
    rest) -> {name: (type, contents)}; missing objects are left out."""
    out: dict[str, tuple[str, bytes]] = {}
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        header = data[pos:nl].decode("utf-8", "replace").split(" ", 2)
        pos = nl + 1
        if len(header) == 3 and header[1].isdigit():
            size = int(header[1])
            out[header[2]] = (header[0], data[pos : pos + size])
            pos += size + 1
    return out


def _batch_contents(repo_dir: str, names: Sequence[str]) -> dict[str, bytes]:
    res = gitcmd.run(
        ["cat-file", "--batch=%(objecttype) %(objectsize) %(rest)"],
        cwd=repo_dir,
        input="".join(f"{n} {n}\n" for n in names).encode(),
        check=False,
    )
    out = {name: body for name, (_, body) in parse_batch(res.stdout).items()}
    return out


# ----------------------------------------------------------------------------- memory


class _Space:
    """The refs of one in-memory store, shared by every MemoryStore of its name in this process."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.refs: dict[str, str] = {}
        self.origin: dict[str, str] = {}  # commit -> the objects dir it was written in


class MemoryStore(Store):
    """Refs in memory, shared by every MemoryStore of one ``name`` in this process: compare-and-swap, atomic
    multi-ref transactions and git's directory/file rule, applied as a git server applies them. Objects stay
    git's: each writer's repository holds what it wrote, and a reader gets the loose objects of what it reads
    copied into its own (``ensure_objects``). For tests and in-process simulations: the contract suite
    (tests/test_store_contract.py) runs it beside the real stores, so the fast fake cannot lie."""

    kind = "memory"
    capabilities = Capabilities(shared=True, branches=False, hooks=False, network=False)
    _spaces: dict[str, _Space] = {}

    def __init__(self, repo_dir: str, name: str = "memory", *, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(repo_dir, timeout=timeout)
        self._name = name
        self.space = MemoryStore._spaces.setdefault(name, _Space())
        self.objects_dir = _objects_dir(repo_dir)

    @property
    def name(self) -> str:
        return f"memory:{self._name}"

    def _transact(self, updates: Sequence[RefUpdate], tx: Transaction) -> Outcome:
        with self.space.lock:
            refs = self.space.refs
            why = {u.ref: _refusal(refs, u, updates) for u in updates}
            if tx.atomic and any(why.values()):
                statuses = {u.ref: "rejected:" + (why[u.ref] or "atomic push failed") for u in updates}
                return Outcome(ok=False, statuses=statuses, message="failed to push some refs")
            statuses = {}
            for u in updates:
                refused = why[u.ref]
                if refused:
                    statuses[u.ref] = "rejected:" + refused
                    continue
                if u.new is None:
                    refs.pop(u.ref, None)
                else:
                    refs[u.ref] = u.new
                    self.space.origin.setdefault(u.new, self.objects_dir)
                statuses[u.ref] = "ok"
        ok = all(st == "ok" for st in statuses.values())
        return Outcome(ok=ok, statuses=statuses, message="" if ok else "failed to push some refs")

    def list_refs(self, *, timeout: float | None = None, head: bool = False) -> dict[str, str]:
        with self.space.lock:
            return {
                r: o
                for r, o in self.space.refs.items()
                if (r == SCOPE_REF or r.startswith(NAMESPACE + "/")) and not r.startswith(RESERVED)
            }

    def list_namespace(self, prefix: str, *, timeout: float | None = None) -> dict[str, str]:
        with self.space.lock:
            return {r: o for r, o in self.space.refs.items() if r.startswith(prefix)}

    def default_head(self, *, timeout: float | None = None) -> tuple[str, str] | None:
        return None  # no branches: no trust file (an unsigned store)

    def ensure_objects(self, oids: Iterable[str], *, timeout: float | None = None) -> None:
        for oid in oids:
            with self.space.lock:
                src = self.space.origin.get(oid)
            if src is not None and src != self.objects_dir:
                _copy_loose(src, self.objects_dir, oid)


def _refusal(refs: dict[str, str], u: RefUpdate, txn: Sequence[RefUpdate]) -> str | None:
    """Why a git server refuses ``u`` against ``refs`` (None: it does not): its old value differs (stale
    info), or the new name conflicts as a directory or a file with a ref that exists or that the same
    transaction creates (git 2.39 also refuses a delete and a conflicting create in one transaction)."""
    if refs.get(u.ref) != u.old:
        return "stale info"
    if u.new is None or u.old is not None:
        return None
    names = set(refs) | {x.ref for x in txn if x is not u and x.new is not None}
    for other in names:
        if other != u.ref and (other.startswith(u.ref + "/") or u.ref.startswith(other + "/")):
            return f"directory/file conflict with {other}"
    return None


def _objects_dir(repo_dir: str) -> str:
    res = gitcmd.run(["rev-parse", "--path-format=absolute", "--git-path", "objects"], cwd=repo_dir)
    return res.out.strip()


def _copy_loose(src: str, dst: str, oid: str) -> None:
    """Copy commit ``oid`` (its tree, blobs and parents, as far as ``dst`` lacks them) as loose objects."""
    import os
    import shutil
    import zlib

    todo, seen = [oid], set()
    while todo:
        o = todo.pop()
        if o in seen:
            continue
        seen.add(o)
        there = os.path.join(dst, o[:2], o[2:])
        here = os.path.join(src, o[:2], o[2:])
        if os.path.exists(there) or not os.path.exists(here):
            continue
        os.makedirs(os.path.dirname(there), exist_ok=True)
        shutil.copyfile(here, there)
        raw = zlib.decompress(open(here, "rb").read())
        kind, _, body = raw.partition(b"\0")
        if kind.startswith(b"commit"):
            for line in body.split(b"\n\n", 1)[0].split(b"\n"):
                if line.startswith((b"tree ", b"parent ")):
                    todo.append(line.split(b" ", 1)[1].decode())
        elif kind.startswith(b"tree"):
            size = 32 if len(o) == 64 else 20
            pos = 0
            while pos < len(body):
                nul = body.index(b"\0", pos)
                todo.append(body[nul + 1 : nul + 1 + size].hex())
                pos = nul + 1 + size


def open_store(repo_dir: str, remote: str | None, *, timeout: float = DEFAULT_TIMEOUT) -> Store:
    if remote in (None, "", "local"):
        return LocalStore(repo_dir, timeout=timeout)
    if remote.startswith("memory:"):
        return MemoryStore(repo_dir, remote[len("memory:") :], timeout=timeout)
    return RemoteStore(repo_dir, remote, timeout=timeout)


def remote_url(repo_dir: str, remote: str) -> str:
    """The URL git pushes to for ``remote`` (a remote name or a URL; ``insteadOf`` rewrites applied)."""
    res = gitcmd.run(["remote", "get-url", "--push", remote], cwd=repo_dir, check=False)
    if res.returncode != 0:  # not a configured remote name: a URL
        res = gitcmd.run(["ls-remote", "--get-url", remote], cwd=repo_dir, check=False)
    url = res.out.strip() or remote
    return url.rstrip("/")


def same_remote(repo_dir: str, a: str, b: str) -> bool:
    """Whether pushes to ``a`` and to ``b`` reach the same repository (same name, or the same push URL)."""
    return a == b or remote_url(repo_dir, a) == remote_url(repo_dir, b)
