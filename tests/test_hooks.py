"""The hooks, installed by the real ``git lease install-hooks``, run by real ``git commit`` and ``git push``."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, cli, git
from hypothesis import given
from hypothesis import strategies as st

from gitlease.core import scope
from gitlease.core.clock import FakeClock
from gitlease.core.config import resolve
from gitlease.core.repo import Repo
from gitlease.core.state import Held, HeldState
from gitlease.enforce import rules as enforce
from gitlease.service.leases import LeaseService, _RefsCache

HINT = "gitlease: acquire the scope first (git lease acquire --scope SCOPE), or see git lease status"


def run(cwd, *args, input=None, env=None):
    full = dict(os.environ, **(env or {}))
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, input=input, env=full)


def write(repo, rel, text="x\n"):
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def commit(repo, *paths, msg="change", extra=()):
    for p in paths:
        write(repo, p, f"{p} {os.urandom(4).hex()}\n")
    if paths:
        git(repo, "add", "--", *paths)
    return run(repo, "commit", "-q", "-m", msg, *extra)


def acquire(repo, *scopes, agent="agent-a", task="task-a", ttl=300):
    """A lease for the worktree at ``repo``, on the store its config names (in-process: the same service the
    CLI calls, without a process start per test)."""
    r = Repo.discover(repo)
    return LeaseService(r, resolve(r.config, env={}, agent=agent, task=task)).acquire(list(scopes), ttl=ttl).lease_id


def hook(repo, name="pre-commit", *args, input=None):
    """Run the installed hook directly (as git would), to see its own exit code."""
    hooks = git(repo, "rev-parse", "--path-format=absolute", "--git-path", "hooks").strip()
    return subprocess.run([os.path.join(hooks, name), *args], cwd=repo, capture_output=True, text=True, input=input)


@pytest.fixture
def repo(make_repo):
    r = make_repo("work")
    res = cli(r, "install-hooks")
    assert res.returncode == 0, res.stderr
    return r


# ------------------------------------------------------------------------------ pre-commit


def test_inside_scope_passes_outside_refused_with_exact_message(repo):
    acquire(repo, "services/billing")
    assert commit(repo, "services/billing/api.py").returncode == 0
    res = commit(repo, "services/billing2/x.py", "docs/guide.md")
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        "gitlease: commit refused (lease.enforce=strict): 2 paths outside the leases held here",
        "  docs/guide.md: scope docs, not leased by this worktree",
        "  services/billing2/x.py: scope services/billing2, not leased by this worktree",
        HINT,
    ]
    assert hook(repo).returncode == 4  # the hook's own code; git commit itself exits 1
    assert git(repo, "log", "--format=%s", "-1").strip() == "change"  # the refused commit did not happen


def test_rename_inside_to_outside_and_deletion_outside_refused(repo):
    write(repo, "services/billing/a.py")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    acquire(repo, "services/billing")
    (repo / "docs").mkdir()
    git(repo, "mv", "services/billing/a.py", "docs/a.py")
    res = run(repo, "commit", "-q", "-m", "move")
    assert res.returncode == 1 and "  docs/a.py: scope docs, not leased by this worktree" in res.stderr
    assert "services/billing/a.py" not in res.stderr  # the source side is inside the lease
    git(repo, "reset", "-q", "--hard")
    git(repo, "rm", "-q", "README")
    res = run(repo, "commit", "-q", "-m", "delete")
    assert res.returncode == 1 and "  README: scope README, not leased by this worktree" in res.stderr
    git(repo, "reset", "-q", "--hard")
    # a rename from outside to inside: the deleted source is outside
    write(repo, "tools/t.py")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "--no-verify", "-m", "tools")
    git(repo, "mv", "tools/t.py", "services/billing/t.py")
    res = run(repo, "commit", "-q", "-m", "move in")
    assert res.returncode == 1 and "  tools/t.py: scope tools, not leased" in res.stderr


def test_commit_after_expiry_refused(repo):
    """A lease acquired on a clock 400 s in the past (ttl 300) has expired by the local clock now."""
    import time

    r = Repo.discover(repo)
    svc = LeaseService(r, resolve(r.config, env={}, agent="a", task="t"), clock=FakeClock(time.time() - 400))
    got = svc.acquire(["services"], ttl=300)
    res = commit(repo, "services/x.py")
    assert res.returncode == 1
    assert (
        f"  services/x.py: scope services, this worktree's lease {got.lease_id} passed its stop deadline "
        f"{got.record.expires_at} (local clock)"
    ) in res.stderr.splitlines()


def test_holder_is_named_and_default_mode_without_lease_is_others(make_repo):
    main = make_repo("main")
    assert cli(main, "install-hooks").returncode == 0
    wt = main.parent / "linked"
    git(main, "worktree", "add", "-q", str(wt))
    lease = acquire(wt, "services", agent="codex-7", task="job-9")
    assert commit(wt, "services/a.py").returncode == 0  # the linked worktree uses the same hooks
    assert commit(wt, "docs/x").returncode == 1
    git(wt, "reset", "-q", "--hard")
    # the main worktree holds nothing: default mode "others": free paths pass, the linked one's lease does not
    assert commit(main, "docs/x").returncode == 0
    res = commit(main, "services/b.py")
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert lines[0] == "gitlease: commit refused (lease.enforce=others): 1 path inside leases held by others"
    assert re.fullmatch(
        rf"  services/b\.py: scope services, held by {lease} \(task=job-9 agent=codex-7, "
        r"\d+s left\)",
        lines[1],
    )


@pytest.mark.parametrize("mode", ["default", "strict", "others", "warn", "off"])
def test_worktree_without_lease_under_each_mode(make_repo, mode):
    main = make_repo("main")
    assert cli(main, "install-hooks").returncode == 0
    other = main.parent / "other"
    git(main, "worktree", "add", "-q", str(other))
    acquire(other, "held")
    if mode != "default":
        git(main, "config", "lease.enforce", mode)
    free = commit(main, "free/a")
    git(main, "reset", "-q", "--hard")
    held = commit(main, "held/a")
    expect = {"default": (0, 1), "strict": (1, 1), "others": (0, 1), "warn": (0, 0), "off": (0, 0)}[mode]
    assert (free.returncode, held.returncode) == expect, (free.stderr, held.stderr)
    if mode == "warn":
        assert held.stderr.startswith("gitlease: warning (lease.enforce=warn): commit has 1 path inside leases")
    if mode == "off":
        assert held.stderr == ""
    if mode == "strict":
        assert "  free/a: scope free, not leased by this worktree" in free.stderr


def test_worktree_config_strict_for_attached_worktrees(make_repo):
    """The contract with the worktree manager: ``git config --worktree lease.enforce strict``."""
    main = make_repo("main")
    assert cli(main, "install-hooks").returncode == 0
    wt = main.parent / "attached"
    git(main, "worktree", "add", "-q", str(wt))
    git(main, "config", "extensions.worktreeConfig", "true")
    git(wt, "config", "--worktree", "lease.enforce", "strict")
    assert commit(wt, "free/a").returncode == 1  # strict there, holding nothing
    assert commit(main, "free/a").returncode == 0  # others in the main worktree


def test_bad_paths_spaces_unicode_newlines_dashes(repo):
    acquire(repo, "dir with space", "ünïcode", "-dash")
    assert commit(repo, "dir with space/a b.txt", "ünïcode/ß.txt", "-dash/--x").returncode == 0
    res = commit(repo, "new\nline", "--outside", "ünï/x")
    assert res.returncode == 1
    assert res.stderr.splitlines()[1:4] == [
        "  --outside: scope --outside, not leased by this worktree",
        '  "new\\nline": scope "new\\nline", not leased by this worktree',
        "  ünï/x: scope ünï, not leased by this worktree",
    ]


def test_concluding_a_merge_checks_only_what_the_merge_changes(repo):
    git(repo, "switch", "-q", "-c", "other")
    assert commit(repo, "docs/from-other").returncode == 0  # nobody holds docs: others mode passes
    git(repo, "switch", "-q", "-")
    acquire(repo, "src")
    assert commit(repo, "src/a").returncode == 0
    git(repo, "merge", "-q", "--no-commit", "--no-ff", "other")
    res = run(repo, "commit", "-q", "-m", "merge")
    assert res.returncode == 0, res.stderr  # docs/from-other came with the merged branch
    git(repo, "switch", "-q", "other")
    assert commit(repo, "docs/z", extra=("--no-verify",)).returncode == 0
    git(repo, "switch", "-q", "-")
    git(repo, "merge", "-q", "--no-commit", "--no-ff", "other")
    write(repo, "README", "changed inside the merge\n")  # an "evil merge": a change of its own
    git(repo, "add", "README")
    res = run(repo, "commit", "-q", "-m", "evil merge")
    assert res.returncode == 1
    assert res.stderr.splitlines()[1:] == ["  README: scope README, not leased by this worktree", HINT]


def test_corrupt_local_state_refuses(repo):
    acquire(repo, "a")
    state = repo / ".git" / "gitlease" / "held.json"
    state.write_text("{not json")
    res = commit(repo, "a/x")
    assert res.returncode == 1
    assert res.stderr.strip() == (
        f"gitlease: commit refused: local lease state {state} is corrupt (move it "
        "aside; the leases on the remote are unaffected and expire on their own)"
    )
    assert hook(repo).returncode == 5
    git(repo, "config", "lease.enforce", "off")
    assert run(repo, "commit", "-q", "-m", "off").returncode == 0


def assert_guards_src(r, outside):
    """With a lease on src, the commit hook lets a commit inside it through and refuses one at ``outside``."""
    acquire(r, "src")
    assert commit(r, "src/a").returncode == 0
    assert commit(r, outside).returncode == 1


def test_first_commit_and_nothing_staged(tmp_path):
    r = tmp_path / "fresh"
    git(tmp_path, "init", "-q", str(r))
    assert cli(r, "install-hooks").returncode == 0
    acquire(r, "src")
    assert commit(r, "src/a").returncode == 0  # no HEAD yet: compared with the empty tree
    assert run(r, "commit", "-q", "--allow-empty", "-m", "empty").returncode == 0


# -------------------------------------------------------------------------------- chaining


def test_existing_hook_chained_failure_fails_uninstall_restores(make_repo):
    r = make_repo("chain")
    hooks = r / ".git" / "hooks"
    legacy_text = '#!/bin/sh\necho legacy-ran >> "$(git rev-parse --git-dir)/legacy.log"\nexit ${LEGACY_RC:-0}\n'
    (hooks / "pre-commit").write_text(legacy_text)
    (hooks / "pre-commit").chmod(0o755)
    res = cli(r, "install-hooks", "--json")
    changes = {c["name"]: c for c in json.loads(res.stdout)["result"]["hooks"]}
    assert changes["pre-commit"]["action"] == "installed"
    assert changes["pre-commit"]["legacy"] == str(hooks / "pre-commit.gitlease-legacy")
    again = json.loads(cli(r, "install-hooks", "--json").stdout)["result"]["hooks"]
    assert [c["action"] for c in again] == ["unchanged", "unchanged"]  # idempotent
    assert (hooks / "pre-commit.gitlease-legacy").read_text() == legacy_text
    acquire(r, "src")
    assert commit(r, "src/a").returncode == 0
    assert (r / ".git" / "legacy.log").read_text() == "legacy-ran\n"
    write(r, "src/b")
    git(r, "add", ".")
    res = run(r, "commit", "-q", "-m", "x", env={"LEGACY_RC": "3"})
    assert res.returncode == 1  # inside the lease, but the pre-existing hook failed
    assert (r / ".git" / "legacy.log").read_text() == "legacy-ran\nlegacy-ran\n"
    assert commit(r, "outside").returncode == 1  # legacy passes, gitlease refuses
    res = cli(r, "uninstall-hooks")
    assert res.returncode == 0 and "pre-commit: restored" in res.stdout and "pre-push: removed" in res.stdout
    assert (hooks / "pre-commit").read_text() == legacy_text
    assert not (hooks / "pre-commit.gitlease-legacy").exists() and not (hooks / "pre-push").exists()
    assert commit(r, "outside2").returncode == 0


def test_recursion_guard_when_our_hook_is_its_own_legacy(make_repo):
    """E.g. another manager moved gitlease's hook aside and put a copy back: no endless chain."""
    r = make_repo("loop")
    assert cli(r, "install-hooks").returncode == 0
    hooks = r / ".git" / "hooks"
    (hooks / "pre-commit.gitlease-legacy").write_bytes((hooks / "pre-commit").read_bytes())
    (hooks / "pre-commit.gitlease-legacy").chmod(0o755)
    assert_guards_src(r, "nope")


