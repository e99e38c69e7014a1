"""Completion scripts, generated from the commands: real bash with git's own completion completes them."""

import os
import subprocess
import sys

import pytest
from conftest import cli

from gitlease.cli import COMMANDS

GIT_COMPLETION = "/usr/share/bash-completion/completions/git"


def _complete(*words):
    script = f"""source {GIT_COMPLETION}
eval "$(git lease completion bash)"
COMP_WORDS=({" ".join(repr(w) for w in words)}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
COMP_LINE="{" ".join(words)}"; COMP_POINT=${{#COMP_LINE}}; COMPREPLY=()
__git_wrap__git_main; printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    return [w.strip() for w in res.stdout.splitlines() if w.strip()]


@pytest.mark.skipif(not os.path.exists(GIT_COMPLETION), reason="git's bash completion is not installed")
def test_bash_completes_commands_options_and_subcommands():
    assert _complete("git", "lease", "acq") == ["acquire"]
    assert set(_complete("git", "lease", "")) == set(COMMANDS)
    assert "--scope" in _complete("git", "lease", "acquire", "--sc")
    assert _complete("git", "lease", "worktree", "p") == ["prune"]
    assert "--remove" in _complete("git", "lease", "worktree", "prune", "--")


def test_zsh_script_names_every_command_and_bad_shell_is_usage(tmp_path):
    res = cli(tmp_path, "completion", "zsh")
    assert res.returncode == 0 and res.stdout.startswith("#compdef git-lease")
    assert all(f"'{name}:" in res.stdout for name in COMMANDS)
    assert cli(tmp_path, "completion", "fish").returncode == 2
