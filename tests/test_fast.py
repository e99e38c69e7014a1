"""The typer-free fast path of the core commands parses exactly as click does, or hands the line to click."""

import inspect
import itertools
import subprocess
import sys

import click
import pytest
import typer.main

from gitlease.cli import core, fast


def click_command(name: str) -> click.Command:
    return typer.main.get_group(core.app).commands[name]


def click_parse(name: str, args: list[str]):
    """click's own parse: the parameters, or None for anything click refuses (or answers with help)."""
    cmd = click_command(name)
    try:
        ctx = cmd.make_context(name, list(args), resilient_parsing=False)
    except (click.exceptions.UsageError, click.exceptions.Exit):
        return None
    params = dict(ctx.params)
    for key, value in list(params.items()):
        if isinstance(value, tuple):
            params[key] = list(value)
    return params


def test_the_generated_table_is_up_to_date_and_covers_every_core_command():
    """fastspec.py is generated from the typer definitions (the one definition): stale means regenerate."""
    assert fast.main(["--check"]) == 0, "run: python -m gitlease.cli.fast"
    assert set(fast.specs()) == set(core.COMMANDS)
    assert fast.specs() == fast.build()


def test_an_option_kind_the_fast_path_does_not_parse_goes_to_click():
    """A choice, a float, a --x/--no-x pair: the table says "click", and a line using it is click's."""
    import copy

    table = copy.deepcopy(fast.specs())
    table["status"]["options"]["--mine"] = ("mine", "click")
    original = fast.specs
    fast.specs = lambda: table
    try:
        assert fast.parse("status", ["--mine"]) is None
        assert fast.parse("status", ["--json"]) == {"as_json": True}
    finally:
        fast.specs = original


LINES = {
    "acquire": [
        ["-s", "a"],
        ["--scope", "a", "-s", "b/c", "--task", "t", "--agent", "x"],
        ["-sa"],
        ["--scope=a"],
        ["-s", "a", "--ttl", "5m", "--json"],
        ["-s", "a", "--holder-pid", "12"],
        ["-s", "a", "--holder-pid", "x"],
        ["-s", "a", "--wait", "10s", "--replace", "lease_1"],
        ["-s", "a", "--worktree", "--base", "main"],
        ["-s", "a", "--branch=b", "--workspace", "w", "--remote", "origin"],
        [],
        ["--task", "t"],
        ["-s"],
        ["-s", "-x"],
        ["-s", "a", "--json", "--json"],
        ["-s", "a", "--no-worktree"],
        ["-s", "a", "extra"],
        ["-s", "a", "-h"],
        ["--help"],
        ["-s", "a", "--bogus"],
        ["-s", "a", "--"],
        ["-s", "a", "--task", "t1", "--task", "t2"],
        ["-s", "a", "--json=1"],
        ["-s", "", "--task="],
        ["-s=a"],
        ["-s", "a", "--ttl"],
    ],
    "renew": [
        ["lease_1"],
        ["lease_1", "--ttl", "60", "--progress", "tests 4/10"],
        ["--json", "lease_1"],
        [],
        ["lease_1", "lease_2"],
        ["--", "lease_1"],
        ["lease_1", "--progress=--x"],
        ["lease_1", "--progress", "-x"],
    ],
    "release": [
        ["lease_1"],
        ["--all"],
        ["--all", "--json"],
        ["lease_1", "--force"],
        ["--force", "--json", "lease_1", "--remote", "r"],
        ["lease_1", "--no-force"],
        [],
        ["lease_1", "--force", "--force"],
    ],
    "status": [[], ["--json"], ["--mine", "--fresh"], ["--remote", "origin"], ["x"], ["--remote"], ["--no-mine"]],
    "show": [["lease_1"], ["lease_1", "--json"], [], ["a", "b"]],
    "can-start": [["-s", "a"], ["--scope", "a", "--scope", "b", "--json"], [], ["a"]],
}


@pytest.mark.parametrize("name", sorted(LINES))
def test_the_fast_parse_is_click_parse_or_nothing(name):
    assert click_parse(name, LINES[name][0]) is not None
    taken = 0
    for args in LINES[name]:
        mine, theirs = fast.parse(name, args), click_parse(name, args)
        if mine is None:
            continue  # click decides (help, usage error, or a rare form): always correct, only slower
        taken += 1
        assert theirs is not None, (args, mine)
        # what the fast path gives is what click gives; what it leaves out, the function's default supplies,
        # and that is what click gives too
        defaults = {k: p.default for k, p in inspect.signature(fast.function(name)).parameters.items()}
        assert {k: mine.get(k, defaults[k]) for k in theirs} == theirs, (args, mine, theirs)
    assert taken >= len(LINES[name]) // 3  # the common forms do go the fast way


def test_generated_lines_parse_alike():
    """Every combination of a few tokens: wherever the fast path takes a line, click reads it the same way."""
    tokens = ["-s", "a", "--scope", "--json", "--ttl", "60", "--", "x", "--task=t", "-sb", "--worktree"]
    checked = 0
    for n in range(1, 5):
        for combo in itertools.permutations(tokens, n):
            args = list(combo)
            mine = fast.parse("acquire", args)
            if mine is None:
                continue
            theirs = click_parse("acquire", args)
            assert theirs is not None and all(theirs[k] == v for k, v in mine.items()), (args, mine, theirs)
            checked += 1
    assert checked > 100


def test_a_fast_command_imports_no_typer_or_click(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path / "r")], check=True)
    code = (
        "import sys; from gitlease.cli import dispatch; rc = dispatch(['can-start', '-s', 'a', '--json']); "
        "assert rc == 0, rc; assert 'typer' not in sys.modules and 'click' not in sys.modules, 'imported'"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "r", capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert '"free": true' in res.stdout
    code = (
        "import sys; from gitlease.cli import dispatch; rc = dispatch(['can-start', '-h']); "
        "assert rc == 0, rc; assert 'typer' in sys.modules"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "r", capture_output=True, text=True)
    assert res.returncode == 0, res.stderr  # help goes to typer
