"""The pre-push hook's lean path (gitlease/enforce/quickpush.py): it lets a push through only where the full
check against the store (enforce/verify.py) would, and it does let through what touches no lease.

Each case builds a real store (a bare remote, leases taken by the real service from another clone), then asks
both checks about the same push, in-process, from the pushing worktree: the lean path's answer must be "allowed"
only where the full check allows (and for the cases built to touch nothing, it must be "allowed" once its
digest is written, or the path would be a stub). The hook itself, as git runs it, is checked at the end."""

import os

import pytest
from conftest import cli, git
from test_hooks import acquire, commit, run

from gitlease.enforce import entry, quickpush, verify

ZERO = "0" * 40


@pytest.fixture
def store(pushing, make_repo):
    """(the pushing clone, with hooks; the bare remote, its HEAD on main, as on any host; another clone that
    takes leases)."""
    r, bare = pushing
    git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
    other = make_repo("other")
    git(other, "config", "lease.remote", bare.as_uri())
    return r, bare, other


def both(r, data, monkeypatch, remote="origin"):
    """(the lean path's answer, the full check's (allowed, lines)) on the push ``data`` from ``r``; then the
    digest written as the hook writes it after a full check."""
    monkeypatch.chdir(r)
    url = git(r, "remote", "get-url", remote).strip() if remote == "origin" else remote
    quick = quickpush.Quick(remote, url, data, entry.lease_config(also=r"|remote\..*\.mirror$"), str(r / ".git"))
    ok, lines, _code = verify.pre_push(remote, url, data, quick.given())
    quick.remember()
    return quick.allowed, (ok, lines)


def push_of(r, *paths, ref="refs/heads/main"):
    """A commit of ``paths`` on top of the remote's main (not pushed): the pre-push stdin line for it."""
    old = git(r, "rev-parse", "origin/main").strip()
    git(r, "reset", "-q", "--hard", old)
    assert commit(r, *paths, extra=("--no-verify",)).returncode == 0
    new = git(r, "rev-parse", "HEAD").strip()
    remote_old = old if ref == "refs/heads/main" else ZERO
    return f"refs/heads/x {new} {ref} {remote_old}\n".encode()


def learn(r, data, monkeypatch):
    """Two full checks of a push on the same listing: the first notes the listing, the second (the store was
    quiet between them) writes the digest for it."""
    both(r, data, monkeypatch)
    both(r, data, monkeypatch)


def agree(r, data, monkeypatch, *, allowed: bool, lean: bool):
    """Both checks on ``data``, three times (the third with the digest the second wrote): the full check says
    ``allowed``; the lean one says "allowed" the third time exactly when ``lean`` (and never where the full
    check refuses)."""
    answers = []
    for _ in range(3):
        got, (ok, lines) = both(r, data, monkeypatch)
        assert ok is allowed, lines
        assert got is None or (got is True and ok), (answers, got, lines)
        answers.append(got)
    assert (answers[-1] is True) is lean, (answers, lines)


def test_a_push_outside_every_lease_is_let_through_by_the_lean_path(store, monkeypatch):
    r, _bare, other = store
    acquire(other, "billing", agent="agent-b", task="task-b")
    acquire(other, "docs/guide", agent="agent-b", task="task-c")
    agree(r, push_of(r, "free/a", "docs/other", "billingx/y"), monkeypatch, allowed=True, lean=True)
    agree(r, push_of(r, "free/b", ref="refs/heads/topic"), monkeypatch, allowed=True, lean=True)  # a new branch


@pytest.mark.parametrize(
    "leased,pushed,allowed",
    [
        ("billing", "billing/x", False),  # inside
        (".", "anything/at/all", False),  # the whole repository
        ("billing/api", "billing", True),  # a file named like a folder above the lease: outside it, but near
        ("docs/guide/intro.md/x", "docs/guide/intro.md", True),  # a lease below a pushed file: the same
    ],
)
def test_a_push_near_a_lease_goes_to_the_full_check(store, monkeypatch, leased, pushed, allowed):
    """Inside a lease: refused by the full check. Overlapping one without being inside it (a pushed path above
    or below a leased one): allowed by the full check, and still left to it (the lean path's test is overlap)."""
    r, _bare, other = store
    acquire(other, leased, agent="agent-b", task="task-b")
    agree(r, push_of(r, pushed, "free/z"), monkeypatch, allowed=allowed, lean=False)


