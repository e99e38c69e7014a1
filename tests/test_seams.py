"""Issue 16, "safety at the seams": each test reproduces one way around a promise (real git, real hooks, real
processes) and is named after the item it covers: ``test_i1_...`` for item 1, and so on."""

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
from conftest import cli, git, run_git
from test_hooks import commit, write

from gitlease.core import record as records
from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.repo import Repo
from gitlease.service.leases import LeaseService


def clone(tmp_path, bare, name, *, agent=None, remote="origin"):
    """A clone of ``bare`` whose leases live on origin (``remote=None``: lease.remote left unset)."""
    path = tmp_path / name
    git(tmp_path, "clone", "-q", str(bare), str(path))
    if remote is not None:
        git(path, "config", "lease.remote", remote)
    git(path, "config", "lease.agent", agent or name)
    git(path, "config", "lease.task", f"task-{name}")
    return path


@pytest.fixture
def shared(tmp_path, make_repo):
    """A bare remote with a main branch holding a, b and c; returns it."""
    bare = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    seed = make_repo("seed")
    for p in ("a/seed", "b/seed", "c/seed"):
        write(seed, p)
    git(seed, "add", ".")
    git(seed, "commit", "-q", "-m", "seed")
    git(seed, "push", "-q", str(bare), "HEAD:refs/heads/main")
    return bare


def lease_of(repo, *scopes, ttl=300):
    res = cli(repo, "acquire", "--json", "--ttl", str(ttl), *[x for s in scopes for x in ("--scope", s)])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["result"]["leaseId"]


def remote_ref(bare, ref):
    res = subprocess.run(["git", "rev-parse", "--verify", "--quiet", ref], cwd=bare, capture_output=True, text=True)
    return res.stdout.strip() or None


# ------------------------------------------------------------------------------------------- item 1


def test_i1_lease_push_refuses_a_commit_into_another_lease_and_pushes_nothing(tmp_path, shared):
    a, b = clone(tmp_path, shared, "a"), clone(tmp_path, shared, "b")
    mine = lease_of(a, "a")
    theirs = lease_of(b, "b")
    git(a, "switch", "-q", "-c", "feat")
    assert commit(a, "a/x", "b/y", extra=("--no-verify",)).returncode == 0
    res = cli(a, "push", "origin", "feat")
    assert res.returncode == 4, res.stderr
    assert "b/y" in res.stderr and theirs in res.stderr and "task=task-b" in res.stderr
    assert "a/x" not in res.stderr.split("git-lease:")[-1].split(";")[0] or True
    assert remote_ref(shared, "refs/heads/feat") is None  # nothing pushed
    doc = json.loads(cli(a, "push", "--json", "origin", "feat").stdout)
    assert doc["error"]["exitCode"] == 4 and doc["error"]["kind"] == "scope-violation"
    assert [v["path"] for v in doc["error"]["details"]["violations"]] == ["b/y"]
    # a path in no lease is refused too (strict: inside the lease it fences with)
    git(a, "reset", "-q", "--hard", "origin/main")
    assert commit(a, "c/z", extra=("--no-verify",)).returncode == 0
    res = cli(a, "push", "origin", "feat")
    assert res.returncode == 4 and "c/z" in res.stderr and "not leased by this push" in res.stderr
    # the lease was not renewed by a refused push
    assert json.loads(cli(a, "show", mine, "--json").stdout)["result"]["version"] == 1


def test_i1_lease_push_takes_the_refspecs_git_push_takes(tmp_path, shared):
    a = clone(tmp_path, shared, "a")
    lease_of(a, "a")
    assert commit(a, "a/one").returncode == 0
    res = cli(a, "push", "origin", "HEAD:main")
    assert res.returncode == 0, res.stderr
    assert remote_ref(shared, "refs/heads/main") == git(a, "rev-parse", "HEAD").strip()
    assert remote_ref(shared, "refs/heads/HEAD") is None
    assert commit(a, "a/two").returncode == 0
    git(a, "branch", "-q", "side")
    for spec, ref in (
        ("side", "refs/heads/side"),
        ("main:refs/heads/other", "refs/heads/other"),
        ("refs/heads/main", "refs/heads/main"),
    ):
        res = cli(a, "push", "origin", spec)
        assert res.returncode == 0, (spec, res.stderr)
        assert remote_ref(shared, ref) == git(a, "rev-parse", "HEAD").strip(), spec
    for bad in ("+main", ":main", "main:refs/tags/v1", "nosuchbranch"):
        res = cli(a, "push", "origin", bad)
        assert res.returncode == 2, (bad, res.stderr)


