"""The edit-time guard (``git-lease-hook pre-edit``, ``post-shell``, ``check-path``), run as agents run it: a
process given the agent's hook payload on stdin, in real repositories with real leases."""

import calendar
import datetime
import json
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import ROOT, cli, git
from hypothesis import given
from hypothesis import strategies as st
from test_hooks import acquire

from gitlease.enforce import rules as enforce

ENTRY = "import sys; sys.path.append(sys.argv.pop(1)); from gitlease.enforce.entry import main; main()"


def hook(cwd, *args, payload=None):
    """``git-lease-hook ARGS`` as an agent's hook runner starts it (the fast form agent-hooks installs)."""
    data = None if payload is None else (payload if isinstance(payload, str) else json.dumps(payload))
    return subprocess.run(
        [sys.executable, "-S", "-c", ENTRY, str(ROOT), *args], cwd=cwd, input=data, capture_output=True, text=True
    )


def edit(repo, path, tool="Write", key="file_path", cwd=None, run_in=None):
    payload = {
        "session_id": "s",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": {key: str(path), "content": "x"},
        "cwd": str(cwd or repo),
    }
    return hook(run_in or repo, "pre-edit", payload=payload)


@pytest.fixture
def repo(make_repo):
    return make_repo("work")


def test_edit_inside_the_lease_passes_outside_is_refused_with_what_to_do(repo):
    lease = acquire(repo, "services/billing")
    res = edit(repo, "services/billing/api.py")
    assert (res.returncode, res.stderr) == (0, "")
    res = edit(repo, repo / "services/billing/new/deep.py")  # absolute, in folders that do not exist yet
    assert (res.returncode, res.stderr) == (0, "")
    res = edit(repo, "docs/guide.md")
    assert res.returncode == 2  # the one code that blocks the tool call (stderr goes to the model)
    assert res.stderr.splitlines() == [
        f"gitlease: edit refused: docs/guide.md is outside this worktree's leases ({lease}: services/billing); "
        f"to edit it, run git lease extend {lease} --scope docs/guide.md, or leave the file alone"
    ]
    # relative to the payload's cwd, not the hook process's
    res = edit(repo, "api.py", cwd=repo / "services" / "billing", run_in=repo.parent)
    assert res.returncode == 0, res.stderr
    res = edit(repo, "../../docs/x.md", cwd=repo / "services" / "billing", run_in=repo.parent)
    assert res.returncode == 2 and "docs/x.md is outside" in res.stderr


def test_another_worktrees_lease_names_its_holder(repo):
    other = repo.parent / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    theirs = acquire(other, "libs/tax", agent="codex-7", task="job-9")
    res = edit(repo, "libs/tax/rates.py")
    assert res.returncode == 2
    (line,) = res.stderr.splitlines()
    assert line.startswith(
        f"gitlease: edit refused: libs/tax/rates.py is held by {theirs} (task=job-9 agent=codex-7, "
    ) and line.endswith(
        "s left) on libs/tax; leave the file alone (git lease can-start --scope libs/tax says when it is free)"
    )
    assert edit(repo, "libs/other.py").returncode == 0  # this worktree holds nothing: mode others


def test_symlinks_outside_the_repository_and_git_dir(repo, tmp_path):
    acquire(repo, "src")
    (repo / "src").mkdir()
    (repo / "docs").mkdir()
    os.symlink("../docs/real.md", repo / "src" / "link.md")  # inside the lease, writes outside it
    os.symlink("../src", repo / "docs" / "to-src")  # outside the lease, writes inside it
    res = edit(repo, "src/link.md")
    assert res.returncode == 2 and "docs/real.md is outside" in res.stderr
    res = edit(repo, "docs/to-src/a.py")  # the file written is in the lease, the path the client reads is not
    assert res.returncode == 2 and "docs/to-src/a.py writes src/a.py through a symbolic link" in res.stderr
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert edit(repo, outside / "notes.txt").returncode == 0  # not in any repository: not gitlease's business
    os.symlink(outside / "notes.txt", repo / "src" / "out.txt")
    assert edit(repo, "src/out.txt").returncode == 0
    for bad in (".git/config", ".git/hooks/pre-commit", "src/../.git/HEAD"):
        res = edit(repo, bad)
        assert res.returncode == 2 and "is inside a git directory" in res.stderr, bad