def test_a_torn_lease_and_an_odd_scope_ref_still_block_and_the_lean_path_defers(store, monkeypatch):
    """A lease whose scope ref is gone (its id ref and record left) blocks its path by its record; a scope ref
    gitlease cannot have written blocks what it names, and no digest is written while it is listed."""
    r, bare, other = store
    torn = acquire(other, "torn", agent="agent-b", task="task-b")
    git(bare, "update-ref", "-d", "refs/leases/scope/torn")
    agree(r, push_of(r, "torn/x"), monkeypatch, allowed=False, lean=False)
    agree(r, push_of(r, "free/x"), monkeypatch, allowed=True, lean=True)
    grant = git(bare, "rev-parse", f"refs/leases/id/{torn}").strip()
    git(bare, "update-ref", "refs/leases/scope/odd/%zz", grant)
    agree(r, push_of(r, "odd/%zz/y"), monkeypatch, allowed=False, lean=False)
    agree(r, push_of(r, "free/y"), monkeypatch, allowed=True, lean=False)


def test_a_lease_taken_after_the_digest_was_written_is_seen(store, monkeypatch):
    """The digest answers only for the listing it was written for: a new lease changes the listing."""
    r, _bare, other = store
    acquire(other, "early", agent="agent-b", task="task-b")
    agree(r, push_of(r, "late/x"), monkeypatch, allowed=True, lean=True)
    acquire(other, "late", agent="agent-b", task="task-c")
    first, (ok, lines) = both(r, push_of(r, "late/x"), monkeypatch)
    assert first is None and not ok and any("late" in line for line in lines), (first, lines)


def test_a_store_whose_leases_move_between_pushes_gets_no_digest(store, monkeypatch):
    """A digest is written only when two full checks in a row saw the same listing: a store whose leases move
    between pushes (renewals, here) never pays for one it could not use."""
    r, _bare, other = store
    digest = r / ".git" / "gitlease" / "cache" / quickpush.DIGEST
    lease = acquire(other, "billing", agent="agent-b", task="task-b")
    for k in range(3):
        assert both(r, push_of(r, f"free/{k}"), monkeypatch) == (None, (True, []))
        assert not digest.exists()
        assert cli(other, "renew", lease).returncode == 0, "the listing moves"
    both(r, push_of(r, "free/x"), monkeypatch)  # the listing after the last renewal, noted
    assert not digest.exists()
    both(r, push_of(r, "free/y"), monkeypatch)  # the same listing again: now it is written
    assert digest.exists()


def test_a_released_lease_defers_until_the_digest_is_written_again(store, monkeypatch):
    """A lease released since the digest was written: the listing changed, so the full check answers (and
    allows), and the next push of the same paths takes the lean path again."""
    r, _bare, other = store
    lease = acquire(other, "gone", agent="agent-b", task="task-b")
    agree(r, push_of(r, "gone/x"), monkeypatch, allowed=False, lean=False)
    cli(other, "release", lease)
    agree(r, push_of(r, "gone/x"), monkeypatch, allowed=True, lean=True)


@pytest.mark.parametrize("setup", ["held", "strict", "mirror", "signing-key", "other-store", "wipe"])
def test_what_the_lean_path_leaves_to_the_full_check(store, monkeypatch, setup):
    """Whatever the lean path cannot judge by itself: it answers None, whatever the digest says."""
    r, bare, other = store
    acquire(other, "billing", agent="agent-b", task="task-b")
    data = push_of(r, "free/x")
    learn(r, data, monkeypatch)  # the digest, written
    assert both(r, data, monkeypatch)[0] is True
    if setup == "held":
        acquire(r, "free", agent="agent-a", task="task-a")
        data = push_of(r, "free/x")
    elif setup == "strict":
        git(r, "config", "lease.enforce", "strict")
    elif setup == "mirror":
        git(r, "config", "remote.origin.mirror", "true")
    elif setup == "signing-key":
        git(r, "config", "lease.signingKey", str(r / "no-such-key"))
    elif setup == "other-store":
        git(r, "remote", "add", "elsewhere", str(bare))
        got = quickpush.Quick("elsewhere", str(bare), data, entry.lease_config(), str(r / ".git"))
        assert got.allowed is None
        return
    elif setup == "wipe":
        lease_ref = git(bare, "for-each-ref", "--format=%(refname)", "refs/leases/id/").split()[0]
        data += f"(delete) {ZERO} {lease_ref} {git(bare, 'rev-parse', lease_ref).strip()}\n".encode()
    monkeypatch.chdir(r)
    got = quickpush.Quick("origin", "origin", data, entry.lease_config(also=r"|remote\..*\.mirror$"), str(r / ".git"))
    assert got.allowed is None


