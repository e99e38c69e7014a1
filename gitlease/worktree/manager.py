"""Worktrees bound to leases: lease the scope first, then attach a clean worktree; reuse only what is
provably clean; never lose work.

A worktree attached by gitlease ("managed") lives under ``lease.worktreeRoot`` and carries:

- git's own lock (``git worktree lock --reason "gitlease: lease <id> ..."``), so ``git worktree prune`` and
  ``git worktree remove`` leave it alone while it is in use;
- ``<its git dir>/gitlease/worktree.json`` (this module's metadata: id, branch, base, bound lease, state);
- ``<its git dir>/gitlease/held.json`` with the lease it holds (the lease *moves* there from the worktree that
  acquired it, so renew, release and the hooks run inside the worktree);
- ``lease.enforce = strict`` in its per-worktree config (``extensions.worktreeConfig``).

Releasing a lease never removes its worktree and removing a worktree never releases its lease: the two are
given back independently (docs/worktrees.md). Every destructive step (a checkout that resets a pooled worktree,
removing a worktree, deleting a task branch) is preceded by a fresh inspection and uses git's own
non-destructive forms (``checkout`` without ``-f``, ``worktree remove`` without ``-f`` unless the work was
saved to a quarantine ref first, ``update-ref -d`` pinned to the oid that was checked).

Library code: raises gitlease.core.errors, prints nothing.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gitlease.core import gitq
from gitlease.core import scope as scopes
from gitlease.core.clock import iso, parse_iso
from gitlease.core.config import LOCAL
from gitlease.core.errors import GitError, GitLeaseError, InvalidRecord, LeaseLost, NotHeld, UsageError
from gitlease.core.fsutil import locked, write_json
from gitlease.core.procs import process_start, same_process
from gitlease.core.repo import Repo
from gitlease.core.state import Held, HeldState
from gitlease.identity.signer import commit_signing_config
from gitlease.service.leases import Acquired, LeaseService

META = "worktree.json"
BUSY = "busy.json"
POOL_LOCK = "worktrees.lock"
QUARANTINE_PREFIX = "refs/gitlease/quarantine/"
REASON_PREFIX = "gitlease:"
DEFAULT_BRANCH_PREFIX = "lease/"
IDENT = ("gitlease", "gitlease@localhost")  # author and committer of a quarantine snapshot

# Files in a worktree's git dir that mean an operation is half done.
IN_PROGRESS = (
    ("MERGE_HEAD", "merge in progress"),
    ("CHERRY_PICK_HEAD", "cherry-pick in progress"),
    ("REVERT_HEAD", "revert in progress"),
    ("rebase-merge", "rebase in progress"),
    ("rebase-apply", "rebase or am in progress"),
    ("BISECT_LOG", "bisect in progress"),
    ("BISECT_START", "bisect in progress"),
    ("sequencer", "cherry-pick/revert sequence in progress"),
)


# ------------------------------------------------------------------------------- records


@dataclass
class Meta:
    """gitlease's metadata of one managed worktree (``<git dir>/gitlease/worktree.json``)."""

    id: str
    path: str
    branch: str
    base: str  # the base as the user named it
    base_oid: str
    state: str  # bound (to a lease) | free (in the pool) | quarantined
    created_at: str
    since: str  # when it entered its current state
    lease: str | None = None
    last_lease: str | None = None
    claim: dict | None = None  # {"pid", "start", "token"}: a command is attaching it right now
    quarantine_ref: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Worktree:
    """One linked worktree as git lists it, with gitlease's metadata when it is managed."""

    path: str
    git_dir: str
    head: str | None
    branch: str | None  # short name, None when detached
    locked: str | None  # the lock reason ("" when locked without one), None when unlocked
    prunable: bool
    meta: Meta | None

    @property
    def id(self) -> str:
        return self.meta.id if self.meta else os.path.basename(self.path)

    @property
    def private_dir(self) -> str:
        return os.path.join(self.git_dir, "gitlease")

    @property
    def exists(self) -> bool:
        return os.path.isdir(self.path)


@dataclass
class Inspection:
    dirt: list[str]  # reasons it holds work (never reset or removed without saving)
    busy: list[str]  # live processes bound to it

    @property
    def clean(self) -> bool:
        return not self.dirt and not self.busy

    def reasons(self) -> list[str]:
        return self.dirt + self.busy


@dataclass
class Attached:
    id: str
    path: str
    branch: str
    base: str
    base_oid: str
    lease_id: str
    reused: bool
    skipped: list[tuple[str, list[str]]]  # pool worktrees not reused, and why
    acquired: Acquired | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "workspaceId": self.id,
            "path": self.path,
            "branch": self.branch,
            "base": self.base,
            "baseOid": self.base_oid,
            "leaseId": self.lease_id,
            "reused": self.reused,
            "skipped": [{"workspaceId": i, "reasons": r} for i, r in self.skipped],
        }


@dataclass
class Entry:
    """A row of ``worktree list``."""

    worktree: Worktree
    lease: str | None
    lease_state: str  # active | expired | released | none | unknown
    inspection: Inspection
    age: int | None

    @property
    def state(self) -> str:
        if not self.worktree.exists:
            return "missing"
        return self.worktree.meta.state if self.worktree.meta else "unmanaged"

    def to_json(self) -> dict[str, object]:
        wt, meta = self.worktree, self.worktree.meta
        return {
            "workspaceId": wt.id,
            "path": wt.path,
            "managed": meta is not None,
            "state": self.state,
            "branch": wt.branch,
            "head": wt.head,
            "leaseId": self.lease,
            "leaseState": self.lease_state,
            "clean": self.inspection.clean,
            "dirt": self.inspection.dirt,
            "busy": self.inspection.busy,
            "ageSeconds": self.age,
            "since": meta.since if meta else None,
            "locked": wt.locked,
            "quarantineRef": meta.quarantine_ref if meta else None,
        }


@dataclass
class PruneAction:
    id: str
    action: str  # pooled | removed | quarantined | kept | skipped
    reasons: list[str]
    ref: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"workspaceId": self.id, "action": self.action, "reasons": self.reasons, "quarantineRef": self.ref}


# ------------------------------------------------------------------------------- manager