def test_chain_survives_another_manager_moving_our_hook_aside(make_repo):
    """pre-commit (the framework) moves the hook it finds to ``pre-commit.legacy`` and runs it from its own."""
    r = make_repo("mgr")
    hooks = r / ".git" / "hooks"
    (hooks / "pre-commit").write_text('#!/bin/sh\necho first >> "$(git rev-parse --git-dir)/legacy.log"\n')
    (hooks / "pre-commit").chmod(0o755)
    assert cli(r, "install-hooks").returncode == 0
    os.replace(hooks / "pre-commit", hooks / "pre-commit.legacy")
    (hooks / "pre-commit").write_text('#!/bin/sh\nexec "$(dirname "$0")/pre-commit.legacy" "$@"\n')
    (hooks / "pre-commit").chmod(0o755)
    acquire(r, "src")
    assert commit(r, "src/a").returncode == 0
    assert (r / ".git" / "legacy.log").read_text() == "first\n"
    assert commit(r, "outside").returncode == 1


PRE_COMMIT = os.environ.get("GITLEASE_TEST_PRE_COMMIT") or shutil.which("pre-commit")


@pytest.mark.skipif(not PRE_COMMIT, reason="the pre-commit framework is not installed (set GITLEASE_TEST_PRE_COMMIT)")
def test_with_the_real_pre_commit_framework_installed_before_and_after(make_repo):
    r = make_repo("framework")
    (r / ".pre-commit-config.yaml").write_text(
        "repos:\n  - repo: local\n    hooks:\n"
        "      - {id: marker, name: marker, entry: sh -c 'echo ran >> .git/pc.log', language: system, "
        "pass_filenames: false, always_run: true}\n"
        f"      - {{id: gitlease, name: gitlease, entry: {sys.executable} -m gitlease.enforce.entry pre-commit, "
        "language: system, pass_filenames: false, always_run: true}\n"
    )
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "config")
    subprocess.run([PRE_COMMIT, "install"], cwd=r, check=True, capture_output=True)
    assert cli(r, "install-hooks").returncode == 0  # chains pre-commit's hook
    subprocess.run([PRE_COMMIT, "install"], cwd=r, check=True, capture_output=True)  # moves ours to .legacy
    acquire(r, "src")
    res = commit(r, "src/a")
    assert res.returncode == 0, res.stdout + res.stderr
    res = commit(r, "out")
    assert res.returncode == 1 and "  out: scope out, not leased by this worktree" in res.stderr
    assert "exit code: 4" in res.stdout + res.stderr  # the framework's own gitlease hook refused too
    assert (r / ".git" / "pc.log").read_text() == "ran\nran\n"  # once per commit, never twice