def test_a_signed_store_is_left_to_the_full_check(store, monkeypatch):
    """A trust file on the store's default branch: what it says may refuse a push whatever the leases."""
    r, _bare, other = store
    git(r, "reset", "-q", "--hard", "origin/main")
    (r / ".gitlease").mkdir()
    (r / ".gitlease" / "allowed_signers").write_text("# nobody yet\n")
    git(r, "add", ".gitlease")
    git(r, "commit", "-q", "-m", "trust file")
    assert run(r, "push", "-q", "--no-verify", "origin", "HEAD:main").returncode == 0
    git(r, "fetch", "-q", "origin")
    data = push_of(r, "free/x")
    learn(r, data, monkeypatch)
    assert both(r, data, monkeypatch)[0] is None


def test_the_installed_hook_takes_the_lean_path_and_lists_the_store_once_either_way(store):
    """As git runs it: a push outside every lease costs the hook four git processes (config, the listing,
    the trust file's ls-tree, one log) once the digest is written (by the second full check that saw the same
    listing), and none of the library's; a push the lean path defers lists the store once (the full check reads
    the lean path's listing)."""
    r, _bare, other = store
    acquire(other, "billing", agent="agent-b", task="task-b")
    traces = []
    for k, path in enumerate(("free/a", "free/b", "free/c", "billing/d")):
        git(r, "reset", "-q", "--hard", "origin/main")
        assert commit(r, path, extra=("--no-verify",)).returncode == 0
        trace = r.parent / f"trace{k}"
        res = run(r, "push", "-q", "origin", "HEAD:main", env={"GIT_TRACE": str(trace)})
        assert res.returncode == (1 if path.startswith("billing") else 0), res.stderr
        lines = [ln for ln in trace.read_text().splitlines() if "built-in: git " in ln]
        traces.append([ln.split("built-in: git ", 1)[1].split()[0] for ln in lines])
        git(r, "fetch", "-q", "origin")
    noted, written, lean, refused = traces
    for full in (noted, written):
        assert full.count("ls-remote") == 1 and "rev-parse" in full, full  # the full check ran
    assert lean.count("ls-remote") == 1 and "ls-tree" in lean and "rev-parse" not in lean, lean
    assert refused.count("ls-remote") == 1 and "rev-parse" in refused, refused
    assert os.path.exists(r / ".git" / "gitlease" / "cache" / quickpush.DIGEST)


def test_the_lean_path_imports_only_a_little_stdlib(store, monkeypatch):
    """What lets the lean path cost little: started as the hook starts it (``python -S``), a push it lets
    through imports none of subprocess, json, re, typing, dataclasses, sqlite3, nor the service."""
    import subprocess
    import sys

    from conftest import ROOT

    r, _bare, other = store
    acquire(other, "billing", agent="agent-b", task="task-b")
    data = push_of(r, "free/x")
    learn(r, data, monkeypatch)  # the digest, written
    code = (
        "import sys; sys.path.append(sys.argv[1]); from gitlease.enforce import entry, quickpush; "
        "q = quickpush.Quick('origin', 'origin', sys.argv[2].encode(), entry.lease_config(also=r'|remote\\..*\\.mirror$'), "
        "entry.git_dir()); heavy = {'subprocess', 'dataclasses', 'typing', 'json', 're', 'sqlite3', 'hashlib', "
        "'gitlease.service.leases', 'gitlease.core.scope', 'gitlease.core.gitq'} & set(sys.modules); "
        "assert q.allowed is True and not heavy, (q.allowed, heavy)"
    )
    res = subprocess.run(
        [sys.executable, "-S", "-c", code, str(ROOT), data.decode()], cwd=r, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("path", [".gitlease/allowed_signers", "allowed_signers", "a/b/trust", "x/"])
def test_the_lean_path_looks_for_the_signer_files_where_the_trust_module_reads_them(path):
    from gitlease.identity import trust

    assert quickpush.signers_dir(path) == trust.signers_dir(path)


def test_the_hooks_runner_kills_a_git_that_outlives_its_timeout_with_its_helpers(tmp_path):
    """``hookgit.run`` with a timeout: git (here an alias whose shell sleeps, as ssh would hang) is killed with
    everything it started, within the timeout, and the caller hears None (the lean path then defers)."""
    import time

    from gitlease.core import hookgit

    marker = f"{os.getpid()}.{time.monotonic_ns() % 10**6}"
    started = time.monotonic()
    got = hookgit.run(["-c", f"alias.nap=!sleep 60 || echo {marker}", "nap"], cwd=str(tmp_path), timeout=0.5)
    assert got is None and time.monotonic() - started < 30

    def alive() -> list[str]:
        found = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(pid)
            except OSError:
                continue
        return found

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:  # killed at once; reaped by init a moment later
        time.sleep(0.05)  # polling real processes for their exit, not letting a timeout or TTL pass
    assert not alive()
    assert hookgit.run(["--version"], timeout=30)[0] == 0