_POOL_HELD = threading.local()  # the pool locks this thread holds (path -> depth): taken once, nested freely


@contextlib.contextmanager
def pool_lock(repo: Repo, *, shared: bool = False) -> Iterator[None]:
    """The pool lock of ``repo``'s worktrees: exclusive for what changes worktrees, shared for a reader. git
    reads every worktree's admin files in ``worktree list`` and ``lock``, ``fetch`` (its connectivity check walks
    every worktree's HEAD) and more, and fails on a half-made one of a concurrent ``git worktree add`` ("failed
    to read .../commondir", "bad object worktrees/<id>/HEAD"). Re-entrant within a thread (an flock taken
    twice by one process through two files would wait for itself); the outer mode holds."""
    path = os.path.join(repo.shared_dir(), POOL_LOCK)
    held: dict[str, int] = _POOL_HELD.__dict__.setdefault("depth", {})
    with contextlib.nullcontext() if held.get(path) else locked(path, shared=shared):
        held[path] = held.get(path, 0) + 1
        try:
            yield
        finally:
            held[path] -= 1


class WorktreeManager:
    def __init__(self, service: LeaseService) -> None:
        self.svc = service
        self.repo: Repo = service.repo
        self.clock = service.clock
        self._token = os.urandom(8).hex()

    # ----------------------------------------------------------------------------- places
    def main_dir(self) -> str:
        """The main worktree (or the bare repository's directory)."""
        common = self.repo.common_dir.rstrip("/")
        return os.path.dirname(common) if os.path.basename(common) == ".git" else common

    def root(self) -> str:
        configured = self.svc.settings.worktree_root
        main = self.main_dir()
        if configured:
            path = os.path.expanduser(configured)
            return os.path.normpath(path if os.path.isabs(path) else os.path.join(main, path))
        name = os.path.basename(main)
        if name.endswith(".git"):
            name = name[:-4]
        return os.path.join(os.path.dirname(main), f"{name}.worktrees")

    def _pool_lock(self, *, shared: bool = False) -> contextlib.AbstractContextManager[None]:
        return pool_lock(self.repo, shared=shared)

    # ------------------------------------------------------------------------------ listing
    def worktrees(self) -> list[Worktree]:
        """Every linked worktree of the repository (not the main one)."""
        with self._pool_lock(shared=True):
            listed = {os.path.realpath(w["worktree"]): w for w in gitq.worktree_list(self.repo.cwd)}
        out = []
        admin = os.path.join(self.repo.common_dir, "worktrees")
        for name in sorted(os.listdir(admin)) if os.path.isdir(admin) else []:
            git_dir = os.path.join(admin, name)
            try:
                with open(os.path.join(git_dir, "gitdir"), encoding="utf-8", errors="surrogateescape") as fh:
                    dotgit = fh.read().strip()
            except OSError:
                continue
            path = os.path.dirname(dotgit)
            info = listed.get(os.path.realpath(path), {})
            branch = info.get("branch")
            locked = info.get("locked")
            if "locked" not in info and os.path.exists(os.path.join(git_dir, "locked")):
                locked = _read_text(os.path.join(git_dir, "locked")).strip()
            out.append(
                Worktree(
                    path=path,
                    git_dir=git_dir,
                    head=info.get("HEAD") or _head_of(git_dir),
                    branch=branch[len("refs/heads/") :]
                    if branch and branch.startswith("refs/heads/")
                    else (None if "detached" in info or not branch else branch),
                    locked=locked,
                    prunable="prunable" in info or not os.path.isdir(path),
                    meta=_load_meta(git_dir),
                )
            )
        return out

    def managed(self) -> list[Worktree]:
        return [w for w in self.worktrees() if w.meta is not None]

    def find(self, workspace: str) -> Worktree:
        """A worktree by its id, its path, or its git admin name, in that order: git picks admin names itself,
        so one worktree's admin name can be another's id (found by the fleet soak: the wrong worktree was
        quarantined)."""
        want = os.path.realpath(workspace) if os.sep in workspace else None
        trees = self.worktrees()
        for match in (
            lambda wt: wt.id == workspace,
            lambda wt: bool(want) and os.path.realpath(wt.path) == want,
            lambda wt: os.path.basename(wt.git_dir) == workspace,
        ):
            for wt in trees:
                if match(wt):
                    return wt
        raise UsageError(f"no worktree {workspace!r} in {self.main_dir()} (see 'git lease worktree list')")

    # ------------------------------------------------------------------------ lease views
    def lease_of(self, wt: Worktree) -> tuple[str | None, str, Held | None]:
        """(lease id, active|expired|released|none|unknown, the held entry). Local knowledge: the worktree's
        held.json is the only place its lease can be renewed or released from."""
        lease = wt.meta.lease if wt.meta else None
        held_all: dict[str, Held]
        try:
            held_all = HeldState(wt.private_dir).load()
        except InvalidRecord:
            return lease, "unknown", None
        if lease is None:
            if wt.meta is None and held_all:  # an unmanaged worktree that holds leases itself
                lease = sorted(held_all)[0]
            else:
                return None, "none", None
        held = held_all.get(lease)
        if held is None:
            return lease, "released", None
        return lease, "active" if self.clock.now() < _expiry(held) else "expired", held

    def _lease_free(self, wt: Worktree) -> bool:
        """Every lease the worktree holds (its bound one, and any acquired inside it since) is released or
        expired beyond the skew margin, so nobody may still be writing under it."""
        try:
            held = HeldState(wt.private_dir).load()
        except InvalidRecord:
            return False
        now, skew = self.clock.now(), self.svc.settings.skew
        return all(now > _expiry(h) + skew for h in held.values())

    def _drop_dead_leases(self, wt: Worktree) -> None:
        """Forget held entries expired beyond the skew margin (renewal after expiry is refused anyway)."""
        now, skew = self.clock.now(), self.svc.settings.skew
        with HeldState(wt.private_dir).locked() as held:
            for lease_id in [k for k, h in held.items() if now > _expiry(h) + skew]:
                del held[lease_id]

    # ------------------------------------------------------------------------- inspection
    def inspect(self, wt: Worktree) -> Inspection:
        """Everything that makes a worktree not provably clean. Read-only."""
        if not wt.exists:
            return Inspection([f"directory {wt.path} is missing (deleted by hand?)"], [])
        dirt: list[str] = []
        meta = wt.meta
        branch = _current_branch(wt)
        if branch is None:
            dirt.append("detached HEAD (not on its task branch)")
        elif meta and branch != meta.branch:
            dirt.append(f"HEAD is on branch {branch}, not its task branch {meta.branch}")
        dirt += _status_dirt(wt, self.svc.settings.worktree_disposable)
        dirt += _hidden_changes(wt)
        for name, label in IN_PROGRESS:
            if os.path.exists(os.path.join(wt.git_dir, name)) and label not in dirt:
                dirt.append(label)
        branches = {b for b in (branch, meta.branch if meta else None) if b}
        own = _own_stashes(wt, branches)
        if own:
            dirt.append(
                f"{own} stash entr{'y' if own == 1 else 'ies'} of its own (branch {', '.join(sorted(branches))})"
            )
        n = _only_here(wt, branch)
        if n:
            dirt.append(f"{n} unpushed commit{'s' if n > 1 else ''} (on no other branch, remote or tag)")
        return Inspection(dirt, self._busy(wt))

    def _busy(self, wt: Worktree) -> list[str]:
        out = []
        meta = wt.meta
        if meta and meta.claim and _alive(meta.claim) and meta.claim.get("token") != self._token:
            out.append(f"being attached by process {meta.claim.get('pid')}")
        busy = _read_json(os.path.join(wt.private_dir, BUSY))
        if isinstance(busy, dict) and _alive(busy):
            out.append(f"process {busy.get('pid')} is running a command in it ({busy.get('command', '?')})")
        try:
            held = HeldState(wt.private_dir).load()
        except InvalidRecord:
            held = {}
            out.append("its held.json is corrupt")
        for h in held.values():
            pid, start = _holder(h)
            if pid and process_start(pid) == start and _same_host(h):
                out.append(f"lease holder process {pid} is alive")
        out += [f"process {pid} has its working directory in it" for pid in _procs_in(wt.path)]
        return out

    # ------------------------------------------------------------------------ attaching
    def acquire(
        self, raw_scopes: Sequence[str], *, base: str | None = None, branch: str | None = None, **lease_args: Any
    ) -> Attached:
        """Lease first (recording this worktree's id as workspaceId), then attach the worktree. ``lease_args``:
        ``LeaseService.acquire``'s (``ttl``, ``holder_pid``, ``renew_every``, ``stop_after``, ...)."""
        paths = scopes.normalize_all(raw_scopes)
        base_name, base_oid = self.resolve_base(base)
        if branch is not None:
            _check_branch_name(self.repo.cwd, branch)
        chosen, skipped = self._choose(paths)
        try:
            got = self.svc.acquire(paths, workspace=_id_of(chosen), **lease_args)
        except BaseException:
            self._unchoose(chosen)
            raise
        try:
            att = self._attach(chosen, got.lease_id, base_name, base_oid, branch, skipped)
        except Exception as exc:
            self._unchoose(chosen)
            why = exc.message if isinstance(exc, GitLeaseError) else f"{type(exc).__name__}: {exc}"
            raise GitLeaseError(
                f"lease {got.lease_id} acquired, but no worktree was attached: {why} "
                f"(the lease is held here: 'git lease worktree add {got.lease_id}' or "
                f"'git lease release {got.lease_id}')",
                leaseId=got.lease_id,
            ) from None
        att.acquired = got
        return att

    def add(self, lease_id: str, *, base: str | None = None, branch: str | None = None) -> Attached:
        """Attach a worktree to a lease this worktree already holds (the lease moves into it)."""
        held = self._held_here(lease_id)
        base_name, base_oid = self.resolve_base(base)
        if branch is not None:
            _check_branch_name(self.repo.cwd, branch)
        chosen, skipped = self._choose(tuple(held.paths))
        try:
            return self._attach(chosen, lease_id, base_name, base_oid, branch, skipped)
        except BaseException:
            self._unchoose(chosen)
            raise

    def _held_here(self, lease_id: str) -> Held:
        h = self.svc.held_here().get(lease_id)
        if h is None:
            for wt in self.managed():
                if wt.meta and wt.meta.lease == lease_id and self.lease_of(wt)[1] in ("active", "expired"):
                    raise NotHeld(f"lease {lease_id} is already attached to worktree {wt.id} ({wt.path})")
            raise NotHeld(f"lease {lease_id} is not held by this worktree ({self.repo.cwd})")
        if self.clock.now() >= _expiry(h):
            raise LeaseLost(f"lease {lease_id} expired at {h.expires_at}; acquire a new one")
        return h

    def resolve_base(self, base: str | None) -> tuple[str, str]:
        """The base ref and its commit. Default: origin/HEAD, else origin/main, else this worktree's HEAD."""
        candidates = [base] if base else ["origin/HEAD", "origin/main", "HEAD"]
        for name in candidates:
            oid = gitq.rev_parse_commit(self.repo.cwd, name)
            if oid:
                return name, oid
        if base:
            raise UsageError(f"base {base!r} does not exist here (fetch it first, or pass another --base)")
        raise UsageError("no base to start a worktree from: this repository has no commit yet; pass --base")

    def _choose(self, paths: Sequence[str]) -> tuple[Worktree | str, list[tuple[str, list[str]]]]:
        """Under the pool lock: claim a free, provably clean worktree, or reserve a fresh directory (its
        name is the new worktree's id). Returns the claimed Worktree or the reserved path."""
        skipped: list[tuple[str, list[str]]] = []
        with self._pool_lock():
            every = self.worktrees()
            here = os.path.realpath(self.repo.worktree) if self.repo.worktree else None
            for wt in every:
                meta = wt.meta
                if (
                    meta is None
                    or meta.state == "quarantined"
                    or os.path.realpath(wt.path) == here
                    or not self._lease_free(wt)
                ):
                    continue
                if meta.claim and _alive(meta.claim) and meta.claim.get("token") != self._token:
                    skipped.append((wt.id, [f"being attached by process {meta.claim.get('pid')}"]))
                    continue  # (not inspected: another agent is re-inspecting it right now)
                insp = self.inspect(wt)
                if not insp.clean:
                    skipped.append((wt.id, insp.reasons()))
                    continue
                meta.claim = {
                    "pid": os.getpid(),
                    "start": process_start(os.getpid()),
                    "token": self._token,
                    "at": iso(self.clock.now()),
                }
                _save_meta(wt.git_dir, meta)
                return self._rename_for(wt, paths, {os.path.basename(w.path) for w in every}), skipped
            return self._reserve(paths, {os.path.basename(w.path) for w in every}), skipped

    def _rename_for(self, wt: Worktree, paths: Sequence[str], taken: set[str]) -> Worktree:
        """A pooled worktree takes the name of its new task (``wt-docs-1`` reused for libs/payments becomes
        ``wt-payments-1``): ``git worktree move``, under the pool lock, before the lease records its id. A
        move git refuses leaves the old name (a name is a label, not a guarantee)."""
        slug = _slug(paths, os.path.basename(self.main_dir()))
        name = os.path.basename(wt.path)
        if re.fullmatch(rf"wt-{re.escape(slug)}-\d+", name) or wt.meta is None:
            return wt
        parent = os.path.dirname(wt.path)
        n = 1
        while f"wt-{slug}-{n}" in taken or os.path.lexists(os.path.join(parent, f"wt-{slug}-{n}")):
            n += 1
        new = os.path.join(parent, f"wt-{slug}-{n}")
        reason = wt.locked
        if reason is not None:
            gitq.worktree_unlock(self.repo.cwd, wt.path)
        moved = gitq.worktree_move(self.repo.cwd, wt.path, new)
        path = new if moved else wt.path
        if reason is not None:
            gitq.worktree_lock(self.repo.cwd, path, reason, check=False)
        if not moved:
            return wt
        meta = wt.meta
        meta.id, meta.path = os.path.basename(new), new
        _save_meta(wt.git_dir, meta)
        return Worktree(new, wt.git_dir, wt.head, wt.branch, wt.locked, wt.prunable, meta)

    def _reserve(self, paths: Sequence[str], taken: set[str]) -> str:
        root = self.root()
        os.makedirs(root, exist_ok=True)
        slug = _slug(paths, os.path.basename(self.main_dir()))
        n = 1
        while True:
            name = f"wt-{slug}-{n}"
            path = os.path.join(root, name)
            if name not in taken and not os.path.lexists(path):
                try:
                    os.mkdir(path)
                    return path
                except FileExistsError:
                    pass
            n += 1

    def _unchoose(self, chosen: Worktree | str) -> None:
        if isinstance(chosen, str):
            with contextlib.suppress(OSError):
                os.rmdir(chosen)  # only ever removes the empty directory we made
            return
        meta = _load_meta(chosen.git_dir)
        if meta and meta.claim and meta.claim.get("token") == self._token:
            meta.claim = None
            _save_meta(chosen.git_dir, meta)

    def _attach(
        self,
        chosen: Worktree | str,
        lease_id: str,
        base_name: str,
        base_oid: str,
        branch: str | None,
        skipped: list[tuple[str, list[str]]],
    ) -> Attached:
        branch = branch or DEFAULT_BRANCH_PREFIX + lease_id
        reason = self._reason(lease_id)
        now = iso(self.clock.now())
        self._ensure_worktree_config()
        if isinstance(chosen, str):
            path, meta = chosen, self._attach_new(chosen, lease_id, branch, reason, (base_name, base_oid), now)
            git_dir = _git_dir_of(path)
        else:
            path, git_dir, meta = chosen.path, chosen.git_dir, self._attach_pooled(chosen, branch, reason, base_oid)
            meta.branch, meta.base, meta.base_oid = branch, base_name, base_oid
            meta.state, meta.since, meta.lease, meta.quarantine_ref = "bound", now, lease_id, None
        _save_meta(git_dir, meta)
        self._configure(path)
        self._move_held(lease_id, HeldState(os.path.join(git_dir, "gitlease")), self.svc.held)
        meta.claim = None  # bound: its held.json now says who holds it
        _save_meta(git_dir, meta)
        return Attached(
            id=meta.id,
            path=path,
            branch=branch,
            base=base_name,
            base_oid=base_oid,
            lease_id=lease_id,
            reused=not isinstance(chosen, str),
            skipped=skipped,
        )

    def _attach_new(self, path: str, lease_id: str, branch: str, reason: str, base: tuple[str, str], now: str) -> Meta:
        """A new worktree at the reserved ``path``, on a new ``branch`` at ``base`` (name, commit), locked with
        ``reason``; its metadata (not saved yet), claimed by this process."""
        base_name, base_oid = base
        with self._pool_lock():  # git worktree add/list are not safe against a concurrent add ("failed
            # to read worktrees/<id>/gitdir" while the other one writes it): every add and listing of ours
            # runs under the pool lock
            gitq.worktree_add(self.repo.cwd, path, base_oid, branch=branch, lock_reason=reason)
        meta = Meta(
            id=os.path.basename(path),
            path=path,
            branch=branch,
            base=base_name,
            base_oid=base_oid,
            state="bound",
            created_at=now,
            since=now,
            lease=lease_id,
        )
        # claimed until its held.json names the lease: until then it looks free and clean to a racing
        # _choose (the pool lock is not held while attaching)
        meta.claim = {"pid": os.getpid(), "start": process_start(os.getpid()), "token": self._token, "at": now}
        return meta

    def _attach_pooled(self, wt: Worktree, branch: str, reason: str, base_oid: str) -> Meta:
        """A pooled worktree, inspected again, reset to a new ``branch`` at ``base_oid`` and locked anew."""
        assert wt.meta is not None
        insp = self.inspect(wt)  # again, right before the only step that moves its files
        if not insp.clean:
            raise GitLeaseError(
                f"worktree {wt.id} stopped being clean while it was being attached: {'; '.join(insp.reasons())}"
            )
        self._drop_dead_leases(wt)
        old_branch, old_tip = _current_branch(wt), wt.head
        # checkout without -f refuses to overwrite any local change: the reset cannot destroy work
        gitq.checkout_new_branch(wt.path, branch, base_oid)
        if old_branch and old_branch != branch and old_tip:
            _delete_branch_if_contained(wt.path, old_branch, old_tip)
        with self._pool_lock():  # git worktree lock/unlock read every worktree's admin files: not during an add
            gitq.worktree_unlock(self.repo.cwd, wt.path)
            gitq.worktree_lock(self.repo.cwd, wt.path, reason)
        return wt.meta

    def _configure(self, path: str) -> None:
        """A bound worktree's own config: strict enforcement, this command's lease store, and commit signing
        with the lease's key (its claims are honoured on a signed store)."""
        gitq.config_set(path, "lease.enforce", "strict", scope="worktree")
        gitq.config_unset(path, "lease.remote", scope="worktree", check=False)
        store = self.svc.settings.remote or ("" if self.svc.settings.store_unset else LOCAL)
        if store and self.repo.config.get("lease.remote") != store:
            gitq.config_set(path, "lease.remote", store, scope="worktree")
        for key, value in commit_signing_config(self.svc.settings.signing_key):
            gitq.config_set(path, key, value, scope="worktree")

    def _reason(self, lease_id: str) -> str:
        """The lock reason: the lease and its owner as recorded (falling back to this command's settings)."""
        task, agent = self.svc.settings.task, self.svc.settings.agent
        held = self.svc.held_here().get(lease_id)
        if held is not None:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                owner = json.loads(held.record)["owner"]
                task, agent = str(owner["taskId"]), str(owner["agentId"])
        return f"{REASON_PREFIX} lease {lease_id} (task {task}, agent {agent})"

    @staticmethod
    def _move_held(lease_id: str, dst: HeldState, src: HeldState) -> None:
        """Copy the held entry first, then drop it at the source: a crash in between leaves it in both
        (the stale copy fails its next renew with 'lease lost'), never in neither."""
        entry = src.load().get(lease_id)
        if entry is None or dst.path == src.path:
            return
        with dst.locked() as held:
            held[lease_id] = Held(**vars(entry))
        with src.locked() as held:
            held.pop(lease_id, None)

    def _ensure_worktree_config(self) -> None:
        """Turn on ``extensions.worktreeConfig`` (needed by ``git config --worktree``), moving ``core.bare``
        (when true) and ``core.worktree`` from the shared config into the main worktree's own config.worktree,
        as git's own ``init_worktree_config`` does; otherwise every linked worktree of a bare repository
        would start to believe it is bare."""
        common = os.path.join(self.repo.common_dir, "config")
        main_wt = os.path.join(self.repo.common_dir, "config.worktree")

        cwd = self.repo.cwd

        def on() -> bool:
            return gitq.config_get(cwd, "extensions.worktreeConfig", type="bool", file=common) == "true"

        if on():
            return
        with self._pool_lock():
            if on():
                return
            if gitq.config_get(cwd, "core.bare", type="bool", file=common) == "true":
                gitq.config_set(cwd, "core.bare", "true", file=main_wt)
                gitq.config_unset(cwd, "core.bare", file=common)
            wt_value = gitq.config_get(cwd, "core.worktree", file=common)
            if wt_value is not None:
                gitq.config_set(cwd, "core.worktree", wt_value, file=main_wt)
                gitq.config_unset(cwd, "core.worktree", file=common)
            gitq.config_set(cwd, "extensions.worktreeConfig", "true", file=common)

    # ------------------------------------------------------------------------------ list
    def list(self) -> list[Entry]:
        now = self.clock.now()
        out = []
        with self._pool_lock(shared=True):
            found = self.worktrees()
        for wt in found:
            lease, state, _ = self.lease_of(wt)
            age = None
            if wt.meta:
                with contextlib.suppress(ValueError):
                    age = int(now - parse_iso(wt.meta.created_at))
            out.append(Entry(wt, lease, state, self.inspect(wt), age))
        return out

    # ----------------------------------------------------------------------------- prune
    def prune(
        self, *, remove: bool = False, select: Callable[[Worktree], bool] | None = None
    ) -> builtins.list[PruneAction]:
        """Worktrees of released or expired leases: clean ones go back to the pool (or are removed with
        ``remove``); dirty ones are quarantined (kept, unlocked, out of the pool, their changes saved to a
        ref) and reported. Busy, missing and active ones are left alone and reported. ``select``: only the
        worktrees it accepts (the queue runner: its task worktrees)."""
        actions = []
        with self._pool_lock():
            for wt in self.managed():
                meta = wt.meta
                assert meta is not None
                if select is not None and not select(wt):
                    continue
                if not wt.exists:
                    actions.append(
                        PruneAction(
                            wt.id, "kept", self.inspect(wt).dirt + [f"'git lease worktree remove {wt.id}' forgets it"]
                        )
                    )
                    continue
                if not self._lease_free(wt):  # an active lease (or one within the skew margin) lives in it
                    continue
                if meta.state == "free" and not remove:
                    continue
                insp = self.inspect(wt)
                if self.repo.worktree and os.path.realpath(wt.path) == os.path.realpath(self.repo.worktree):
                    insp.busy.append("this command runs in it")
                if insp.busy:
                    actions.append(PruneAction(wt.id, "skipped", insp.busy))
                    continue
                if insp.dirt:
                    if meta.state == "quarantined":
                        actions.append(PruneAction(wt.id, "kept", insp.dirt, meta.quarantine_ref))
                        continue
                    ref = self._quarantine(wt, insp)
                    actions.append(PruneAction(wt.id, "quarantined", insp.dirt, ref))
                    continue
                if remove:
                    self._remove(wt, save=False)
                    actions.append(PruneAction(wt.id, "removed", []))
                else:
                    self._to_pool(wt)
                    actions.append(PruneAction(wt.id, "pooled", []))
        return actions

    def repair(self, path: str) -> bool:
        """Put back the link of the worktree at ``path`` to the repository (its ``.git`` file, which a command run
        there may delete: ``git worktree repair``). True when it was missing and is back."""
        if os.path.exists(os.path.join(path, ".git")) or not os.path.isdir(path):
            return False
        with self._pool_lock():
            gitq.worktree_repair(self.repo.cwd, path)
        return os.path.exists(os.path.join(path, ".git"))

    def give_back(self, workspace: str, *, quarantine_only: bool = False) -> tuple[str, str | None]:
        """The queue runner's end of a task in one worktree (``git lease work``): dirty work is quarantined
        (saved to a ref, kept out of the pool) and the ref returned; a clean worktree goes back to the pool,
        unless ``quarantine_only`` (its lease is still held: pooled after the release). Returns (state, ref):
        quarantined | pooled | kept. Unless ``quarantine_only``, this process's busy mark (``mark_busy``) on
        it goes too."""
        with self._pool_lock():
            wt = self.find(workspace)
            if wt.meta is None or not wt.exists:
                return "kept", None
            insp = self.inspect(wt)
            if insp.dirt:
                if not quarantine_only:
                    self._unmark_busy(wt)
                if wt.meta.state == "quarantined":
                    return "quarantined", wt.meta.quarantine_ref
                return "quarantined", self._quarantine(wt, insp)
            if quarantine_only or not self._lease_free(wt):
                return "kept", None
            self._to_pool(wt)
            self._unmark_busy(wt)
            return "pooled", None

    def _to_pool(self, wt: Worktree) -> None:
        meta = wt.meta
        assert meta is not None
        self._drop_dead_leases(wt)
        _clean_disposable(wt, self.svc.settings.worktree_disposable)
        now = iso(self.clock.now())
        if meta.lease:
            meta.last_lease = meta.lease
        meta.state, meta.since, meta.lease, meta.claim, meta.quarantine_ref = "free", now, None, None, None
        _save_meta(wt.git_dir, meta)
        gitq.worktree_unlock(self.repo.cwd, wt.path)
        reason = f"{REASON_PREFIX} pool, free since {now} (last lease {meta.last_lease or 'none'})"
        gitq.worktree_lock(self.repo.cwd, wt.path, reason)

    def _quarantine(self, wt: Worktree, insp: Inspection) -> str:
        meta = wt.meta
        assert meta is not None
        ref = self.save(wt, insp, include_ignored=False)
        now = iso(self.clock.now())
        if meta.lease:
            meta.last_lease = meta.lease
        meta.state, meta.since, meta.claim, meta.quarantine_ref = "quarantined", now, None, ref
        meta.notes = insp.dirt
        _save_meta(wt.git_dir, meta)
        gitq.worktree_unlock(self.repo.cwd, wt.path)
        return ref

    def save(self, wt: Worktree, insp: Inspection, *, include_ignored: bool) -> str:
        """Snapshot the worktree (HEAD, the index, the working tree with untracked files, optionally ignored
        files) into a commit under refs/gitlease/quarantine/, without touching the worktree or its index."""
        tmp = os.path.join(wt.private_dir, f"save-index-{os.getpid()}-{os.urandom(4).hex()}")
        os.makedirs(wt.private_dir, exist_ok=True)
        index = os.path.join(wt.git_dir, "index")
        scratch = gitq.with_index(wt.path, tmp)
        try:
            head = gitq.rev_parse(wt.path, "HEAD")
            parents = [head] if head else []
            if os.path.exists(index):
                shutil.copyfile(index, tmp)
                staged = gitq.write_tree(scratch, check=False)
                if staged and head:  # the index as a second parent, like git stash (unless unmerged)
                    parents.append(gitq.commit_tree(wt.path, staged, [head], "index", ident=IDENT))
                # files marked skip-worktree or assume-unchanged are saved as they are on disk, too
                _unmark(wt, _marked(wt), tmp)
            gitq.add_all(scratch, ignored=include_ignored)
            tree = gitq.write_tree(scratch)
            assert tree is not None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        meta = wt.meta
        msg = (
            f"gitlease quarantine of {wt.id} ({wt.path})\n\nbranch: {meta.branch if meta else wt.branch}\n"
            f"lease: {(meta.lease or meta.last_lease) if meta else None}\n"
            + "".join(f"reason: {r}\n" for r in insp.dirt)
            + ("ignored files: included\n" if include_ignored else "ignored files: not included (kept on disk)\n")
        )
        commit = gitq.commit_tree(wt.path, tree, parents, msg, ident=IDENT)
        stamp = iso(self.clock.now()).replace(":", "").replace("-", "")
        ref = f"{QUARANTINE_PREFIX}{wt.id}/{stamp}-{os.urandom(3).hex()}"
        gitq.update_ref(self.repo.cwd, ref, commit, "0" * len(commit), message="gitlease quarantine")
        return ref

    # ----------------------------------------------------------------------------- remove
    def remove(self, workspace: str, *, save: bool = False) -> tuple[Worktree, str | None, str | None]:
        """Remove a worktree. Refuses when it holds uncommitted work (unless ``save``: the work goes to a
        quarantine ref first) or a live process is bound to it. A lease it holds is handed back to the
        worktree running this (removing a worktree does not release its lease). Returns (worktree, saved
        ref, lease handed back)."""
        with self._pool_lock():
            wt = self.find(workspace)
            return (wt, *self._remove(wt, save=save))

    def _remove(self, wt: Worktree, *, save: bool) -> tuple[str | None, str | None]:
        if wt.meta is None:
            raise UsageError(f"worktree {wt.path} was not attached by gitlease; use 'git worktree remove'")
        if os.path.realpath(wt.path) == os.path.realpath(self.repo.cwd):
            raise UsageError(f"cannot remove the worktree this command runs in ({wt.path}); run it from another")
        insp = self.inspect(wt)
        if insp.busy:
            raise GitLeaseError(f"worktree {wt.id} is in use: {'; '.join(insp.busy)}", busy=insp.busy)
        # What removing the directory would destroy (unpushed commits and stashes survive: their refs stay).
        at_risk = (
            [
                d
                for d in insp.dirt
                if not d.startswith(("detached", "HEAD is on")) and "stash" not in d and "unpushed" not in d
            ]
            if wt.exists
            else []
        )
        if wt.exists and _current_branch(wt) is None and _only_here(wt, None):
            at_risk.append("commits on a detached HEAD that no ref holds")
        ref = None
        if at_risk and not save:
            raise GitLeaseError(
                f"worktree {wt.id} has uncommitted work: {'; '.join(at_risk)} (commit it, or "
                "pass --save to keep it in a quarantine ref, then remove)",
                dirt=at_risk,
            )
        if at_risk:
            nested = _nested_repositories(wt)
            if nested:  # a snapshot holds only a gitlink for them: their contents would be lost
                raise GitLeaseError(
                    f"worktree {wt.id} contains another repository ({', '.join(nested[:3])}); "
                    "move it out first: --save cannot keep its contents"
                )
            ref = self.save(wt, insp, include_ignored=True)
        handed = self._hand_back(wt)
        gitq.worktree_unlock(self.repo.cwd, wt.path)
        if wt.exists:
            res = gitq.worktree_remove(self.repo.cwd, wt.path, force=bool(ref))
            if res.returncode != 0:
                gitq.worktree_lock(self.repo.cwd, wt.path, f"{REASON_PREFIX} removal failed", check=False)
                raise GitError(
                    f"git worktree remove {wt.path} failed: {res.err.strip()}",
                    cmd=list(res.cmd),
                    returncode=res.returncode,
                    stderr=res.err,
                )
        else:
            gitq.worktree_prune(self.repo.cwd)
        meta = wt.meta
        if meta and wt.head and meta.branch and not ref:
            _delete_branch_if_contained(self.repo.cwd, meta.branch, wt.head)
        return ref, handed

    def _hand_back(self, wt: Worktree) -> str | None:
        """Move a lease the worktree still holds back to the worktree running this command."""
        try:
            held = HeldState(wt.private_dir).load()
        except InvalidRecord:
            raise GitLeaseError(f"worktree {wt.id}'s held.json is corrupt; move it aside before removing") from None
        for lease_id in list(held):
            self._move_held(lease_id, self.svc.held, HeldState(wt.private_dir))
        return ", ".join(sorted(held)) or None

    # ---------------------------------------------------------------------- process binding
    @contextlib.contextmanager
    def busy(self, workspace: str, command: str) -> Iterator[Worktree]:
        """Mark a worktree as in use by this process while a command runs in it (``git lease run
        --worktree``): reuse, prune and remove see the pid file and leave it alone."""
        wt = self.mark_busy(workspace, command)
        try:
            yield wt
        finally:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(wt.private_dir, BUSY))

    def mark_busy(self, workspace: str, command: str) -> Worktree:
        """Bind a worktree to this process (``busy.json``: pid and start time) until ``give_back`` or the
        process ends: prune, reuse and remove leave it alone while the process lives, also after its lease
        is released (the queue runner, between its release and its give-back). A process killed with -9
        leaves a stale mark that binds nothing."""
        wt = self.find(workspace)
        os.makedirs(wt.private_dir, exist_ok=True)
        _write_json(
            os.path.join(wt.private_dir, BUSY),
            {
                "pid": os.getpid(),
                "start": process_start(os.getpid()),
                "command": command[:200],
                "at": iso(self.clock.now()),
            },
        )
        return wt

    def _unmark_busy(self, wt: Worktree) -> None:
        """Drop this process's busy mark on ``wt`` (another live process's mark stays)."""
        path = os.path.join(wt.private_dir, BUSY)
        mark = _read_json(path)
        if isinstance(mark, dict) and mark.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(path)