def test_payloads_of_each_agent(repo):
    lease = acquire(repo, "src")
    assert edit(repo, "src/nb.ipynb", tool="NotebookEdit", key="notebook_path").returncode == 0
    assert edit(repo, "nb.ipynb", tool="NotebookEdit", key="notebook_path").returncode == 2
    assert edit(repo, "docs/a.md", tool="MultiEdit").returncode == 2
    assert edit(repo, repo / "docs/a.md", tool="write_file").returncode == 2  # Gemini CLI
    assert edit(repo, repo / "src/a.py", tool="replace").returncode == 0
    patch = "*** Begin Patch\n*** Update File: src/a.py\n@@\n-a\n+b\n*** Add File: docs/new.md\n+x\n*** End Patch\n"
    codex = {"tool_name": "apply_patch", "tool_input": {"command": patch}, "cwd": str(repo)}
    res = hook(repo, "pre-edit", payload=codex)
    assert res.returncode == 2 and "docs/new.md is outside" in res.stderr and "src/a.py" not in res.stderr
    move = patch.replace("*** Add File: docs/new.md\n+x\n", "*** Update File: src/b.py\n*** Move to: lib/b.py\n")
    res = hook(repo, "pre-edit", payload=dict(codex, tool_input={"command": move}))
    assert res.returncode == 2 and "lib/b.py is outside" in res.stderr
    cursor = {"hook_event_name": "afterFileEdit", "file_path": str(repo / "docs/a.md"), "workspace_roots": [str(repo)]}
    assert hook(repo, "pre-edit", payload=cursor).returncode == 2
    assert lease


def test_fails_closed(repo):
    lease = acquire(repo, "src")
    for payload in ("not json", "[1, 2]", json.dumps({"tool_name": "Edit", "tool_input": {}})):
        res = hook(repo, "pre-edit", payload=payload)
        assert res.returncode == 2 and res.stderr.startswith("gitlease: pre-edit refused: "), payload
    assert hook(repo, "pre-edit", payload={"tool_name": "Read", "tool_input": {}}).returncode == 0  # not an edit
    held = repo / ".git" / "gitlease" / "held.json"
    held.write_text("{broken")
    res = edit(repo, "src/a.py")
    assert res.returncode == 2 and "is corrupt" in res.stderr
    git(repo, "config", "lease.enforce", "warn")
    res = edit(repo, "src/a.py")
    assert res.returncode == 0 and "warning (lease.enforce=warn)" in res.stderr
    git(repo, "config", "lease.enforce", "bogus")
    res = edit(repo, "src/a.py")
    assert res.returncode == 2 and "lease.enforce must be one of" in res.stderr
    assert lease


def test_modes_warn_and_off(repo):
    acquire(repo, "src")
    git(repo, "config", "lease.enforce", "warn")
    res = edit(repo, "docs/a.md")
    assert res.returncode == 0 and res.stderr.startswith("gitlease: warning (lease.enforce=warn): edit of docs/a.md")
    git(repo, "config", "lease.enforce", "off")
    assert (edit(repo, "docs/a.md").returncode, edit(repo, "docs/a.md").stderr) == (0, "")


def test_extend_lets_the_refused_edit_through(repo):
    lease = acquire(repo, "src")
    assert edit(repo, "docs/a.md").returncode == 2
    assert cli(repo, "extend", lease, "--scope", "docs/a.md").returncode == 0
    assert edit(repo, "docs/a.md").returncode == 0
    assert edit(repo, "docs/b.md").returncode == 2


def test_check_path(repo, tmp_path):
    lease = acquire(repo, "src")
    res = hook(repo, "check-path", "src/a.py", str(tmp_path / "elsewhere.txt"))
    assert (res.returncode, res.stderr) == (0, "")
    res = hook(repo / ".git", "check-path", "../docs/x.md")
    assert res.returncode == 4 and res.stderr.startswith("gitlease: refused: docs/x.md is outside")
    assert hook(repo, "check-path", ".git/config").returncode == 4
    (repo / ".git" / "gitlease" / "held.json").write_text("[]")
    assert hook(repo, "check-path", "src/a.py").returncode == 5  # corrupt lease state: exit 5, as the hooks
    assert lease


