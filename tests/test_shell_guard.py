"""``git-lease-hook pre-shell`` / ``post-shell``: what an agent's shell command changed, judged by the leases,
and the fence put back; run as agents run them (a process, the payload on stdin), around real commands."""

import json
import subprocess

import pytest
from conftest import cli, git
from test_guard import hook
from test_hooks import acquire


@pytest.fixture
def repo(make_repo):
    return make_repo("work")


def shell(repo, command, call="call-1", event=("PreToolUse", "PostToolUse")):
    """Run ``command`` the way an agent's shell tool does, between the two hooks. Returns post-shell's result
    and the text it gives the model (its JSON's additionalContext), or None."""
    payload = {"tool_name": "Bash", "tool_use_id": call, "tool_input": {"command": command}, "cwd": str(repo)}
    pre = hook(repo, "pre-shell", "claude", payload=dict(payload, hook_event_name=event[0]))
    assert pre.returncode == 0, pre.stderr
    subprocess.run(["sh", "-c", command], cwd=repo, check=True, capture_output=True)
    post = hook(repo, "post-shell", "claude", payload=dict(payload, hook_event_name=event[1]))
    assert post.returncode == 0 and post.stderr == "", post.stderr  # never a code that replaces the output
    if not post.stdout.strip():
        return None
    doc = json.loads(post.stdout)
    assert doc["hookSpecificOutput"]["hookEventName"] == event[1]
    return doc["hookSpecificOutput"]["additionalContext"]


def test_only_what_the_command_changed_is_reported(repo):
    lease = acquire(repo, "src")
    (repo / "notes.txt").write_text("there before\n")  # untracked, outside the lease: not this command's doing
    (repo / "README").write_text("changed before\n")
    assert shell(repo, "ls; git status; echo hello") is None
    assert shell(repo, "mkdir -p src && echo ok > src/a.py") is None
    text = shell(repo, "echo more >> README; echo new > todo.md")
    assert text.splitlines() == [
        "gitlease: this command changed 2 paths outside what this worktree may write (lease.enforce=strict); the "
        "commit hook and the push refuse them:",
        f"  README (changed) is outside this worktree's leases ({lease}: src)",
        f"  todo.md (changed) is outside this worktree's leases ({lease}: src)",
        "gitlease: undo those changes (git checkout -- PATH, or remove a file the command created), or extend the "
        f"lease: git lease extend {lease} --scope README --scope todo.md",
    ]


def test_the_fence_is_put_back_and_the_model_told(repo):
    acquire(repo, ".")
    assert cli(repo, "agent-hooks", "install", "claude").returncode == 0
    assert cli(repo, "install-hooks").returncode == 0
    settings = repo / ".claude" / "settings.local.json"
    before = settings.read_bytes()
    pre_commit = repo / ".git" / "hooks" / "pre-commit"
    hook_text = pre_commit.read_bytes()
    text = shell(repo, "rm .claude/settings.local.json; echo 'exit 0' > .git/hooks/pre-commit")
    assert "gitlease put it back as it was" in text and ".claude/settings.local.json" in text
    assert settings.read_bytes() == before and pre_commit.read_bytes() == hook_text
    text = shell(repo, "git config lease.enforce off; echo '{\"disableAllHooks\": true}' > .claude/settings.json")
    assert "git config lease.enforce" in text and ".claude/settings.json" in text
    assert not (repo / ".claude" / "settings.json").exists()
    assert git(repo, "config", "--get", "lease.enforce", check=False) == ""


def test_commits_without_the_hook_stashes_and_a_forged_held_json_are_reported(repo, tmp_path):
    lease = acquire(repo, "src")
    text = shell(repo, "echo x > docs.md && git add docs.md && git commit -q --no-verify -m sneak")
    assert f"docs.md (committed) is outside this worktree's leases ({lease}: src)" in text
    text = shell(repo, "echo y >> README && git stash -q")
    assert "README (stashed) is outside" in text
    held = repo / ".git" / "gitlease" / "held.json"
    doc = json.loads(held.read_text())
    doc["leases"][lease]["paths"].append("docs")
    (tmp_path / "forged.json").write_text(json.dumps(doc))
    text = shell(repo, f"cp {tmp_path / 'forged.json'} .git/gitlease/held.json")
    assert f"held.json lists docs under lease {lease}, which the lease store does not grant it" in text


def test_a_patch_in_a_shell_command_is_checked(repo):
    acquire(repo, "src")
    patch = "apply_patch <<'EOF'\n*** Begin Patch\n  *** Add File: docs/x.md\n+x\n*** End Patch\nEOF\n"
    payload = {"tool_name": "Bash", "tool_use_id": "c", "tool_input": {"command": patch}, "cwd": str(repo)}
    res = hook(repo, "pre-shell", payload=payload)
    assert res.returncode == 2 and "docs/x.md is outside" in res.stderr


def test_gemini_gets_its_own_event_name(repo):
    acquire(repo, "src")
    text = shell(repo, "echo x > out.txt", event=("BeforeTool", "AfterTool"))
    assert "out.txt (changed) is outside" in text
