"""``git lease agent-hooks install|uninstall``: gitlease's guard merged into each agent's hook settings, next to
the user's own hooks; and the command it installs, run as the agent runs it (``sh -c``, payload on stdin)."""

import json
import subprocess

import pytest
from conftest import cli, git
from test_hooks import acquire

USER_HOOK = {"type": "command", "command": "./my-format.sh", "timeout": 5}


def settings(path):
    return json.loads(path.read_text())


def ours(doc, event):
    return [h for g in doc["hooks"].get(event, []) for h in g["hooks"] if "gitlease" in h["command"]]


def test_claude_project_merge_idempotent_and_uninstall(make_repo):
    repo = make_repo("w")
    path = repo / ".claude" / "settings.local.json"
    path.parent.mkdir()
    mine = {
        "permissions": {"allow": ["Bash(npm test)"]},
        "hooks": {
            "PreToolUse": [{"matcher": "Bash", "hooks": [USER_HOOK]}],
            "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
        },
    }
    path.write_text(json.dumps(mine, indent=2))
    res = cli(repo / ".claude", "agent-hooks", "install", "claude")  # from a subfolder: the worktree's top
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"claude: installed {path}"]
    doc = settings(path)
    assert doc["permissions"] == mine["permissions"] and doc["hooks"]["Stop"] == mine["hooks"]["Stop"]
    assert doc["hooks"]["PreToolUse"][0] == {"matcher": "Bash", "hooks": [USER_HOOK]}
    (pre,) = [g for g in doc["hooks"]["PreToolUse"] if g["matcher"] == "Edit|Write|MultiEdit|NotebookEdit"]
    assert pre["hooks"][0]["command"].endswith(" pre-edit claude || exit 2") and pre["hooks"][0]["timeout"] == 120
    (shell,) = [g for g in doc["hooks"]["PreToolUse"] if g["matcher"] == "Bash" and g["hooks"] != [USER_HOOK]]
    assert shell["hooks"][0]["command"].endswith(" pre-shell claude || exit 2")
    (post,) = doc["hooks"]["PostToolUse"]
    assert post["matcher"] == "Bash" and post["hooks"][0]["command"].endswith(" post-shell claude")
    assert len(pre["hooks"][0]["command"]) < 200  # the agent may show it with a refusal: short
    before = path.read_text()
    res = cli(repo, "agent-hooks", "install", "claude")
    assert res.stdout.splitlines() == [f"claude: unchanged {path}"] and path.read_text() == before
    res = cli(repo, "agent-hooks", "uninstall", "claude", "--json")
    assert json.loads(res.stdout)["result"]["action"] == "removed"
    assert settings(path) == mine
    assert cli(repo, "agent-hooks", "uninstall", "claude").stdout.strip() == f"claude: absent {path}"


def test_user_settings_in_home(make_repo, isolated_git):
    repo = make_repo("w")
    res = cli(repo, "agent-hooks", "install", "claude", "--user")
    path = isolated_git / ".claude" / "settings.json"
    assert res.returncode == 0 and res.stdout.strip() == f"claude: installed {path}"
    assert ours(settings(path), "PreToolUse") and not (repo / ".claude").exists()
    res = cli(isolated_git, "agent-hooks", "uninstall", "claude", "--user")  # --user needs no repository
    assert res.returncode == 0 and settings(path) == {}


def test_codex_and_gemini_formats(make_repo):
    repo = make_repo("w")
    res = cli(repo, "agent-hooks", "install", "codex")
    assert res.returncode == 0 and "note: Codex runs project hooks only in a trusted project" in res.stdout
    doc = settings(repo / ".codex" / "hooks.json")
    assert [g["matcher"] for g in doc["hooks"]["PreToolUse"]] == ["apply_patch|Edit|Write", "Bash"]
    assert [g["matcher"] for g in doc["hooks"]["PostToolUse"]] == ["Bash"]
    gem = repo / ".gemini" / "settings.json"
    gem.parent.mkdir()
    gem.write_text(json.dumps({"hooks": {"disabled": ["old-hook"]}, "theme": "dark"}))
    assert cli(repo, "agent-hooks", "install", "gemini").returncode == 0
    doc = settings(gem)
    assert doc["theme"] == "dark" and doc["hooks"]["disabled"] == ["old-hook"]
    before, shell = doc["hooks"]["BeforeTool"]
    assert (before["matcher"], shell["matcher"]) == ("write_file|replace", "run_shell_command")
    assert before["hooks"][0]["name"] == "gitlease-pre-edit" and before["hooks"][0]["timeout"] == 120000
    assert doc["hooks"]["AfterTool"][0]["matcher"] == "run_shell_command"
    assert cli(repo, "agent-hooks", "uninstall", "gemini").returncode == 0
    assert settings(gem) == {"hooks": {"disabled": ["old-hook"]}, "theme": "dark"}