def test_guard_imports_only_a_little_stdlib(repo):
    """The guard runs on every edit: no subprocess, json, re, typing, dataclasses, typer, nor the service."""
    lease = acquire(repo, "src")
    code = (
        "import io, sys, time; sys.path.append(sys.argv[1]); from gitlease.enforce import guard; "
        "out = guard.pre_edit(sys.argv[2].encode(), time.time()); "
        "heavy = {'subprocess', 'dataclasses', 'typing', 'typer', 'gitlease.service.leases', "
        "'gitlease.core.record', 'gitlease.core.scope', 'json', 're'} & set(sys.modules); "
        "print(out.code); assert not heavy, heavy"
    )
    for path, want in (("src/a.py", "0"), ("docs/a.md", "2")):
        payload = json.dumps({"tool_name": "Write", "tool_input": {"file_path": path}, "cwd": str(repo)})
        res = subprocess.run(
            [sys.executable, "-S", "-c", code, str(ROOT), payload], cwd=repo, capture_output=True, text=True
        )
        assert res.returncode == 0 and res.stdout.strip() == want, res.stderr
    assert lease


@given(st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31, 23, 59, 59)))
def test_fast_expiry_reader_agrees_with_strptime(when):
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ").rjust(20, "0")
    assert enforce.epoch(stamp) == calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


@given(st.text(alphabet="0123456789-:TZ", min_size=20, max_size=20))
def test_fast_expiry_reader_refuses_what_strptime_refuses(stamp):
    try:
        want = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        want = None
    try:
        got = enforce.epoch(stamp)
    except ValueError:
        got = None
    if want is not None and not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp):
        return  # strptime reads "1-1-1T..." forms too; records never hold them (fixed width): refusing is safer
    assert got == want


# ------------------------------------------------------------- the path the client writes, git dirs, the fence


@pytest.fixture
def two(repo):
    """``repo`` holds ``scope``; another worktree of it holds ``docs`` (agent b)."""
    other = repo.parent / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other))
    mine = acquire(repo, "scope")
    theirs = acquire(other, "docs", agent="b", task="tb")
    return repo, mine, theirs


def test_a_path_is_judged_as_the_client_normalises_it(two, tmp_path):
    repo, _, theirs = two
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (repo / "scope").mkdir()
    os.symlink(deep, repo / "scope" / "link")
    # the kernel would resolve this to tmp/a/docs/x (outside every repository); the client normalises it first
    # and writes the repository's docs/x, inside b's lease
    res = edit(repo, "scope/link/../../docs/x.md")
    assert res.returncode == 2 and f"docs/x.md is held by {theirs}" in res.stderr, res.stderr


def test_an_empty_git_folder_is_no_repository(two):
    repo, mine, theirs = two
    (repo / "docs" / ".git").mkdir(parents=True)
    res = edit(repo, "docs/x.md")
    assert res.returncode == 2 and f"docs/x.md is held by {theirs}" in res.stderr, res.stderr
    (repo / "lib" / ".git").mkdir(parents=True)
    res = edit(repo, "lib/y.py")
    assert res.returncode == 2 and f"lib/y.py is outside this worktree's leases ({mine}: scope)" in res.stderr
    res = edit(repo, "lib/.git/config")
    assert res.returncode == 2 and "is inside a git directory" in res.stderr


def test_every_patch_header_form_is_checked(repo):
    acquire(repo, "src")
    for header in ("*** Add File: docs/a.md", "   *** Add File: docs/a.md", "\t*** Update File:   docs/a.md  "):
        patch = f"*** Begin Patch\n{header}\n+x\n*** End Patch\n"
        res = hook(repo, "pre-edit", payload={"tool_name": "apply_patch", "tool_input": {"command": patch}})
        assert res.returncode == 2 and "docs/a.md is outside" in res.stderr, header


def test_writes_into_any_git_directory_are_refused(repo, tmp_path):
    store = tmp_path / "store.git"
    git(tmp_path, "init", "-q", "--bare", str(store))
    separate = tmp_path / "sep"
    git(tmp_path, "init", "-q", f"--separate-git-dir={tmp_path / 'sep.git'}", str(separate))
    for bad in (store / "hooks" / "pre-receive", store / "refs" / "leases" / "x", tmp_path / "sep.git" / "config"):
        res = edit(repo, bad)
        assert res.returncode == 2 and "is inside a git directory" in res.stderr, bad
    assert edit(repo, tmp_path / "plain" / "file.txt").returncode == 0  # outside every repository


