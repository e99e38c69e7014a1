"""The real coding-agent clients, installed from the npm registry by ``make test-agents`` into a cache folder
(``GITLEASE_AGENT_CLIENTS``: its ``node_modules/.bin``), each run headless against a scripted model server
(testing/fakemodel.py) on loopback, in a temporary HOME. Used by tests/test_real_agents.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testing.fakemodel import FakeModel

CLIENTS = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "gemini": "@google/gemini-cli",
    "inspector": "@modelcontextprotocol/inspector",
}


def client_bin(name: str) -> Path | None:
    """The installed client's executable, or None (not installed: the real-client tests are skipped)."""
    root = os.environ.get("GITLEASE_AGENT_CLIENTS")
    if not root:
        return None
    exe = Path(root) / "node_modules" / ".bin" / name
    return exe if exe.exists() else None


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "GEMINI_", "GOOGLE_"))}
    env.update(HOME=str(home), DISABLE_AUTOUPDATER="1", NO_UPDATE_NOTIFIER="1", CI="1")
    env.pop("CODEX_HOME", None)
    env.pop("CLAUDE_CONFIG_DIR", None)
    return env


def run_claude(repo: Path, home: Path, fm: FakeModel, *extra: str, timeout: int = 240):
    env = dict(
        base_env(home),
        ANTHROPIC_BASE_URL=fm.url,
        ANTHROPIC_API_KEY="sk-ant-test",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    argv = [str(client_bin("claude")), "-p", "do the task", "--output-format", "json", "--model", "claude-sonnet-4-5"]
    argv += ["--allowedTools", "Write,Edit,Bash,Read,mcp__gitlease", *extra]
    return subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)


def run_codex(repo: Path, home: Path, fm: FakeModel, *extra: str, timeout: int = 240):
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "gpt-5.3-codex"\nmodel_provider = "fake"\n'
        "[model_providers.fake]\n"
        f'name = "fake"\nbase_url = "{fm.url}/v1"\nwire_api = "responses"\nenv_key = "FAKE_OPENAI_KEY"\n'
        "request_max_retries = 0\nstream_max_retries = 0\n"
    )
    env = dict(base_env(home), FAKE_OPENAI_KEY="sk-test", CODEX_HOME=str(codex_home))
    argv = [str(client_bin("codex")), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access"]
    argv += [*extra, "do the task"]
    return subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)


def run_gemini(repo: Path, home: Path, fm: FakeModel, *extra: str, timeout: int = 240):
    env = dict(base_env(home), GEMINI_API_KEY="test-key", GOOGLE_GEMINI_BASE_URL=fm.url)
    argv = [str(client_bin("gemini")), "-p", "do the task", "--yolo", "-m", "gemini-2.5-pro", *extra]
    return subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)


RUN = {"claude": run_claude, "codex": run_codex, "gemini": run_gemini}

__all__ = ["CLIENTS", "client_bin", "RUN"]