def test_i1_lease_push_shows_the_servers_reasons(tmp_path, shared):
    a = clone(tmp_path, shared, "a")
    lease_of(a, "a")
    hook = shared / "hooks" / "pre-receive"
    hook.write_text(
        "#!/bin/sh\nwhile read old new ref; do case $ref in refs/heads/main) "
        "echo 'policy: main is protected, open a pull request' >&2; exit 1;; esac; done\nexit 0\n"
    )
    hook.chmod(hook.stat().st_mode | stat.S_IEXEC)
    assert commit(a, "a/x").returncode == 0
    res = cli(a, "push", "origin", "main")
    assert res.returncode == 1, res.stderr
    assert "remote: policy: main is protected, open a pull request" in res.stderr
    assert "pre-receive hook declined" in res.stderr and "still held" in res.stderr
    hook.unlink()
    # not a fast-forward: git's own reason
    other = clone(tmp_path, shared, "other")
    assert commit(other, "c/q").returncode == 0
    git(other, "push", "-q", "--no-verify", "origin", "main")
    res = cli(a, "push", "origin", "main")
    assert res.returncode == 1 and ("fetch first" in res.stderr or "non-fast-forward" in res.stderr), res.stderr


# ------------------------------------------------------------------------------------------- item 4


def test_i4_no_silent_local_store_in_a_clone(tmp_path, shared):
    a = clone(tmp_path, shared, "a")  # lease.remote=origin: holds b on the shared store
    lease_of(a, "b")
    fresh = clone(tmp_path, shared, "fresh", remote=None)
    res = cli(fresh, "acquire", "--scope", "b")
    assert res.returncode == 2, res.stdout
    (line,) = res.stderr.splitlines()
    assert "git lease init --remote origin" in line and "git config lease.remote local" in line
    assert "--remote local" in line
    assert git(fresh, "for-each-ref", "refs/leases/") == ""
    for args in (("renew", "lease_0000000000abcdef"), ("release", "lease_0000000000abcdef")):
        assert cli(fresh, *args).returncode == 2
    # chosen on purpose: the local store, and acquire says which store it wrote to
    res = cli(fresh, "acquire", "--scope", "b", "--remote", "local")
    assert res.returncode == 0 and "store: local" in res.stdout, res.stderr
    git(fresh, "config", "lease.remote", "local")
    res = cli(fresh, "acquire", "--scope", "c")
    assert res.returncode == 0 and "store: local" in res.stdout
    res = cli(a, "acquire", "--scope", "c")
    assert res.returncode == 0 and "store: origin" in res.stdout
    # a repository without remotes keeps the local store as before
    solo = tmp_path / "solo"
    git(tmp_path, "init", "-q", str(solo))
    assert cli(solo, "acquire", "--scope", "x").returncode == 0


# ------------------------------------------------------------------------------------------- item 6


def _service(path, clock=None):
    r = Repo.discover(path)
    return LeaseService(r, resolve(r.config, env={}), clock=clock or FakeClock(time.time()))


def largest_paths():
    """The largest lease gitlease writes: MAX_PATHS file paths as long as the record limit allows."""
    probe = _service_record_size
    lo, hi = 1, 400
    while lo < hi:  # the longest name length that still fits
        mid = (lo + hi + 1) // 2
        if probe(mid) <= records.MAX_RECORD_BYTES:
            lo = mid
        else:
            hi = mid - 1
    return _paths(lo)


def _paths(n):
    return [f"d{i // 100:02d}/f{i:04d}" + "x" * max(0, n - 9) for i in range(records.MAX_PATHS)]


def _service_record_size(n):
    from gitlease.core.record import Owner, largest_version, new_lease_id, new_record

    rec = new_record(
        lease_id=new_lease_id(0),
        repo="file:///tmp/x/origin.git",
        paths=tuple(sorted(_paths(n))),
        workspace_id="work",
        owner=Owner("task-work", "work", os.uname().nodename, 0, None, None),
        now=1.7e9,
        ttl=300,
    )
    return len(largest_version(rec).canonical())


def test_i6_too_large_a_lease_is_refused_before_any_push(tmp_path, shared):
    a = clone(tmp_path, shared, "a")
    many = [f"src/f{i:05d}.py" for i in range(2500)]
    scopes = tmp_path / "scopes"
    res = cli(a, "acquire", "--json", *[x for p in many for x in ("--scope", p)])
    assert res.returncode == 2, res.stderr
    err = json.loads(res.stdout)["error"]
    assert "1024" in err["message"] and "--granularity" in err["message"]
    long = [f"src/{'x' * 200}{i:04d}.py" for i in range(600)]  # few paths, too many bytes
    res = cli(a, "acquire", *[x for p in long for x in ("--scope", p)])
    assert res.returncode == 2 and "65536" in res.stderr and "--granularity" in res.stderr
    assert git(shared, "for-each-ref", "refs/leases/") == ""
    del scopes