def test_core_hooks_path(make_repo):
    r = make_repo("hp")
    git(r, "config", "core.hooksPath", ".githooks")
    res = cli(r, "install-hooks")
    assert res.returncode == 0 and str(r / ".githooks" / "pre-commit") in res.stdout
    assert_guards_src(r, "elsewhere")


def test_install_refuses_to_overwrite_a_kept_hook(make_repo):
    r = make_repo("two")
    hooks = r / ".git" / "hooks"
    for name in ("pre-commit", "pre-commit.gitlease-legacy"):
        (hooks / name).write_text("#!/bin/sh\nexit 0\n")
    res = cli(r, "install-hooks")
    assert res.returncode == 1 and "already exists" in res.stderr
    assert (hooks / "pre-commit").read_text() == "#!/bin/sh\nexit 0\n"


# --------------------------------------------------------------------------------- pre-push


def test_pre_push_inside_passes_outside_and_others_refused(pushing, make_repo):
    r, bare = pushing
    acquire(r, "src")
    assert commit(r, "src/a").returncode == 0
    assert run(r, "push", "-q", "origin", "HEAD:main").returncode == 0
    # a --no-verify commit outside the lease: the push refuses it
    assert commit(r, "docs/x", extra=("--no-verify",)).returncode == 0
    res = run(r, "push", "-q", "origin", "HEAD:main")
    assert res.returncode == 1
    assert "gitlease: push refused (lease.enforce=strict): 1 path outside the leases held here" in res.stderr
    assert "  docs/x: scope docs, not leased by this worktree" in res.stderr
    assert (
        hook(
            r,
            "pre-push",
            "origin",
            bare.as_uri(),
            input=f"refs/heads/main {git(r, 'rev-parse', 'HEAD').strip()} refs/heads/main {'0' * 40}\n",
        ).returncode
        == 4
    )
    git(r, "reset", "-q", "--hard", "origin/main")
    # another agent's lease: the commit hook knows it from the cached listing (status refreshes it) ...
    other = make_repo("other")
    git(other, "config", "lease.remote", bare.as_uri())
    theirs = acquire(other, "shared", agent="agent-b", task="task-b")
    assert cli(r, "status").returncode == 0
    res = commit(r, "shared/x")
    assert (
        res.returncode == 1 and f"  shared/x: scope shared, held by {theirs} (task=task-b agent=agent-b" in res.stderr
    )
    # ... and the push checks the remote itself
    git(r, "config", "lease.enforce", "others")
    assert commit(r, "shared/y", extra=("--no-verify",)).returncode == 0
    res = run(r, "push", "-q", "origin", "HEAD:main")
    assert res.returncode == 1
    assert (
        "gitlease: push refused (lease.enforce=others): 2 paths inside leases held by others" in res.stderr
    )  # x was still staged


