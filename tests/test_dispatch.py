"""The stdlib dispatcher in front of the typer command modules."""

import importlib
import json
import subprocess
import sys

import pytest
import typer.main
from conftest import cli

from gitlease.cli import COMMANDS


def test_every_listed_command_is_defined_by_its_module():
    for name, (module, _) in COMMANDS.items():
        group = typer.main.get_group(importlib.import_module(f"gitlease.cli.{module}").app)
        assert name in group.commands, f"{name} is listed for gitlease.cli.{module} but not defined there"


def test_top_level_help_lists_commands_without_importing_typer():
    code = (
        "import sys; from gitlease.cli import dispatch; rc = dispatch(['-h']); "
        "assert rc == 0 and 'typer' not in sys.modules and 'click' not in sys.modules, sorted(sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert all(name in res.stdout for name in COMMANDS) and "Exit codes" in res.stdout


def test_unknown_command_and_no_command_are_usage_errors(tmp_path):
    res = cli(tmp_path, "acqire", "--json")
    assert res.returncode == 2 and "did you mean 'acquire'" in res.stderr
    assert json.loads(res.stdout)["error"]["kind"] == "usage"
    res = cli(tmp_path)
    assert res.returncode == 2 and "commands:" in res.stdout
    res = cli(tmp_path, "--version")
    assert res.returncode == 0 and res.stdout.startswith("git-lease ")
    res = cli(tmp_path, "help", "renew")
    assert res.returncode == 0 and "LEASE_ID" in res.stdout


@pytest.mark.parametrize(
    "argv,command,needle",
    [
        (["ci", "--json"], "ci", "--json"),
        (["acquire", "--json", "--bogus"], "acquire", "--bogus"),
        (["renew", "lease_x", "--json", "--bogus"], "renew", "--bogus"),
        (["ci", "install", "--json"], "ci install", "github|gitlab"),
        (["worktree", "add", "--json"], "worktree add", "LEASE_ID"),
    ],
)
def test_a_usage_error_with_json_prints_the_envelope_too(tmp_path, argv, command, needle):
    res = cli(tmp_path, *argv)
    assert res.returncode == 2 and "Usage: git lease" in res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["command"] == command
    assert doc["error"]["kind"] == "usage" and doc["error"]["exitCode"] == 2 and needle in doc["error"]["message"]


def test_a_usage_error_without_json_prints_nothing_on_stdout(tmp_path):
    res = cli(tmp_path, "acquire", "--bogus")
    assert res.returncode == 2 and res.stdout == "" and "No such option" in res.stderr


def test_the_write_path_imports_no_verification_audit_or_crypto():
    """acquire/renew/release without a key never verify anything: their start-up must not pay for it."""
    code = (
        "import sys, gitlease.cli.core, gitlease.service.leases, gitlease.core.store; "
        "heavy = [m for m in ('gitlease.identity.trust', 'gitlease.identity.sshsig', 'gitlease.service.audit', 'cryptography') "
        "if m in sys.modules]; assert not heavy, heavy"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_an_unsigned_acquire_loads_no_verification_code_even_after_a_status(tmp_path):
    """The writer's trust check costs nothing on an unsigned store: the cached 'no trust file' is enough."""
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "i"], check=True)
    assert cli(repo, "status").returncode == 0  # caches the store's trust: none
    code = (
        "import sys; from gitlease.cli import dispatch; rc = dispatch(['acquire', '-s', 'x', '--json']); "
        "assert rc == 0, rc; heavy = [m for m in ('gitlease.identity.trust', 'gitlease.identity.sshsig', "
        "'cryptography') if m in sys.modules]; assert not heavy, heavy"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