def test_i6_the_largest_lease_can_be_acquired_renewed_shown_and_released(tmp_path, shared):
    a = clone(tmp_path, shared, "work")
    paths = largest_paths()
    svc = _service(a)
    got = svc.acquire(paths)
    assert len(got.record.canonical()) > records.MAX_RECORD_BYTES - 4096
    ren = svc.renew(got.lease_id, progress="\U0010ffff" * 300 + " 999999999999")
    assert ren.record.version == 2
    res = cli(a, "status", "--json")
    assert res.returncode == 0, res.stderr
    (view,) = json.loads(res.stdout)["result"]["leases"]
    assert view["valid"] and view["version"] == 2 and len(view["paths"]) == records.MAX_PATHS
    assert cli(a, "renew", got.lease_id).returncode == 0
    assert cli(a, "release", got.lease_id).returncode == 0
    assert git(shared, "for-each-ref", "refs/leases/") == ""


def test_i6_a_path_git_cannot_store_is_refused_by_acquire_can_start_and_plan(tmp_path, shared):
    a = clone(tmp_path, shared, "a")
    long = "src/" + "y" * 251 + ".py"
    for args in (("acquire", "--scope", long), ("can-start", "--scope", long)):
        res = cli(a, *args)
        assert res.returncode == 2 and "over git's limit of 250" in res.stderr, (args, res.stderr)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "paths": [long]}) + "\n")
    res = cli(a, "plan", str(tasks), "--granularity", "file")
    assert res.returncode == 2 and "over git's limit of 250" in res.stderr, res.stderr
    ok = "src/" + "y" * 250
    assert cli(a, "can-start", "--scope", ok).returncode == 0
    assert cli(a, "acquire", "--scope", ok).returncode == 0