def test_pre_push_reads_only_the_leases_near_the_change_and_still_sees_torn_and_odd_ones(pushing, make_repo):
    """The hook reads the leases bearing on the pushed paths (bearing.restrict_refs), not the whole store: a lease
    torn apart on the store (its scope ref gone, its id ref left) and a scope ref gitlease cannot have written
    still block what they name, as in a full read; leases elsewhere do not stop the push."""
    r, bare = pushing
    git(r, "config", "lease.enforce", "others")
    other = make_repo("other")
    git(other, "config", "lease.remote", bare.as_uri())
    torn = acquire(other, "torn", agent="agent-b", task="task-b")
    acquire(other, "elsewhere", agent="agent-b", task="task-c")
    git(bare, "update-ref", "-d", "refs/leases/scope/torn")  # only its id ref is left
    grant = git(bare, "rev-parse", f"refs/leases/id/{torn}").strip()
    git(bare, "update-ref", "refs/leases/scope/odd/%zz", grant)  # not a ref gitlease writes: blocks odd/%zz
    for path in ("torn/x", "odd/%zz/y"):
        git(r, "reset", "-q", "--hard", "origin/main")
        assert commit(r, path, extra=("--no-verify",)).returncode == 0
        res = run(r, "push", "-q", "origin", "HEAD:main")
        assert res.returncode == 1 and "1 path inside leases held by others" in res.stderr, (path, res.stderr)
    git(r, "reset", "-q", "--hard", "origin/main")
    assert commit(r, "free/x", extra=("--no-verify",)).returncode == 0
    res = run(r, "push", "-q", "origin", "HEAD:main")
    assert res.returncode == 0, res.stderr


