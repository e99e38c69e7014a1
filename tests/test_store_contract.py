"""The store contract (gitlease/core/store.py): what every store must do for the lease protocol to be safe,
checked against each kind the same way: the repository's own refs (local), a remote over file://, git daemon
and smart HTTP, and the in-memory store (so the fast fake cannot lie). A deliberately broken store (one that
applies a multi-ref transaction ref by ref) fails it.

Each check takes two stores on one backing store: ``a`` writes (objects in its own repository), ``b`` reads
from another clone (or worktree)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from conftest import git

from gitlease.core.errors import RemoteUnavailable
from gitlease.core.objects import ObjectWriter
from gitlease.core.refnames import SCOPE_REF, id_ref
from gitlease.core.repo import Repo
from gitlease.core.store import LocalStore, MemoryStore, Outcome, RefUpdate, RemoteStore, Store

_names = itertools.count()


def commit(store: Store, text: str, parent: str | None = None) -> str:
    """A lease-shaped commit (lease.json holding ``text``) written into ``store``'s repository."""
    repo = Repo.discover(store.repo_dir)
    w = ObjectWriter(repo.objects_dir, repo.object_format)
    return w.lease_commit(text.encode(), None, (parent,) if parent else (), "T <t@x>", 1_800_000_000, "c")


def rid(tag: str) -> str:
    return id_ref(f"lease_{tag}{next(_names):06d}")


# ------------------------------------------------------------------------------ the contract


def check_compare_and_swap(a: Store, b: Store) -> None:
    ref, x, y = rid("cas"), commit(a, "x"), commit(a, "y")
    assert a.apply([RefUpdate(ref, x, None)]).ok, "a create of a missing ref lands"
    assert not a.apply([RefUpdate(ref, y, None)]).ok, "a create of an existing ref is refused"
    assert b.list_refs()[ref] == x, "another client sees what landed"
    assert not a.apply([RefUpdate(ref, y, "0" * 40)]).ok, "an update pinned to a stale value is refused"
    assert a.apply([RefUpdate(ref, y, x)]).ok, "an update pinned to the current value lands"
    assert not a.apply([RefUpdate(ref, None, x)]).ok, "a delete pinned to a stale value is refused"
    assert b.list_refs()[ref] == y
    assert a.apply([RefUpdate(ref, None, y)]).ok, "a delete pinned to the current value lands"
    assert ref not in b.list_refs()


def check_atomic(a: Store, b: Store) -> None:
    good, bad = rid("ok"), rid("stale")
    x, y = commit(a, "x"), commit(a, "y")  # a new value: pushing the value a ref has checks nothing (git-facts)
    assert a.apply([RefUpdate(bad, x, None)]).ok
    out = a.apply([RefUpdate(good, x, None), RefUpdate(bad, y, "0" * 40)])
    assert not out.ok, "a transaction with one stale ref is refused"
    assert good not in b.list_refs(), "and nothing of it landed: all or nothing"


def check_directory_file(a: Store, b: Store) -> None:
    base = f"{SCOPE_REF}/df{next(_names)}"
    x = commit(a, "x")
    out = a.apply([RefUpdate(base, x, None), RefUpdate(f"{base}/sub", x, None)])
    assert not out.ok, "a path and a path inside it are never created together"
    assert not {base, f"{base}/sub"} & set(b.list_refs()), "a path and a path inside it are never created together"
    assert a.apply([RefUpdate(f"{base}/sub", x, None)]).ok
    assert not a.apply([RefUpdate(base, x, None)]).ok, "a parent of an existing scope ref is refused"
    assert not a.apply([RefUpdate(f"{base}/sub/deeper", x, None)]).ok, "a child of one is refused"


def check_listing(a: Store, b: Store) -> None:
    ref = rid("list")
    x = commit(a, "x")
    assert a.apply([RefUpdate(ref, x, None)]).ok
    listed = b.list_refs()
    assert listed[ref] == x and all(r == SCOPE_REF or r.startswith("refs/leases/") for r in listed)


def check_objects(a: Store, b: Store) -> None:
    ref = rid("obj")
    v1 = commit(a, '{"v": 1}')
    v2 = commit(a, '{"v": 2}', parent=v1)
    assert a.apply([RefUpdate(ref, v2, None)]).ok
    b.ensure_objects([v2])
    got = b.read([v2])[v2]
    assert got.record == b'{"v": 2}' and got.problem is None, "what one client wrote, another reads"
    assert b.parents([v2]) == {v2: (v1,), v1: ()}, "with its history"


CONTRACT = [check_compare_and_swap, check_atomic, check_directory_file, check_listing, check_objects]


# ------------------------------------------------------------------------------ the stores


def clone_of(base: Path, url: str, name: str) -> Path:
    path = base / name
    git(base, "init", "-q", str(path))
    git(path, "remote", "add", "origin", url)
    return path


