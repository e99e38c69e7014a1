"""The man page: generated from the code, committed up to date, valid roff, installed where man finds it, and
opened by `git lease --help` (git turns --help into `man git-lease`)."""

import os
import shutil
import subprocess
import sys
import tomllib

import pytest
from conftest import ROOT

from gitlease.cli import COMMANDS, manpage

PAGE = ROOT / "docs" / "man" / "git-lease.1"
needs_man = pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")


def test_committed_page_is_up_to_date():
    assert PAGE.read_text(encoding="utf-8") == manpage.render(), (
        "docs/man/git-lease.1 is out of date: run python -m gitlease.cli.manpage"
    )
    assert manpage.main(["--check", "-o", str(PAGE)]) == 0


def test_check_mode_catches_a_stale_page(tmp_path, capsys):
    stale = tmp_path / "git-lease.1"
    stale.write_text(manpage.render().replace(".SS doctor", ".SS doktor"))
    assert manpage.main(["--check", "-o", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_page_documents_every_command_its_options_and_the_exit_codes():
    text = manpage.render()
    for name in COMMANDS:
        assert f".SS {manpage.esc(name)}\n" in text
    assert "\\fB\\-\\-renew\\-every TEXT\\fR" in text and "\\fB\\-\\-remote TEXT\\fR" in text
    assert "\\-\\-holder\\-pid" in text  # documented and shown by -h (issue 21)
    assert "6\tlease lost" in text and "130\tinterrupted" in text
    assert "\\fBlease.remote\\fR, \\fB\\-\\-remote\\fR" in text  # configuration, from cli/clidoc.py
    assert manpage.render() == text  # deterministic


CLI_MD = ROOT / "docs" / "cli.md"


def test_committed_cli_md_is_up_to_date_and_a_stale_one_is_caught(tmp_path, monkeypatch, capsys):
    assert CLI_MD.read_text(encoding="utf-8") == manpage.render_cli_md(), (
        "docs/cli.md is out of date: run python -m gitlease.cli.manpage"
    )
    stale = tmp_path / "cli.md"
    stale.write_text(manpage.render_cli_md().replace("## trust add", "## trust ad"))
    monkeypatch.setattr(manpage, "CLI_DOC", stale)
    assert manpage.main(["--check"]) == 1
    assert f"{stale} is out of date" in capsys.readouterr().err


def _full_names():
    return [full for full, _, _ in manpage._commands()]


def test_cli_md_has_one_section_per_command_with_synopsis_options_output_and_exit_codes():
    from gitlease.cli.clidoc import DOCS

    assert sorted(DOCS) == sorted(_full_names())  # a new command needs its output and exit codes
    text = manpage.render_cli_md()
    sections = text.split("\n## ")[1:]
    by_name = {sec.split("\n", 1)[0]: sec for sec in sections}
    for full in _full_names():
        sec = by_name[full]
        assert f"```\ngit lease {full} [options]" in sec, full
        assert "\nExit: **0** " in sec, full
        if DOCS[full].lines:
            assert "\nOutput:\n" in sec, full
    for code in (0, 1, 2, 3, 4, 5, 6, 130):
        assert f"\n| {code} |" in text


def test_the_output_lines_cli_md_documents_are_in_the_code():
    """Each documented output line's literal text (between the <...> that vary) is in the package's source:
    a line renamed in the code without its documentation fails here."""
    import re

    from gitlease.cli.clidoc import DOCS

    source = "\n".join(
        p.read_text(encoding="utf-8") for p in (ROOT / "gitlease").rglob("*.py") if p.name != "clidoc.py"
    )
    missing = []
    for full, doc in DOCS.items():
        for line in doc.lines:
            for piece in re.split(r"<[^>]*>", line):
                piece = piece.strip(" :;,()").removeprefix("git-lease: ").removeprefix("gitlease: ")
                if len(piece) >= 6 and piece not in source:
                    missing.append(f"{full}: {piece!r}")
    assert not missing, missing


def test_escaping():
    assert manpage.esc(".hidden") == "\\&.hidden"
    assert manpage.esc("a-b\\c") == "a\\-b\\ec"


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_page_is_valid_roff():
    res = subprocess.run(["groff", "-man", "-t", "-Tutf8", "-ww", "-z", str(PAGE)], capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_the_package_installs_the_page_under_share_man():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    assert data["share/man/man1"] == ["docs/man/git-lease.1"]


def _installed_layout(prefix, bindir):
    """What a wheel install leaves: <prefix>/bin/git-lease and <prefix>/share/man/man1/git-lease.1."""
    (prefix / "bin").mkdir(parents=True)
    os.symlink(os.path.join(bindir, "git-lease"), prefix / "bin" / "git-lease")
    (prefix / "share" / "man" / "man1").mkdir(parents=True)
    shutil.copy(PAGE, prefix / "share" / "man" / "man1" / "git-lease.1")


def _user_env(prefix):
    env = {k: v for k, v in os.environ.items() if k not in ("MANPATH", "MANOPT")}
    env.update(
        PATH=f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}",
        MANPAGER="cat",
        PAGER="cat",
        MANWIDTH="80",
        GIT_PAGER="cat",
    )
    return env


@needs_man
@pytest.mark.parametrize("argv", [["lease", "--help"], ["help", "lease"]])
def test_git_lease_help_opens_the_man_page(tmp_path, argv):
    prefix = tmp_path / "prefix"
    _installed_layout(prefix, os.path.dirname(sys.executable))
    res = subprocess.run(
        ["git", *argv], cwd=tmp_path, env=_user_env(prefix), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "GIT-LEASE(1)" in res.stdout and "EXIT STATUS" in res.stdout and "doctor" in res.stdout


@needs_man
@pytest.mark.slow
def test_a_real_wheel_install_puts_the_page_where_man_finds_it(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    prefix = tmp_path / "prefix"
    # --ignore-installed: never uninstall the gitlease this test runs from
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--ignore-installed",
            "--prefix",
            str(prefix),
            *map(str, wheels.glob("*.whl")),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (prefix / "share" / "man" / "man1" / "git-lease.1").read_text() == PAGE.read_text()
    res = subprocess.run(
        ["git", "lease", "--help"], cwd=tmp_path, env=_user_env(prefix), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and "GIT-LEASE(1)" in res.stdout, res.stderr