def test_pre_push_of_a_new_branch_judges_only_what_the_remotes_default_branch_lacks(pushing, make_repo):
    """A new branch is judged against the remote's HEAD: commits already on the default branch (pushed before
    another agent leased their paths) are not judged again, even when no remote-tracking ref here says the
    remote has them. When the push goes to the lease store itself, the one ls-remote that lists the store
    answers HEAD too; when the store is named another way, the hook asks the push remote; same verdicts."""
    r, bare = pushing
    git(r, "config", "lease.enforce", "others")
    assert commit(r, "shared/old", extra=("--no-verify",)).returncode == 0
    assert run(r, "push", "-q", "origin", "HEAD:main").returncode == 0  # before anyone leased shared
    other = make_repo("other")
    git(other, "config", "lease.remote", bare.as_uri())
    acquire(other, "shared", agent="agent-b", task="task-b")
    for ref in git(r, "for-each-ref", "--format=%(refname)", "refs/remotes/").split():
        git(r, "update-ref", "-d", ref)  # nothing here says what the remote has
    for k, store in enumerate(("origin", str(bare))):  # the push remote itself; the same store by its path
        git(r, "config", "lease.remote", store)
        assert commit(r, f"free/{k}", extra=("--no-verify",)).returncode == 0
        trace = r.parent / f"trace{k}"
        res = run(r, "push", "-q", "origin", f"HEAD:refs/heads/topic{k}", env={"GIT_TRACE": str(trace)})
        assert res.returncode == 0, (store, res.stderr)
        calls = sum("built-in: git ls-remote" in ln for ln in trace.read_text().splitlines())
        assert calls == (1 if store == "origin" else 2), calls  # the store's listing answered HEAD too
        assert commit(r, f"shared/new{k}", extra=("--no-verify",)).returncode == 0
        res = run(r, "push", "-q", "origin", f"HEAD:refs/heads/more{k}")
        assert res.returncode == 1 and "1 path inside leases held by others" in res.stderr, (store, res.stderr)
        git(r, "reset", "-q", "--hard", "HEAD~1")