# ------------------------------------------------------------------------------ helpers


def _id_of(chosen: Worktree | str) -> str:
    return chosen.id if isinstance(chosen, Worktree) else os.path.basename(chosen)


def _slug(paths: Sequence[str], fallback: str) -> str:
    first = paths[0] if paths else scopes.ROOT
    last = fallback if first == scopes.ROOT else first.rstrip("/").rsplit("/", 1)[-1]
    slug = re.sub(r"[^a-z0-9]+", "-", last.lower()).strip("-")[:24].strip("-")
    return slug or "repo"


def _check_branch_name(cwd: str, branch: str) -> None:
    if not gitq.valid_branch_name(cwd, branch):
        raise UsageError(f"{branch!r} is not a valid branch name")
    if gitq.ref_exists(cwd, f"refs/heads/{branch}"):
        raise UsageError(f"branch {branch!r} already exists; pick another --branch")


def _git_dir_of(path: str) -> str:
    return gitq.git_dir(path)


def _on(wt: Worktree) -> gitq.At:
    """The worktree addressed from outside it (``--git-dir``/``--work-tree``, run in its git dir), so that one
    agent's inspection is never itself "a process with its working directory in it" for another's."""
    return gitq.outside(wt.git_dir, wt.path)


def _current_branch(wt: Worktree) -> str | None:
    return gitq.current_branch(_on(wt))


