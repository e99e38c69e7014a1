"""Fuzzing scope arguments through the real ``git lease`` process: with ``--json``, exactly one JSON object on
stdout, on success and on failure, with the documented exit code (docs/cli.md), and never a traceback.
The in-process scope parser and the process agree on what is an invalid scope (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitlease.core import scope as scopes
from gitlease.core.errors import ScopeError
from testing.fuzz import examples

BIN = os.path.dirname(sys.executable)
CODES = {"acquire": {0, 1, 2, 3}, "can-start": {0, 1, 2, 3}}

weird = st.sampled_from(
    [
        "",
        ".",
        "..",
        "/",
        "a/../b",
        "./a",
        "a/",
        "a//b",
        "-x",
        "--json",
        "-s",
        "a\nb",
        "~",
        "*",
        " ",
        ".git",
        ".git/config",
        "refs",
        "%2e",
        "a.lock",
        "\u00fc",
        "a" * 5000,
        "\x01",
        "a\tb",
        "C:\\x",
        "\u202ea",
        "a\u2028b",
        "@{-1}",
        "lease_0000000000aaaaaa",
        "a b/c",
    ]
)
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=30)
raw = st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b)
scope_args = st.one_of(weird, weird, text, raw)


def _argv(command, values, form):
    out = [command, "--json"]
    for v in values:
        v = v if isinstance(v, bytes) else v.encode("utf-8")
        out += [b"--scope=" + v] if form == "equals" else [b"-s" if form == "short" else b"--scope", v]
    if form == "missing":
        out.append("--scope")
    return out


def _expect_invalid(values) -> bool:
    """Whether the in-process parser refuses one of these scopes (as the process must, with exit 2)."""
    for v in values:
        try:
            v = os.fsdecode(v) if isinstance(v, bytes) else v
            scopes.normalize(v)
        except ScopeError:
            return True
    return False


def check_scopes(repo, examples):
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        st.sampled_from(["can-start", "can-start", "acquire"]),
        st.lists(scope_args, min_size=1, max_size=3),
        st.sampled_from(["equals", "equals", "short", "long", "missing"]),
    )
    def prop(command, values, form):
        argv = _argv(command, values, form)
        res = subprocess.run(["git", "lease", *argv], cwd=repo, capture_output=True, env=env, timeout=60)
        err = res.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err, err
        assert res.returncode in CODES[command], (argv, res.returncode, err)
        lines = res.stdout.decode("utf-8").splitlines()
        assert len(lines) == 1, (argv, res.stdout)
        doc = json.loads(lines[0])
        assert doc["ok"] is (res.returncode == 0) and doc["command"] == command
        if not doc["ok"]:
            assert doc["error"]["exitCode"] == res.returncode and "\n" not in doc["error"]["message"]
            assert isinstance(doc["error"]["kind"], str) and isinstance(doc["error"]["details"], dict)
        if form == "missing":
            assert res.returncode == 2 and doc["error"]["kind"] == "usage"
        elif form != "long" and _expect_invalid(values):
            # (the long form may take a value starting with "-" as another option: click decides)
            assert res.returncode == 2 and doc["error"]["kind"] in ("invalid-scope", "usage"), (argv, doc)

    prop()


def test_fuzz_scope_arguments_json_envelope(make_repo):
    check_scopes(make_repo("cli"), examples(8, 300))


def test_click_usage_errors_print_the_envelope_too(make_repo):
    """Regression (found by fuzzing): ``--json`` with a usage error click itself reports (an option missing its
    value, an unknown option) printed click's usage text and no JSON at all."""
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])
    repo = make_repo("cli")
    for argv in (
        ["acquire", "--json", "--scope"],
        ["can-start", "--json", "--scope=x", "--bogus"],
        ["acquire", "--json"],
        ["renew", "--json"],
    ):
        res = subprocess.run(["git", "lease", *argv], cwd=repo, capture_output=True, text=True, env=env)
        doc = json.loads(res.stdout)
        assert res.returncode == 2 and doc["ok"] is False and doc["command"] == argv[0]
        assert doc["error"]["kind"] == "usage" and doc["error"]["exitCode"] == 2, res.stdout
        assert "Error:" in res.stderr  # click's own message (and usage) stays on stderr
    res = subprocess.run(["git", "lease", "can-start", "--scope=x"], cwd=repo, capture_output=True, text=True, env=env)
    assert res.returncode == 0 and res.stdout.strip() and not res.stdout.startswith("{")