def _branches(repo, parents: dict[str, str], path_of) -> dict[str, str]:
    """One commit per branch (``refs/heads/<name>`` on top of ``parents[name]``, changing ``path_of(name)``),
    written by one ``git fast-import``. Returns {name: commit}."""
    chunks = []
    for k, (name, parent) in enumerate(sorted(parents.items())):
        data = f"{name} {os.urandom(4).hex()}\n".encode()
        chunks.append(
            b"commit refs/heads/%s\nmark :%d\ncommitter t <t@t> 1700000000 +0000\ndata 1\nc\nfrom %s\n"
            b"M 100644 inline %s\ndata %d\n%s\n"
            % (name.encode(), k + 1, parent.encode(), path_of(name).encode(), len(data), data)
        )
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=b"".join(chunks), check=True)
    out = git(repo, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/")
    return {n: o for n, o in (ln.split() for ln in out.splitlines()) if n in parents}


def _hook_processes(repo, url, lines: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """The installed pre-push hook run as git runs it, with ``lines`` on stdin; and how many git processes it
    started (GIT_TRACE logs each one: ``built-in: git ...`` or ``exec: git-...``)."""
    trace = repo.parent / f"trace-{os.urandom(3).hex()}"
    hooks = git(repo, "rev-parse", "--path-format=absolute", "--git-path", "hooks").strip()
    res = subprocess.run(
        [os.path.join(hooks, "pre-push"), "origin", url],
        cwd=repo,
        input="".join(ln + "\n" for ln in lines),
        capture_output=True,
        text=True,
        env=dict(os.environ, GIT_TRACE=str(trace)),
    )
    text = trace.read_text() if trace.exists() else ""
    return res, sum(" trace: built-in: git " in ln or " trace: exec: git-" in ln for ln in text.splitlines())


def test_pre_push_of_1000_refs_walks_them_in_a_handful_of_git_processes(pushing, make_repo):
    """1,000 pushed refs, each judged by what it gains over its own value on the remote, in one walk: a few git
    processes (two a ref before), and the one ref that brings a path another lease holds is still refused."""
    r, bare = pushing
    git(r, "config", "lease.enforce", "others")
    other = make_repo("other")
    git(other, "config", "lease.remote", bare.as_uri())
    acquire(other, "held", agent="agent-b", task="task-b")
    base = git(r, "rev-parse", "HEAD").strip()
    names = [f"b{k:04d}" for k in range(1000)]
    old = _branches(r, dict.fromkeys(names, base), lambda n: f"free/{n}")
    assert run(r, "push", "-q", "--no-verify", "origin", "refs/heads/*:refs/heads/*").returncode == 0
    new = _branches(r, old, lambda n: "held/x" if n == "b0500" else f"free/{n}/2")
    lines = [f"refs/heads/{n} {new[n]} refs/heads/{n} {old[n]}" for n in names]
    lines.append(f"refs/heads/fresh {new['b0007']} refs/heads/fresh {'0' * 40}")  # a new ref: against HEAD
    res, one = _hook_processes(r, bare.as_uri(), lines[500:501])
    assert res.returncode == 4 and "1 path inside leases held by others" in res.stderr, res.stderr
    res, processes = _hook_processes(r, bare.as_uri(), lines)
    assert res.returncode == 4 and "1 path inside leases held by others" in res.stderr, res.stderr
    assert "  held/x: scope held, " in res.stderr
    # the walk adds a merge-base (the refs' bases differ); everything else is what one ref costs: the listing,
    # the fetch of the leases near the change, their records (two git processes a ref before)
    assert processes <= one + 1 and processes < 30, (one, processes)
    del lines[500]  # without the one bringing held/x: allowed
    res, processes = _hook_processes(r, bare.as_uri(), lines)
    assert res.returncode == 0, res.stderr
    assert processes <= one, (one, processes)


def test_pre_push_of_several_refs_judges_each_against_its_own_remote_value(pushing, make_repo):
    """Two refs in one push: a commit that one ref already has on the remote is still gained by the other
    (main moving onto topic's history brings topic's commit to main), so it is judged; one walk for both must
    not let the first ref's remote value hide it."""
    r, bare = pushing
    git(r, "config", "lease.enforce", "others")
    base = git(r, "rev-parse", "HEAD").strip()
    assert commit(r, "shared/old", extra=("--no-verify",)).returncode == 0
    early = git(r, "rev-parse", "HEAD").strip()
    assert run(r, "push", "-q", "--no-verify", "origin", "HEAD:refs/heads/topic").returncode == 0
    other = make_repo("other")
    git(other, "config", "lease.remote", bare.as_uri())
    acquire(other, "shared", agent="agent-b", task="task-b")  # leased after topic reached the remote
    assert commit(r, "free/a", extra=("--no-verify",)).returncode == 0
    later = git(r, "rev-parse", "HEAD").strip()
    ok = f"refs/heads/topic {later} refs/heads/topic {early}"
    res, _ = _hook_processes(r, bare.as_uri(), [ok])
    assert res.returncode == 0, res.stderr  # topic gains only free/a
    res, _ = _hook_processes(r, bare.as_uri(), [ok, f"refs/heads/main {later} refs/heads/main {base}"])
    assert res.returncode == 4 and "  shared/old: scope shared, " in res.stderr, res.stderr
    assert "1 path inside leases held by others" in res.stderr
    git(r, "update-ref", "refs/heads/moved", later)
    res = run(r, "push", "-q", "origin", "moved:topic", "moved:main")  # the same through git itself
    assert res.returncode == 1 and "  shared/old: scope shared, " in res.stderr, res.stderr


def test_pre_push_that_gains_no_path_does_not_read_the_store(pushing):
    """A push that brings no commit the remote's refs lack (a branch moved back, a delete) touches no path:
    nothing pushed could be held, so the hook does not list the store at all; one that gains a path does."""
    r, bare = pushing
    acquire(r, "src")
    assert commit(r, "src/a").returncode == 0
    assert commit(r, "src/b").returncode == 0
    assert run(r, "push", "-q", "origin", "HEAD:refs/heads/topic").returncode == 0
    for args, lists in ((("+HEAD~1:refs/heads/topic",), 0), ((":refs/heads/topic",), 0), (("HEAD:refs/heads/t2",), 1)):
        trace = r.parent / f"trace-gain-{lists}-{args[0][0]}"
        res = run(r, "push", "-q", "origin", *args, env={"GIT_TRACE": str(trace)})
        assert res.returncode == 0, (args, res.stderr)
        calls = sum("built-in: git ls-remote" in ln for ln in trace.read_text().splitlines())
        assert calls == lists, (args, calls)


def test_pre_push_refuses_when_lease_lost_or_store_unreachable(pushing):
    r, bare = pushing
    lease = acquire(r, "src")
    assert commit(r, "src/a").returncode == 0
    for ref in git(bare, "for-each-ref", "--format=%(refname)", "refs/leases/").split():
        git(bare, "update-ref", "-d", ref)  # someone cleared the lease on the remote
    res = run(r, "push", "-q", "origin", "HEAD:main")
    assert res.returncode == 1
    assert (
        f"  src/a: scope src, this worktree's lease {lease} is gone from the lease store (released, or "
        "cleared and lost)"
    ) in res.stderr
    git(r, "config", "lease.remote", str(bare.parent / "missing.git"))
    res = run(r, "push", "-q", "origin", "HEAD:main")
    assert res.returncode == 1 and "cannot read the lease store" in res.stderr and "fail closed" in res.stderr


# ------------------------------------------------------------------------- the fast path


def test_hook_entry_imports_only_a_little_stdlib(repo):
    acquire(repo, "src")
    write(repo, "src/a")
    git(repo, "add", ".")
    code = (
        "import sys; sys.path.append(sys.argv[1]); from gitlease.enforce import entry; rc = entry.run("
        "['pre-commit']); heavy = {'subprocess', 'dataclasses', 'typing', 'typer', 'gitlease.service.leases', "
        "'gitlease.core.record', 'gitlease.core.scope', 'json', 're'} & set(sys.modules); assert rc == 0 and not heavy, (rc, heavy)"
    )
    res = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], cwd=repo, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # others mode with another worktree's lease on the repository: the refs are read, still nothing heavy
    wt = repo.parent / "linked"
    git(repo, "worktree", "add", "-q", "--detach", str(wt))
    acquire(wt, "zzz")
    git(repo, "config", "lease.enforce", "others")
    res = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], cwd=repo, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_the_server_hook_judges_a_claim_without_the_lease_service(repo):
    """A claim (lease refs only: the push a server sees most) is judged without importing the lease service,
    which only a branch update needs; the installed pre-receive starts Python without site-packages (-S)."""
    acquire(repo, "src")
    listed = git(repo, "for-each-ref", "--format=%(objectname) %(refname)", "refs/leases/").splitlines()
    assert len(listed) == 2  # its id ref and its scope ref
    data = "".join(f"{'0' * 40} {line}\n" for line in listed)  # created, as its claim push did
    code = (
        "import sys; sys.path.append(sys.argv[1]); from gitlease.enforce import entry; rc = entry.run("
        "['pre-receive']); heavy = {'gitlease.service.leases', 'gitlease.core.repo'} & set(sys.modules); "
        "assert rc == 0 and not heavy, (rc, heavy)"
    )
    res = subprocess.run(
        [sys.executable, "-S", "-c", code, str(ROOT)], cwd=repo, input=data, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert '"$GITLEASE_PYTHON" -S -c ' in (ROOT / "hooks" / "pre-receive").read_text()


def test_mirrored_layouts_agree_with_the_library(tmp_path):
    st_ = HeldState(str(tmp_path))
    with st_.locked() as held:
        held["lease_abcdefgh"] = Held(
            lease_id="lease_abcdefgh",
            store="origin",
            current="c" * 40,
            grant="g" * 40,
            record='{"expiresAt":"2030-01-01T00:00:00Z","stopBy":"2029-12-31T23:59:00Z"}',
            paths=["a", "b/c"],
            expires_at="2030-01-01T00:00:00Z",
            version=3,
        )
    (m,) = enforce.load_held(st_.path)
    assert (m.lease_id, m.paths, m.expires_at, m.grant) == (
        "lease_abcdefgh",
        ("a", "b/c"),
        "2029-12-31T23:59:00Z",  # the writer stops at the record's stop deadline, not its expiry
        "g" * 40,
    )
    with st_.locked() as held:
        held["lease_abcdefgh"].record = "{}"
    (m,) = enforce.load_held(st_.path)
    assert enforce.expired(m.expires_at, 0)  # no readable deadline: counts as passed (fail closed)
    assert enforce.refs_cache_path(str(tmp_path), "origin") == _RefsCache(str(tmp_path / "gitlease"), "origin").path


segment = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=5).filter(
    lambda s: "/" not in s and "\\" not in s and s not in (".", "..") and s.lower() != ".git"
)
paths = st.lists(segment, min_size=1, max_size=4).map("/".join)