def test_refusals_change_nothing(make_repo, tmp_path):
    repo = make_repo("w")
    path = repo / ".claude" / "settings.local.json"
    path.parent.mkdir()
    path.write_text("{ not json")
    res = cli(repo, "agent-hooks", "install", "claude")
    assert res.returncode == 1 and "is not JSON" in res.stderr and path.read_text() == "{ not json"
    res = cli(repo, "agent-hooks", "install", "cursor")
    assert res.returncode == 2 and "unknown agent 'cursor'" in res.stderr and "check-path" in res.stderr
    res = cli(tmp_path, "agent-hooks", "install", "claude")
    assert res.returncode == 2 and "not inside a git worktree" in res.stderr


@pytest.mark.parametrize("portable", [False, True])
def test_the_installed_command_guards_edits(make_repo, portable):
    """The command written into the settings, run the way the agent runs it: through a shell, payload on stdin."""
    import os
    import sys

    repo = make_repo("w")
    lease = acquire(repo, "src")
    args = ["agent-hooks", "install", "claude"] + (["--portable"] if portable else [])
    assert cli(repo, *args).returncode == 0
    (group,) = [
        g for g in settings(repo / ".claude" / "settings.local.json")["hooks"]["PreToolUse"] if "Edit" in g["matcher"]
    ]
    command = group["hooks"][0]["command"]
    assert (command == "git-lease-hook pre-edit claude || exit 2") == portable
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])

    def run(path):
        payload = {"tool_name": "Edit", "tool_input": {"file_path": path}, "cwd": str(repo)}
        return subprocess.run(["sh", "-c", command], input=json.dumps(payload), capture_output=True, text=True, env=env)

    assert run("src/main.py").returncode == 0
    res = run("setup.py")
    assert res.returncode == 2 and f"git lease extend {lease} --scope setup.py" in res.stderr


def test_a_missing_python_fails_closed(tmp_path):
    from gitlease.enforce.agenthooks import hook_command

    res = subprocess.run(
        ["sh", "-c", hook_command("pre-edit", python=str(tmp_path / "gone" / "python"))],
        input="{}",
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "gone/python" in res.stderr  # the shell's "not found", and exit 2: refused


def test_what_install_writes_stays_out_of_git(make_repo):
    """``git add -A`` and ``git status`` never see the install's own files; each worktree shares the exclusion."""
    repo = make_repo("w")
    for agent in ("claude", "codex", "gemini"):
        assert cli(repo, "agent-hooks", "install", agent).returncode == 0
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    exclude = (repo / ".git" / "info" / "exclude").read_text()
    for line in ("/.claude/settings.local.json", "/.codex/hooks.json", "/.gemini/settings.json"):
        assert exclude.splitlines().count(line) == 1
    assert cli(repo, "agent-hooks", "install", "codex").returncode == 0
    assert (repo / ".git" / "info" / "exclude").read_text() == exclude  # once
    tracked = make_repo("t")
    (tracked / ".gemini").mkdir()
    (tracked / ".gemini" / "settings.json").write_text("{}")
    git(tracked, "add", ".gemini")
    git(tracked, "commit", "-q", "-m", "team settings")
    res = cli(tracked, "agent-hooks", "install", "gemini")
    assert res.returncode == 0 and ".gemini/settings.json is tracked by git" in res.stdout


def test_status_says_whether_the_hooks_will_run(make_repo, isolated_git):
    from gitlease.enforce.agenthooks import unfenced

    repo = make_repo("w")
    assert cli(repo, "agent-hooks", "status", "claude").returncode == 1  # not installed
    assert cli(repo, "agent-hooks", "install", "claude").returncode == 0
    res = cli(repo, "agent-hooks", "status", "claude")
    assert res.returncode == 0 and res.stdout.startswith("claude: active")
    (repo / ".claude" / "settings.json").write_text('{"disableAllHooks": true}')
    res = cli(repo, "agent-hooks", "status", "claude")
    assert res.returncode == 1 and "sets disableAllHooks" in res.stdout
    assert cli(repo, "agent-hooks", "install", "codex").returncode == 0
    res = cli(repo, "agent-hooks", "status", "codex")
    assert res.returncode == 1 and "Codex does not trust the project" in res.stdout
    hooks = str(repo / ".codex" / "hooks.json")
    states = "".join(
        f'[hooks.state."{hooks}:{event}:{g}:0"]\ntrusted_hash = "sha256:x"\n'
        for event, g in (("pre_tool_use", 0), ("pre_tool_use", 1), ("post_tool_use", 0))
    )
    (isolated_git / ".codex").mkdir()
    (isolated_git / ".codex" / "config.toml").write_text(f'[projects."{repo}"]\ntrust_level = "trusted"\n{states}')
    assert cli(repo, "agent-hooks", "status", "codex").returncode == 0
    assert cli(repo, "agent-hooks", "install", "gemini").returncode == 0
    res = cli(repo, "agent-hooks", "status", "gemini")
    assert res.returncode == 1 and "Gemini CLI does not trust the folder" in res.stdout
    assert "--skip-trust runs without the project's hooks" in unfenced(["gemini", "--skip-trust", "-p", "x"], str(repo))
    assert unfenced(["codex", "exec", "x"], str(repo)) is None and unfenced(["./agent.sh"], str(repo)) is None