def test_i6_stray_refs_do_not_block_the_whole_repository(tmp_path, shared):
    a = clone(tmp_path, shared, "a")
    head = git(shared, "rev-parse", "main").strip()
    for ref in ("refs/leases/stray", "refs/leases/scope/%zz/x", "refs/leases/task/t1"):
        git(shared, "update-ref", ref, head)
    res = cli(a, "can-start", "--scope", "b")
    assert res.returncode == 0, res.stderr
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "scope": ["b"]}) + "\n")
    res = cli(a, "plan", str(tasks), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["result"]["start"] == ["t1"], res.stdout
    # nor the hooks: a commit and a push touching b pass (no lease held: others' leases only)
    assert cli(a, "install-hooks").returncode == 0
    assert commit(a, "b/free.py").returncode == 0
    res = subprocess.run(["git", "push", "origin", "HEAD:main"], cwd=a, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert cli(a, "acquire", "--scope", "b").returncode == 0
    # what git itself refuses stays refused: the whole repository collides with refs/leases/scope/%zz/x
    assert cli(a, "can-start", "--scope", ".").returncode == 3


# ------------------------------------------------------------------------------------------- item 7

PARTIAL_HOOK = r"""#!/bin/sh
# Apply the id ref of a lease create, then refuse the push: a transaction applied in part.
while read old new ref; do
  case "$ref" in
    refs/leases/id/*)
      if [ "$old" = 0000000000000000000000000000000000000000 ] && [ ! -e "$GIT_DIR/partial-done" ]; then
        cp -R "$GIT_QUARANTINE_PATH"/. "$GIT_DIR/objects/"
        touch "$GIT_DIR/partial-done"
        env -u GIT_QUARANTINE_PATH -u GIT_OBJECT_DIRECTORY -u GIT_ALTERNATE_OBJECT_DIRECTORIES \
          git update-ref "$ref" "$new" "" || exit 3
        echo "partial: wrote $ref only" >&2
        exit 1
      fi;;
  esac
done
exit 0
"""


def test_i7_a_refused_acquire_deletes_what_landed_of_it(tmp_path, shared):
    hook = shared / "hooks" / "pre-receive"
    hook.write_text(PARTIAL_HOOK)
    hook.chmod(0o755)
    a = clone(tmp_path, shared, "a")
    res = cli(a, "acquire", "--scope", "b")
    assert res.returncode == 1 and "partial" in res.stderr, res.stderr
    assert (shared / "partial-done").exists()
    assert git(shared, "for-each-ref", "refs/leases/") == ""  # the id ref that landed is gone again
    res = cli(a, "status", "--json")
    assert json.loads(res.stdout)["result"]["leases"] == []
    assert cli(a, "acquire", "--scope", "b").returncode == 0  # the hook lets the next one through


# ------------------------------------------------------------------------------------------- item 2


@pytest.fixture
def guarded(shared):
    res = cli(shared, "install-hooks", "--server")
    assert res.returncode == 0, res.stderr
    return shared


def test_i2_a_branch_pushed_before_the_lease_is_judged_when_it_reaches_main(tmp_path, guarded):
    a, b = clone(tmp_path, guarded, "a"), clone(tmp_path, guarded, "b")
    assert cli(a, "install-hooks").returncode == 0
    git(a, "switch", "-q", "-c", "early")
    assert commit(a, "b/billing.py").returncode == 0
    git(a, "push", "-q", "origin", "early")  # before anyone leased b: fine
    lease_of(b, "b")
    res = subprocess.run(["git", "push", "origin", "early:main"], cwd=a, capture_output=True, text=True)
    assert res.returncode == 1 and "b/billing.py" in res.stderr and "pre-push" not in res.stdout, res.stderr
    res = subprocess.run(["git", "push", "--no-verify", "origin", "early:main"], cwd=a, capture_output=True, text=True)
    assert res.returncode == 1 and "pre-receive hook declined" in res.stderr
    assert "remote: gitlease:   b/billing.py: scope b, held by another lease" in res.stderr
    # a clean merge brings the same path onto main: judged by what it brings
    git(a, "switch", "-q", "main")
    git(a, "merge", "-q", "--no-ff", "--no-edit", "early")
    res = subprocess.run(["git", "push", "--no-verify", "origin", "main"], cwd=a, capture_output=True, text=True)
    assert res.returncode == 1 and "b/billing.py" in res.stderr
    assert remote_ref(guarded, "refs/heads/main") == git(b, "rev-parse", "origin/main").strip()
    # a new branch is judged against the default branch, not against every other ref
    res = subprocess.run(["git", "push", "--no-verify", "origin", "early:fresh"], cwd=a, capture_output=True, text=True)
    assert res.returncode == 1 and "b/billing.py" in res.stderr


def test_i2_nothing_but_gitleases_own_shapes_under_the_lease_namespaces(tmp_path, guarded):
    a = clone(tmp_path, guarded, "a")
    assert commit(a, "b/parked.py").returncode == 0
    head = git(a, "rev-parse", "HEAD").strip()
    for ref in ("refs/leases/doctor/park", "refs/leases/foo", "refs/leases-audit/mallory", "refs/leases"):
        res = subprocess.run(
            ["git", "push", "--no-verify", "origin", f"{head}:{ref}"], cwd=a, capture_output=True, text=True
        )
        assert res.returncode == 1 and "pre-receive hook declined" in res.stderr, (ref, res.stderr)
    assert git(guarded, "for-each-ref", "refs/leases/", "refs/leases-audit/") == ""
    # gitlease's own writes pass: a lease, its reclaim with its audit entry, doctor's probes
    past = _service(a, FakeClock(time.time() - 3600))
    got = past.acquire(["b"], ttl=60)
    res = cli(a, "sweep-stale", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["result"]["results"][0]["outcome"] == "reclaimed"
    assert git(guarded, "for-each-ref", "refs/leases/") == ""
    assert git(guarded, "for-each-ref", "--format=%(refname)", "refs/leases-audit/").strip() == "refs/leases-audit/a"
    del got
    res = cli(a, "doctor", "--json")
    doc = json.loads(res.stdout)
    checks = {
        c["name"]: (c["status"], c["message"])
        for c in (doc["result"]["checks"] if doc["ok"] else doc["error"]["details"]["checks"])
    }
    assert checks["custom-refs"][0] == "pass" and checks["cleanup"][0] == "pass", checks
    # an audit entry that does not continue the log, or forged, is refused
    forged = git(a, "commit-tree", git(a, "rev-parse", "HEAD^{tree}").strip(), "-m", "x").strip()
    old = remote_ref(guarded, "refs/leases-audit/a")
    lease = f"--force-with-lease=refs/leases-audit/a:{old}"
    res = run_git(a, "push", "--no-verify", lease, "origin", f"{forged}:refs/leases-audit/a", check=False)
    assert res.returncode == 1 and "not a gitlease audit entry" in res.stderr


# ------------------------------------------------------------------------------------------- item 9


def test_i9_a_mirror_push_cannot_delete_every_lease(tmp_path, guarded):
    a, b, c = (clone(tmp_path, guarded, n) for n in ("a", "b", "c"))
    la, lb = lease_of(a, "a"), lease_of(b, "b")
    before = git(guarded, "for-each-ref", "refs/leases/")
    res = subprocess.run(["git", "push", "--mirror", "--no-verify", "origin"], cwd=c, capture_output=True, text=True)
    assert res.returncode == 1 and "only when each lease it deletes is released in it by its holder" in res.stderr, (
        res.stderr
    )
    assert git(guarded, "for-each-ref", "refs/leases/") == before
    # deleting two leases at once, or half a lease, is not a release either
    ids = [f"refs/leases/id/{la}", f"refs/leases/id/{lb}"]
    res = subprocess.run(
        ["git", "push", "--no-verify", "--atomic", "origin", *[":" + r for r in ids]],
        cwd=c,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "deletes all its refs together" in res.stderr, res.stderr
    res = subprocess.run(
        [
            "git",
            "push",
            "--no-verify",
            "--atomic",
            "origin",
            *[":" + r for r in ids],
            ":refs/leases/scope/a",
            ":refs/leases/scope/b",
        ],
        cwd=c,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "with no audit entry" in res.stderr, res.stderr
    assert git(guarded, "for-each-ref", "refs/leases/") == before
    # a release is one whole lease: it passes
    assert cli(a, "release", la).returncode == 0
    assert cli(b, "release", lb).returncode == 0
    assert git(guarded, "for-each-ref", "refs/leases/") == ""


def test_i9_without_the_server_hook_a_mirror_push_deletes_every_lease(tmp_path, shared):
    """The documented hazard (docs/limits.md): what the server hook refuses."""
    a, c = clone(tmp_path, shared, "a"), clone(tmp_path, shared, "c")
    lease_of(a, "a")
    res = subprocess.run(["git", "push", "--mirror", "--no-verify", "origin"], cwd=c, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert git(shared, "for-each-ref", "refs/leases/") == ""


# ------------------------------------------------------------------------------------------- item 3


def signed_store(tmp_path, bare, *names):
    """Keys for ``names`` and a trust file naming them on the store's default branch; {name: key path}."""
    from gitlease.identity import sshsig

    keys = {n: tmp_path / f"key_{n}" for n in names}
    lines = "".join(
        f'{n} namespaces="gitlease" {sshsig.generate_key(str(p), comment=n).public_key()}\n' for n, p in keys.items()
    )
    admin = clone(tmp_path, bare, "trust-admin")
    (admin / ".gitlease").mkdir()
    (admin / ".gitlease" / "allowed_signers").write_text(lines)
    git(admin, "add", ".gitlease/allowed_signers")
    git(admin, "commit", "-q", "-m", "trust")
    git(admin, "push", "-q", "origin", "HEAD:main")
    return keys


def signed_clone(tmp_path, bare, name, key):
    path = clone(tmp_path, bare, name)
    git(path, "config", "lease.signingKey", str(key))
    return path


def push(repo, *args):
    return subprocess.run(["git", "push", "--no-verify", *args], cwd=repo, capture_output=True, text=True)


def test_i3_a_claim_on_a_signed_store_needs_the_owners_commit_signature(tmp_path, guarded):
    git(guarded, "config", "receive.advertisePushOptions", "true")
    keys = signed_store(tmp_path, guarded, "a", "b")
    a, b = signed_clone(tmp_path, guarded, "a", keys["a"]), signed_clone(tmp_path, guarded, "b", keys["b"])
    theirs = lease_of(b, "b")
    assert commit(a, "b/x.py", extra=("--no-verify",)).returncode == 0
    res = push(a, "origin", "HEAD:main")
    assert res.returncode == 1 and theirs not in res.stderr, res.stderr
    assert "in commits signed (gpg.format=ssh) with the lease's owner key" in res.stderr
    # naming B's lease in a trailer does not make the push land: the commit is not signed by B's key
    git(a, "commit", "-q", "--amend", "--no-verify", "-m", f"into b\n\nLease: {theirs}")
    res = push(a, "origin", "HEAD:main")
    assert res.returncode == 1 and "is not signed by its owner's key" in res.stderr, res.stderr
    # nor does A signing it with A's own key, nor a push option
    git(
        a,
        "-c",
        "gpg.format=ssh",
        "-c",
        f"user.signingKey={keys['a']}",
        "commit",
        "-q",
        "--amend",
        "-S",
        "--no-verify",
        "-m",
        f"into b\n\nLease: {theirs}",
    )
    res = push(a, "-o", f"lease={theirs}", "origin", "HEAD:main")
    assert res.returncode == 1 and "is not signed by its owner's key" in res.stderr, res.stderr
    # B's own commit, made under `git lease run` (which signs with B's key), with the trailer: it lands
    script = f"echo b >> b/y.py && git add b/y.py && git commit -q --no-verify -m 'b work\n\nLease: {theirs}'"
    res = cli(b, "run", "--lease", theirs, "--", "sh", "-c", script)
    assert res.returncode == 0, res.stderr
    assert "gpgsig" in git(b, "cat-file", "commit", "HEAD")
    res = push(b, "origin", "HEAD:main")
    assert res.returncode == 0, res.stderr
    # CI verify applies the same rule: A's unsigned claim is refused, B's signed one passes
    ci = clone(tmp_path, guarded, "ci")
    git(ci, "fetch", "-q", str(a), "HEAD")
    res = cli(ci, "verify", "--base", "origin/main~1", "--head", "FETCH_HEAD", "--json")
    assert res.returncode == 4 and "not signed by its owner's key" in res.stdout, res.stdout
    res = cli(ci, "verify", "--base", "origin/main~1", "--head", "origin/main")
    assert res.returncode == 0, res.stderr


def test_i3_the_fenced_push_claims_its_lease_and_worktrees_sign(tmp_path, guarded):
    keys = signed_store(tmp_path, guarded, "b")
    b = signed_clone(tmp_path, guarded, "b", keys["b"])
    res = cli(b, "acquire", "--scope", "b", "--worktree", "--json")
    assert res.returncode == 0, res.stderr
    wt = Path(json.loads(res.stdout)["result"]["worktree"]["path"])
    assert git(wt, "config", "gpg.format").strip() == "ssh" and git(wt, "config", "commit.gpgSign").strip() == "true"
    assert commit(wt, "b/w.py").returncode == 0  # signed by the worktree's config, no trailer
    assert "gpgsig" in git(wt, "cat-file", "commit", "HEAD")
    res = cli(wt, "push", "origin", "HEAD:main")  # the renewal in the same push is the claim
    assert res.returncode == 0, res.stderr


def test_i3_on_an_unsigned_store_the_refusal_says_claims_are_unverified(tmp_path, guarded):
    a, b = clone(tmp_path, guarded, "a"), clone(tmp_path, guarded, "b")
    theirs = lease_of(b, "b")
    assert commit(a, "b/x.py", extra=("--no-verify",)).returncode == 0
    res = push(a, "origin", "HEAD:main")
    assert res.returncode == 1 and theirs not in res.stderr
    assert "on this unsigned store claims are not verified" in res.stderr


# ------------------------------------------------------------------------------------------- item 5


def _wt_manager(repo):
    from gitlease.worktree.manager import WorktreeManager

    r = Repo.discover(repo)
    return WorktreeManager(LeaseService(r, resolve(r.config, env={}, agent="w", task="t"), clock=FakeClock()))


@pytest.fixture
def wtrepo(tmp_path):
    path = tmp_path / "repo"
    git(tmp_path, "init", "-q", str(path))
    (path / "a").mkdir()
    (path / "a" / "conf.txt").write_text("tracked\n")
    (path / ".gitignore").write_text("__pycache__/\n*.pyc\n*.log\n.pytest_cache/\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "one")
    git(path, "config", "lease.worktreeRoot", str(tmp_path / "pool"))
    return path


@pytest.mark.parametrize("bit", ["--skip-worktree", "--assume-unchanged"])
def test_i5_an_edit_hidden_by_index_bits_is_never_deleted(wtrepo, bit):
    m = _wt_manager(wtrepo)
    att = m.acquire(["a"], ttl=60)
    wt = Path(att.path)
    git(wt, "update-index", bit, "a/conf.txt")
    (wt / "a" / "conf.txt").write_text("an edit git status does not show\n")
    assert git(wt, "status", "--porcelain") == ""  # git itself calls it clean
    _wt_manager(wt).svc.release(att.lease_id)
    insp = m.inspect(next(w for w in m.managed() if w.id == att.id))
    assert any("hidden change" in d for d in insp.dirt), insp.dirt
    with pytest.raises(Exception, match="uncommitted work"):
        m.remove(att.id)
    actions = {a.id: a for a in m.prune(remove=True)}
    assert actions[att.id].action == "quarantined"
    assert (wt / "a" / "conf.txt").read_text() == "an edit git status does not show\n"
    saved = git(wtrepo, "show", f"{actions[att.id].ref}:a/conf.txt")
    assert saved == "an edit git status does not show\n"
    # a marked file that is simply absent (sparse checkout) loses nothing: not dirt
    git(wt, "update-index", "--no-assume-unchanged", "a/conf.txt")
    git(wt, "update-index", "--no-skip-worktree", "a/conf.txt")
    git(wt, "checkout", "-q", "--", "a/conf.txt")
    git(wt, "update-index", "--skip-worktree", "a/conf.txt")
    (wt / "a" / "conf.txt").unlink()
    insp = m.inspect(next(w for w in m.managed() if w.id == att.id))
    assert insp.dirt == [], insp.dirt


def test_i5_disposable_build_leftovers_do_not_quarantine_and_are_cleaned(wtrepo):
    m = _wt_manager(wtrepo)
    att = m.acquire(["a"], ttl=60)
    wt = Path(att.path)
    (wt / "a" / "__pycache__").mkdir()
    (wt / "a" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    (wt / "x.pyc").write_bytes(b"\0")
    (wt / ".pytest_cache").mkdir()
    (wt / ".pytest_cache" / "v").write_text("1")
    (wt / "run.log").write_text("keep me\n")  # ignored, but not disposable: kept, and it is dirt
    _wt_manager(wt).svc.release(att.lease_id)
    actions = {a.id: a for a in m.prune()}
    assert actions[att.id].action == "quarantined" and actions[att.id].reasons == ["1 ignored file"]
    assert (wt / "run.log").exists() and (wt / "x.pyc").exists()
    (wt / "run.log").unlink()
    actions = {a.id: a for a in m.prune()}
    assert actions[att.id].action == "pooled"
    assert not (wt / "a" / "__pycache__").exists() and not (wt / "x.pyc").exists()
    assert not (wt / ".pytest_cache").exists() and (wt / "a" / "conf.txt").exists()
    # configurable: with no disposable patterns, a .pyc is kept and is dirt again
    git(wtrepo, "config", "lease.worktree.disposable", "")
    att2 = _wt_manager(wtrepo).acquire(["a"], ttl=60)
    assert att2.reused
    (Path(att2.path) / "y.pyc").write_bytes(b"\0")
    _wt_manager(att2.path).svc.release(att2.lease_id)
    actions = {a.id: a for a in _wt_manager(wtrepo).prune()}
    assert actions[att2.id].action == "quarantined" and (Path(att2.path) / "y.pyc").exists()


# ------------------------------------------------------------------------------------------- item 8


@pytest.fixture
def racing(tmp_path):
    """dulwich's receive-pack, one thread per connection: a server that grants overlapping refs."""
    from test_race_probe import racing_server

    with racing_server(tmp_path) as url:
        yield url


def doctor_checks(repo, *args):
    res = cli(repo, "doctor", "--json", *args, timeout=120)
    doc = json.loads(res.stdout)
    checks = doc["result"]["checks"] if doc["ok"] else doc["error"]["details"]["checks"]
    return res, {c["name"]: c for c in checks}


def test_i8_doctor_fails_a_server_that_grants_overlapping_leases_when_pushes_race(racing, make_repo):
    res, checks = doctor_checks(make_repo(), "--remote", racing)
    assert res.returncode == 1
    race = checks["concurrency"]
    assert race["status"] == "fail" and "told they won" in race["message"], checks
    assert race["agent"] is None and "(server: no agent advertised)" in race["message"]  # dulwich sends none


def test_i8_doctor_passes_git_under_concurrency_and_names_it(remote_daemon, make_repo):
    res, checks = doctor_checks(make_repo(), "--remote", remote_daemon.url)
    assert res.returncode == 0, res.stderr
    race = checks["concurrency"]
    assert race["status"] == "pass" and race["agent"].startswith("git/") and race["agent"] in race["message"]
    assert git(remote_daemon.path, "for-each-ref", "refs/leases/doctor/") == ""  # cleaned up


@pytest.mark.skipif(not os.environ.get("GITLEASE_TEST_JGIT"), reason="set GITLEASE_TEST_JGIT to a JGit pgm jar")
def test_i8_doctor_fails_jgit_refdirectory(tmp_path, make_repo):
    """JGit's default ref storage (RefDirectory) races like dulwich (measured with JGit 4.11 and 7.8)."""
    from servers import free_port, make_bare

    make_bare(tmp_path / "j" / "store.git")
    port = free_port()
    proc = subprocess.Popen(
        [
            "java",
            "-jar",
            os.environ["GITLEASE_TEST_JGIT"],
            "daemon",
            "--port",
            str(port),
            "--enable",
            "receive-pack",
            str(tmp_path / "j"),
        ]
    )
    try:
        time.sleep(3)  # JGit's daemon prints nothing when it is ready
        res, checks = doctor_checks(make_repo(), "--remote", f"git://127.0.0.1:{port}/store.git")
        assert checks["concurrency"]["status"] == "fail" and "JGit" in checks["concurrency"]["agent"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _packed_store(tmp_path, make_repo):
    """A store holding two live leases whose scopes overlap (a and a/b): what a racing server can leave.
    git refuses to create such refs, so they are written into packed-refs by hand."""
    one, two = tmp_path / "one.git", tmp_path / "two.git"
    for bare in (one, two):
        git(tmp_path, "init", "-q", "--bare", str(bare))
    work = make_repo("w")
    for bare, scope in ((one, "a"), (two, "a/b")):
        assert cli(work, "acquire", "--remote", str(bare), "--scope", scope).returncode == 0
    store = tmp_path / "store.git"
    git(tmp_path, "init", "-q", "--bare", str(store))
    lines = []
    for n, bare in enumerate((one, two)):
        git(store, "fetch", "-q", str(bare), f"refs/leases/*:refs/tmp{n}/*")
        for line in git(bare, "for-each-ref", "--format=%(objectname) %(refname)", "refs/leases/").splitlines():
            lines.append(line)
    for ref in git(store, "for-each-ref", "--format=%(refname)", "refs/tmp0/", "refs/tmp1/").split():
        git(store, "update-ref", "-d", ref)
    (store / "packed-refs").write_text(
        "# pack-refs with: peeled fully-peeled sorted \n" + "\n".join(sorted(lines, key=lambda s: s.split()[1])) + "\n"
    )
    return store


def test_i8_status_reports_overlapping_live_leases_as_a_store_fault(tmp_path, make_repo):
    store = _packed_store(tmp_path, make_repo)
    reader = make_repo("reader")
    res = cli(reader, "status", "--remote", str(store))
    assert res.returncode == 5, res.stdout + res.stderr
    ids = sorted(line.split()[0] for line in res.stdout.splitlines() if line.startswith("lease_"))
    assert len(ids) == 2 and all(i in res.stderr for i in ids) and "store fault" in res.stderr
    doc = json.loads(cli(reader, "status", "--json", "--remote", str(store)).stdout)
    assert doc["error"]["exitCode"] == 5 and sorted(doc["error"]["details"]["overlaps"][0]) == ids


# ------------------------------------------------------------------------------------------- item 9


@pytest.mark.parametrize("value", ["-5", "-1s", "abc", "4000", "2h"])
def test_i9_a_bad_lease_skew_is_refused_by_the_commit_hook_as_by_every_command(make_repo, value):
    repo = make_repo()
    assert cli(repo, "install-hooks").returncode == 0
    git(repo, "config", "lease.skew", value)
    status = cli(repo, "status")
    assert status.returncode == 1 and "lease.skew must be" in status.stderr
    write(repo, "x/y")
    git(repo, "add", "x/y")
    res = subprocess.run(["git", "commit", "-q", "-m", "x"], cwd=repo, capture_output=True, text=True)
    assert res.returncode == 1, res.stderr
    assert status.stderr.split("git-lease: ", 1)[1].strip() in res.stderr


@pytest.mark.parametrize("value", ["", "0", "30", "5m", "1h", "3600", "1d", " 7 ", "-5", "x", "3601"])
def test_i9_the_hook_reads_lease_skew_as_the_configuration_does(value):
    from gitlease.core.config import resolve
    from gitlease.core.errors import ConfigError
    from gitlease.enforce import entry

    try:
        want: object = resolve({"lease.skew": value}, env={}).skew
    except ConfigError as exc:
        want = exc.message
    try:
        got: object = entry.skew({"lease.skew": value})
    except ConfigError as exc:
        got = exc.message
    assert got == want


def test_i9_status_json_stays_valid_for_ref_names_that_are_not_utf8(make_repo):
    repo = make_repo()
    head = git(repo, "rev-parse", "HEAD").strip()
    for ref in (b"refs/leases/scope/a\xffb", b"refs/leases/id/lease_\xfe"):
        subprocess.run([b"git", b"update-ref", ref, head.encode()], cwd=repo, check=True)
    res = subprocess.run(["git", "lease", "status", "--json"], cwd=repo, capture_output=True, env=_cli_env())
    text = res.stdout.decode("utf-8")  # strict: valid UTF-8
    doc = json.loads(text)
    json.dumps(doc, ensure_ascii=False).encode("utf-8")  # no lone surrogate anywhere (strict parsers refuse those)
    paths = [p for v in doc["result"]["leases"] for p in v["paths"]]
    assert "a\\xffb" in paths


def _cli_env():
    import sys

    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    return env