@given(paths, paths)
def test_fast_containment_is_scope_containment(a, b):
    a, b = scope.normalize(a), scope.normalize(b)
    assert enforce.contains(a, b) == scope.contains(a, b)
    assert enforce.contains(".", b) and scope.contains(".", b)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids),
    max_leaves=20,
)


@given(json_values, st.booleans())
def test_fast_json_reader_agrees_with_json(value, pretty):
    text = json.dumps(value, indent=1 if pretty else None)
    assert enforce.loads(text) == json.loads(text)
    with pytest.raises(ValueError):
        enforce.loads(text + " x")


def test_a_mirror_push_that_would_wipe_the_leases_is_refused_by_the_pre_push_hook(tmp_path):
    """``git push --mirror`` from a clone that never fetched the lease refs deletes every lease on the remote
    (where no server hook runs): the pre-push hook refuses any push deleting gitlease's refs; gitlease's own
    writes push without hooks."""
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    holder, mirror = tmp_path / "holder", tmp_path / "mirror"
    for clone in (holder, mirror):
        git(tmp_path, "init", "-q", str(clone))
        git(clone, "remote", "add", "origin", bare.as_uri())
        git(clone, "config", "lease.remote", "origin")
    git(holder, "commit", "-q", "--allow-empty", "-m", "init")
    git(holder, "push", "-q", "origin", "HEAD:refs/heads/main")
    acquire(holder, "svc")
    git(mirror, "pull", "-q", "origin", "main")
    assert cli(mirror, "install-hooks").returncode == 0
    before = git(bare, "for-each-ref", "refs/leases/")
    res = run(mirror, "push", "--mirror", "origin")  # git shows the hook none of a mirror's deletions
    assert res.returncode != 0 and "is a mirror (or --prune) push" in res.stderr, res.stderr
    lease_ref = before.split()[-1]
    res = run(mirror, "push", "origin", f":{lease_ref}")  # a delete by name: the hook sees it
    assert res.returncode != 0 and f"deletes 1 of gitlease's refs ({lease_ref})" in res.stderr, res.stderr
    assert git(bare, "for-each-ref", "refs/leases/") == before != ""
    assert run(mirror, "push", "-q", "origin", "HEAD:refs/heads/other").returncode == 0  # branches by name: fine