@pytest.fixture(params=["local", "file", "daemon", "http", "memory"])
def pair(request, tmp_path) -> tuple[Store, Store]:
    kind = request.param
    if kind == "local":
        main = tmp_path / "main"
        git(tmp_path, "init", "-q", str(main))
        git(main, "commit", "-q", "--allow-empty", "-m", "init")
        git(main, "worktree", "add", "-q", "--detach", str(tmp_path / "other"))
        return LocalStore(str(main)), LocalStore(str(tmp_path / "other"))
    if kind == "memory":
        name = f"contract-{next(_names)}"
        a, b = (tmp_path / "a", tmp_path / "b")
        for p in (a, b):
            git(tmp_path, "init", "-q", str(p))
        return MemoryStore(str(a), name), MemoryStore(str(b), name)
    remote = request.getfixturevalue(f"remote_{kind}")
    a, b = clone_of(tmp_path, remote.url, "a"), clone_of(tmp_path, remote.url, "b")
    return RemoteStore(str(a), "origin", timeout=30), RemoteStore(str(b), "origin", timeout=30)


@pytest.mark.parametrize("check", CONTRACT, ids=[c.__name__.removeprefix("check_") for c in CONTRACT])
def test_every_store_keeps_the_contract(pair, check):
    check(*pair)


def test_each_kind_declares_what_it_can_do():
    assert RemoteStore.capabilities.branches and RemoteStore.capabilities.network and RemoteStore.capabilities.hooks
    assert not LocalStore.capabilities.shared and not LocalStore.capabilities.branches
    assert MemoryStore.capabilities.shared and not MemoryStore.capabilities.network


def test_an_unreachable_store_fails_reads_closed_and_says_writes_never_connected(tmp_path):
    repo = clone_of(tmp_path, str(tmp_path / "nowhere.git"), "a")
    store = RemoteStore(str(repo), "origin", timeout=10)
    with pytest.raises(RemoteUnavailable):
        store.list_refs()
    out = store.apply([RefUpdate(rid("x"), commit(store, "x"), None)])
    assert not out.ok and not out.connected  # nothing can have landed: not an unknown outcome


class NonAtomicStore(MemoryStore):
    """A broken store: it applies a transaction ref by ref, as some servers do (docs/hosts.md)."""

    def apply(self, updates, **kw) -> Outcome:
        outs = [super(NonAtomicStore, self).apply([u], atomic=True) for u in updates]
        statuses = {r: st for o in outs for r, st in o.statuses.items()}
        return Outcome(ok=all(o.ok for o in outs), statuses=statuses)


def test_a_store_that_is_not_atomic_fails_the_contract(tmp_path):
    name = f"broken-{next(_names)}"
    for p in ("a", "b"):
        git(tmp_path, "init", "-q", str(tmp_path / p))
    a, b = NonAtomicStore(str(tmp_path / "a"), name), NonAtomicStore(str(tmp_path / "b"), name)
    check_compare_and_swap(a, b)  # one ref at a time it is fine
    with pytest.raises(AssertionError, match="nothing of it landed"):
        check_atomic(a, b)
    with pytest.raises(AssertionError, match="never created together"):
        check_directory_file(a, b)


def test_the_service_runs_on_the_memory_store(tmp_path):
    """acquire, overlap refused, renew, release: the protocol end to end on the in-memory store, two agents."""
    from gitlease.core.clock import FakeClock
    from gitlease.core.config import resolve
    from gitlease.core.errors import HeldError
    from gitlease.service.leases import LeaseService

    name = f"memory:svc-{next(_names)}"
    clock = FakeClock()
    svcs = []
    for who in ("a", "b"):
        path = tmp_path / who
        git(tmp_path, "init", "-q", str(path))
        git(path, "commit", "-q", "--allow-empty", "-m", "init")
        repo = Repo.discover(str(path))
        svcs.append(LeaseService(repo, resolve(repo.config, env={}, remote=name, agent=who), clock=clock))
    a, b = svcs
    got = a.acquire(["svc"], ttl=60)
    with pytest.raises(HeldError):
        b.acquire(["svc/x.py"], ttl=60)
    assert b.snapshot(use_cache=False).find(got.lease_id).record.owner.agent_id == "a"
    assert a.renew(got.lease_id).record.version == 2
    a.release(got.lease_id)
    assert b.acquire(["svc/x.py"], ttl=60).record.paths == ("svc/x.py",)


def test_a_listing_holds_the_lease_refs_only_and_the_remote_head(tmp_path):
    """``list_refs`` reads ``ls-remote``'s lines in one split: HEAD's symref line and its commit go to
    ``default_head``; a tag's peeled line, a ref that only ends like a lease ref (ls-remote matches patterns at
    the tail), and doctor's probe refs are not lease refs."""
    bare = tmp_path / "store.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    repo = clone_of(tmp_path, str(bare), "a")
    store = RemoteStore(str(repo), "origin", timeout=10)
    lease, scope, other = rid("ls"), SCOPE_REF + "/pkg/a.py", commit(store, "y")
    x = commit(store, "x")
    git(repo, "tag", "-a", "-m", "t", "t1", x)
    tag = git(repo, "rev-parse", "t1").strip()
    git(repo, "commit", "-q", "--allow-empty", "-m", "main")
    main = git(repo, "rev-parse", "HEAD").strip()
    pushed = [f"{x}:{lease}", f"{x}:{scope}", f"{tag}:refs/leases/tagged", f"{other}:refs/x/refs/leases/y"]
    git(repo, "push", "-q", "origin", "HEAD:refs/heads/main", *pushed, f"{x}:refs/leases/doctor/probe")
    assert store.list_refs() == {lease: x, scope: x, "refs/leases/tagged": tag}
    assert store.list_refs(head=True) == {lease: x, scope: x, "refs/leases/tagged": tag}
    assert store.listed_head() == main and store.default_head() == ("refs/heads/main", main)