def test_the_fence_files_are_never_editable(repo, isolated_git):
    acquire(repo, ".")  # the whole repository: still refused
    home = isolated_git
    for path in (
        ".claude/settings.json",
        ".claude/settings.local.json",
        ".codex/hooks.json",
        ".gemini/settings.json",
        home / ".claude" / "settings.json",
        home / ".codex" / "config.toml",
    ):
        res = edit(repo, path)
        assert res.returncode == 2 and "is an agent's hook settings" in res.stderr, path
    assert edit(repo, ".claude/commands/x.md").returncode == 0


def test_reads_are_never_refused(repo):
    acquire(repo, "src")
    for tool in ("Read", "Grep", "read_file", "read_many_files"):
        assert edit(repo, "docs/secret.md", tool=tool).returncode == 0, tool
    assert edit(repo, ".git/config", tool="Read").returncode == 0
    cursor = {"hook_event_name": "beforeReadFile", "file_path": str(repo / "docs/a.md")}
    assert hook(repo, "pre-edit", payload=cursor).returncode == 0


def test_a_forged_held_json_does_not_widen_the_lease(repo):
    lease = acquire(repo, "src")
    held = repo / ".git" / "gitlease" / "held.json"
    doc = json.loads(held.read_text())
    doc["leases"][lease]["paths"].append("docs")
    held.write_text(json.dumps(doc))
    assert edit(repo, "src/a.py").returncode == 0
    res = edit(repo, "docs/a.md")
    assert res.returncode == 2 and "does not hold it on the lease store" in res.stderr, res.stderr
    (repo / "docs").mkdir()
    (repo / "docs" / "a.md").write_text("x\n")
    git(repo, "add", "docs")
    from test_hooks import hook as git_hook

    cli(repo, "install-hooks")
    res = git_hook(repo, "pre-commit")
    assert res.returncode == 4 and "does not hold it on the lease store" in res.stderr


def test_a_lease_gone_from_the_local_store_stops_the_edits(repo):
    lease = acquire(repo, "src")
    git(repo, "update-ref", "-d", f"refs/leases/id/{lease}")
    res = edit(repo, "src/a.py")
    assert res.returncode == 2 and "is gone from the lease store" in res.stderr, res.stderr


def test_holders_are_found_in_packed_and_loose_refs(two):
    repo, _, theirs = two
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "leases" / "scope" / "docs").exists()
    res = edit(repo, "docs/x.md")
    assert res.returncode == 2 and f"is held by {theirs} (task=tb agent=b" in res.stderr, res.stderr
    other = acquire(repo.parent / "other", "libs", agent="b", task="tc")  # a loose ref next to packed ones
    res = edit(repo, "libs/y.py")
    assert res.returncode == 2 and f"is held by {other}" in res.stderr


def test_a_worktree_the_client_makes_itself_is_judged_like_any_worktree(repo):
    """Claude Code's EnterWorktree runs `git worktree add` under .claude/worktrees/ and moves the session there.
    That worktree holds no lease: with lease.enforce=strict in the repository's config (which every worktree
    reads) an edit there is refused, also of a path this checkout holds; in the default mode it is judged as
    "others" (a path another worktree holds is refused, the rest passes)."""
    acquire(repo, "src")
    made = repo / ".claude" / "worktrees" / "feature-x"
    git(repo, "worktree", "add", "-q", "-b", "feature-x", str(made))
    res = edit(made, made / "docs" / "a.md", run_in=made)
    assert res.returncode == 0, res.stderr  # default mode: nobody holds docs
    res = edit(made, made / "src" / "a.py", run_in=made)
    assert res.returncode == 2 and "is held by" in res.stderr, res.stderr  # the main checkout holds src
    git(repo, "config", "lease.enforce", "strict")
    res = edit(made, made / "docs" / "a.md", run_in=made)
    assert res.returncode == 2 and "docs/a.md" in res.stderr, res.stderr
    assert edit(repo, "src/a.py").returncode == 0  # the main checkout still edits what it holds
