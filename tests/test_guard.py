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
    assert edit(repo, "docs/to-src/a.py").returncode == 0
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert edit(repo, outside / "notes.txt").returncode == 0  # not in any repository: not gitlease's business
    os.symlink(outside / "notes.txt", repo / "src" / "out.txt")
    assert edit(repo, "src/out.txt").returncode == 0
    for bad in (".git/config", ".git/hooks/pre-commit", "src/../.git/HEAD"):
        res = edit(repo, bad)
        assert res.returncode == 2 and "is inside a .git folder" in res.stderr, bad


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


def test_post_shell_reports_changes_outside_the_lease(repo):
    lease = acquire(repo, "src")
    payload = {"hook_event_name": "PostToolUse", "tool_name": "Bash", "tool_input": {"command": "x"}, "cwd": str(repo)}
    assert hook(repo, "post-shell", payload=payload).returncode == 0  # nothing changed
    (repo / "src").mkdir()
    (repo / "src" / "a.py").write_text("ok\n")
    assert hook(repo, "post-shell", payload=payload).returncode == 0  # inside the lease
    (repo / "README").write_text("changed\n")
    (repo / "notes.txt").write_text("new\n")
    (repo / ".gitignore").write_text("build/\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.o").write_text("ignored\n")
    res = hook(repo, "post-shell", payload=payload)
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        "gitlease: after this command, 3 changed paths of the worktree lie outside what this worktree may write "
        "(lease.enforce=strict):",
        f"  .gitignore is outside this worktree's leases ({lease}: src)",
        f"  README is outside this worktree's leases ({lease}: src)",
        f"  notes.txt is outside this worktree's leases ({lease}: src)",
        f"gitlease: revert them (git checkout -- PATH; delete what is new), or extend the lease: git lease extend "
        f"{lease} --scope .gitignore --scope README --scope notes.txt; the commit hook refuses them as they are",
    ]
    outside = dict(payload, cwd=str(repo.parent))
    assert hook(repo, "post-shell", payload=outside).returncode == 0  # not in a repository


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