def _head_of(git_dir: str) -> str | None:
    text = _read_text(os.path.join(git_dir, "HEAD")).strip()
    return text if re.fullmatch(r"[0-9a-f]{40,64}", text) else None


def _marked(wt: Worktree) -> list[str]:
    """Index entries marked skip-worktree or assume-unchanged (``git ls-files -v``: ``S``, or a lower-case
    tag) whose file is on disk."""
    return [p for p in gitq.flagged_paths(_on(wt)) if os.path.lexists(os.path.join(wt.path, p))]


def _unmark(wt: Worktree, paths: Sequence[str], index: str) -> bool:
    """Clear both bits of ``paths`` in the index file ``index``. Paths are given from the top of the worktree
    (``:/`` is no pathspec here), so git runs with the worktree's top as its cwd."""
    return gitq.clear_flags(gitq.with_index(gitq.outside(wt.git_dir, wt.path, cwd=wt.path), index), paths)


def _hidden_changes(wt: Worktree) -> list[str]:
    """Edits ``git status`` does not show: files marked ``--skip-worktree`` or ``--assume-unchanged`` whose
    contents on disk differ from the index. Checked on a copy of the index with those bits cleared, so git
    itself compares (filters, modes, symlinks). A marked file that is not on disk (sparse checkout) loses
    nothing and is not dirt; anything that cannot be checked is."""
    marked = _marked(wt)
    if not marked:
        return []
    index = os.path.join(wt.git_dir, "index")
    tmp = os.path.join(wt.git_dir, f"gitlease-hidden-index-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        shutil.copyfile(index, tmp)
        if not _unmark(wt, marked, tmp):
            return [f"{len(marked)} files marked skip-worktree or assume-unchanged that could not be checked"]
        scratch = gitq.with_index(_on(wt), tmp)
        gitq.refresh_index(scratch)
        changed = gitq.changed_files(scratch)
        if changed is None:
            return [f"{len(marked)} files marked skip-worktree or assume-unchanged that could not be checked"]
        n = len(changed)
    except OSError:
        return [f"{len(marked)} files marked skip-worktree or assume-unchanged that could not be checked"]
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if not n:
        return []
    return [f"{n} hidden change{'s' if n > 1 else ''} (files marked skip-worktree or assume-unchanged)"]


def _disposable(path: str, patterns: Sequence[str]) -> bool:
    """Whether an ignored path (``dir/`` for a directory) lies inside, or is, something ``patterns`` calls
    disposable: a pattern without ``/`` matches any one path component (``__pycache__``, ``*.pyc``), one with
    ``/`` consecutive components (``node_modules/.cache``)."""
    from fnmatch import fnmatchcase

    parts = path.rstrip("/").split("/")
    for pat in patterns:
        want = [p for p in pat.strip("/").split("/") if p]
        if not want:
            continue
        for i in range(len(parts) - len(want) + 1):
            if all(fnmatchcase(parts[i + j], want[j]) for j in range(len(want))):
                return True
    return False


def _ignored(wt: Worktree) -> list[str]:
    return [e.path for e in gitq.status(_on(wt), ignored=True) if e.kind == "!"]


def _clean_disposable(wt: Worktree, patterns: Sequence[str]) -> list[str]:
    """Delete the ignored files and folders ``patterns`` call disposable (build and test leftovers) before a
    worktree goes back to the pool; every other ignored file stays. Returns what was deleted."""
    gone = []
    root = os.path.realpath(wt.path)
    for rel in _ignored(wt):
        if not _disposable(rel, patterns):
            continue
        full = os.path.realpath(os.path.join(wt.path, rel.rstrip("/")))
        if not full.startswith(root + os.sep):
            continue
        with contextlib.suppress(OSError):
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
            gone.append(rel)
    return gone


def _status_dirt(wt: Worktree, disposable: Sequence[str] = ()) -> list[str]:
    staged = unstaged = unmerged = untracked = ignored = 0
    for e in gitq.status(_on(wt), ignored=True, submodules=True):
        if e.kind in ("1", "2"):
            staged += e.xy[0] != "."
            unstaged += e.xy[1] != "."
        elif e.kind == "u":
            unmerged += 1
        elif e.kind == "?":
            untracked += 1
        elif e.kind == "!":
            ignored += not _disposable(e.path, disposable)
    out = []
    for n, label in (
        (staged, "staged change"),
        (unstaged, "unstaged change"),
        (unmerged, "unmerged path"),
        (untracked, "untracked file"),
        (ignored, "ignored file"),
    ):
        if n:
            out.append(f"{n} {label}{'s' if n > 1 else ''}")
    return out


def _nested_repositories(wt: Worktree) -> list[str]:
    """Untracked or ignored directories that are repositories of their own (git status does not descend)."""
    return [
        e.path
        for e in gitq.status(_on(wt), ignored=True)
        if e.kind in ("?", "!") and e.path.endswith("/") and os.path.exists(os.path.join(wt.path, e.path, ".git"))
    ]


def _own_stashes(wt: Worktree, branches: set[str]) -> int:
    """Stashes are shared by all worktrees; one is this worktree's when git's own message names its
    branch ("WIP on BRANCH: ..." or "On BRANCH: ...")."""
    if not branches:
        return 0
    heads = tuple(p for b in branches for p in (f"WIP on {b}: ", f"On {b}: "))
    return sum(1 for line in gitq.stash_subjects(_on(wt)) if line.startswith(heads))


def _only_here(wt: Worktree, branch: str | None) -> int:
    """Commits reachable from HEAD that no other branch, remote-tracking branch or tag holds."""
    return gitq.count_unshared(_on(wt), "HEAD", branch) or 0


def _delete_branch_if_contained(cwd: str, branch: str, tip: str) -> bool:
    """Delete a task branch only when another branch, remote or tag holds every commit of it, pinned to
    the tip that was checked (update-ref -d BRANCH OID)."""
    ref = f"refs/heads/{branch}"
    if gitq.rev_parse(cwd, ref) != tip or gitq.count_unshared(cwd, ref, branch) != 0:
        return False
    return gitq.delete_ref(cwd, ref, tip)


def _procs_in(path: str) -> list[int]:
    """Processes (visible to us) whose working directory is inside ``path``, other than this one and its
    parent (the ``git`` that started ``git lease``)."""
    real = os.path.realpath(path)
    me = {os.getpid(), os.getppid()}
    out = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid in me:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == real or cwd.startswith(real + "/"):
            out.append(pid)
    return sorted(out)


def _alive(binding: dict) -> bool:
    try:
        pid = int(binding.get("pid") or 0)
    except (TypeError, ValueError):
        return False
    start = binding.get("start")
    return start is not None and same_process(pid, start)


def _holder(h: Held) -> tuple[int, int | None]:
    try:
        owner = json.loads(h.record).get("owner", {})
        return int(owner.get("pid") or 0), owner.get("pidStart")
    except (ValueError, AttributeError, TypeError):
        return 0, None


def _same_host(h: Held) -> bool:
    try:
        return json.loads(h.record).get("owner", {}).get("host") == os.uname().nodename
    except (ValueError, AttributeError):
        return False


def _expiry(h: Held) -> float:
    exp = parse_iso(h.expires_at)
    if h.pending_record:  # a renewal whose outcome is unknown may have extended it: assume it did
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            exp = max(exp, parse_iso(json.loads(h.pending_record)["expiresAt"]))
    return exp


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read()
    except OSError:
        return ""


def _read_json(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _write_json(path: str, doc: object) -> None:
    write_json(path, doc, pretty=True)


def _load_meta(git_dir: str) -> Meta | None:
    doc = _read_json(os.path.join(git_dir, "gitlease", META))
    if not isinstance(doc, dict):
        return None
    try:
        return Meta(**doc)
    except TypeError:
        return None


def _save_meta(git_dir: str, meta: Meta) -> None:
    folder = os.path.join(git_dir, "gitlease")
    os.makedirs(folder, exist_ok=True)
    _write_json(os.path.join(folder, META), asdict(meta))


__all__ = ["WorktreeManager", "Worktree", "Meta", "Inspection", "Attached", "Entry", "PruneAction"]
