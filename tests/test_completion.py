"""Completion scripts, generated from the commands: real bash with git's own completion completes them."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import cli, git

from gitlease.cli import COMMANDS

GIT_COMPLETION = "/usr/share/bash-completion/completions/git"


def _complete(*words, cwd=None):
    script = f"""source {GIT_COMPLETION}
eval "$(git lease completion bash)"
COMP_WORDS=({" ".join(repr(w) for w in words)}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
COMP_LINE="{" ".join(words)}"; COMP_POINT=${{#COMP_LINE}}; COMPREPLY=()
__git_wrap__git_main; printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=cwd)
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
    assert cli(tmp_path, "completion", "tcsh").returncode == 2


def _held_and_known(make_repo):
    a, b = make_repo("a"), make_repo("b")
    git(b, "worktree", "add", "-q", "--detach", str(a.parent / "b2"))
    b2 = a.parent / "b2"
    mine = json.loads(cli(b2, "acquire", "-s", "x", "--json").stdout)["result"]["leaseId"]
    other = json.loads(cli(b, "acquire", "-s", "y", "--json").stdout)["result"]["leaseId"]
    assert cli(b2, "status").returncode == 0  # the listing is cached
    return b2, mine, other


@pytest.mark.skipif(not os.path.exists(GIT_COMPLETION), reason="git's bash completion is not installed")
def test_bash_completes_lease_ids_held_here_for_release_and_renew_known_for_show(make_repo):
    where, mine, other = _held_and_known(make_repo)
    assert _complete("git", "lease", "release", "", cwd=where) == [mine]
    assert _complete("git", "lease", "renew", "lease_", cwd=where) == [mine]
    assert set(_complete("git", "lease", "show", "", cwd=where)) == {mine, other}
    assert "--all" in _complete("git", "lease", "release", "--a", cwd=where)


def test_lease_ids_for_completion_read_local_state_only(make_repo, tmp_path):
    where, mine, other = _held_and_known(make_repo)
    assert cli(where, "completion", "--lease-ids", "held").stdout.split() == [mine]
    assert sorted(cli(where, "completion", "--lease-ids", "known").stdout.split()) == sorted([mine, other])
    assert cli(where, "completion", "--lease-ids", "all").returncode == 2
    assert cli(tmp_path, "completion", "--lease-ids", "held").stdout == ""  # not a repository: nothing, no error


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_commands_options_subcommands_and_lease_ids(make_repo, tmp_path):
    where, mine, other = _held_and_known(make_repo)
    script = tmp_path / "git-lease.fish"
    script.write_text(cli(where, "completion", "fish").stdout)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])

    def complete(line):
        res = subprocess.run(
            ["fish", "--no-config", "-c", f"source {script}; complete -C {line!r}"],
            capture_output=True,
            text=True,
            env=env,
            cwd=where,
        )
        assert res.returncode == 0, res.stderr
        return [ln.split("\t")[0] for ln in res.stdout.splitlines()]

    assert complete("git lease acq") == ["acquire"]
    assert complete("git-lease can") == ["can-start"]
    assert "--scope" in complete("git lease acquire --sc")
    assert complete("git lease worktree p") == ["prune"]
    assert complete("git lease release ") == [mine]
    assert sorted(complete("git lease show ")) == sorted([mine, other])
