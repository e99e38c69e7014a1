"""Generate the man page ``docs/man/git-lease.1`` and ``docs/cli.md`` from the code, so they cannot drift from
the commands.

    python -m gitlease.cli.manpage            # rewrite docs/man/git-lease.1, docs/cli.md, cli/fastspec.py
    python -m gitlease.cli.manpage --check    # exit 1 if a committed file is out of date (a test runs this)
    python -m gitlease.cli.manpage -o -       # print the page

Commands, their summaries and order come from ``gitlease.cli.COMMANDS``; each command's synopsis, description,
arguments and options from its typer app (the same objects ``git lease COMMAND -h`` prints); exit codes from
``gitlease.cli.EXIT_CODES``; each command's output lines and exit codes, the exit-code and configuration tables
from ``gitlease.cli.clidoc``. The output is deterministic (no date, sorted nothing that the tables do not
order), so regenerating after adding a command is one command.

``git lease --help`` never reaches the program: git runs ``man git-lease``. The page is installed with the
package under ``share/man/man1`` (pyproject.toml data files), where ``man`` finds it next to the executable.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "man" / "git-lease.1"
CLI_DOC = ROOT / "docs" / "cli.md"

DESCRIPTION = [
    "gitlease gives coding agents (and people) scoped, expiring, renewable leases on path prefixes of a "
    "repository. A lease is a JSON record stored in git itself, in refs under refs/leases/ on a git remote "
    "(lease.remote) or in the repository's own refs. Every change is an atomic compare-and-swap push that "
    "git checks on the server: overlapping scopes are never granted at once; disjoint ones proceed in parallel.",
    "Scopes are repository-relative path prefixes; . is the whole repository. Durations are written 300, "
    "300s, 5m or 2h.",
    "Every command takes --json and then prints exactly one JSON object on standard output, on success and on "
    'failure: {"ok": true, "command": ..., "result": {...}} or {"ok": false, "command": ..., "error": {"kind", '
    '"message", "exitCode", "details"}}. Errors are also printed as one line on standard error.',
]

ENVIRONMENT = [
    ("GITLEASE_AGENT", "Agent id recorded in leases (over lease.agent, under --agent)."),
    ("GITLEASE_TASK", "Task id recorded in leases (over lease.task, under --task)."),
    ("GITLEASE_DEBUG", "Show Python tracebacks of internal errors instead of a one-line message."),
]


# ----------------------------------------------------------------------------------- roff helpers


def esc(text: str) -> str:
    """Text for a roff line: backslashes and hyphens escaped, a leading control character neutralised."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


def para(text: str) -> list[str]:
    return [esc(line) for line in text.strip().splitlines() if line.strip()]


def _help_text(cmd) -> str:
    text = (cmd.help or "").strip()
    return re.sub(r"\n\s*\n", "\n.PP\n", text)


def _paras(text: str) -> list[str]:
    out: list[str] = []
    for block in text.split("\n.PP\n"):
        if out:
            out.append(".PP")
        out += para(" ".join(block.split()))
    return out


# ------------------------------------------------------------------------------------ the page


def command_section(name: str, module: str, summary: str) -> list[str]:
    import click
    import typer.main

    app = importlib.import_module(f"gitlease.cli.{module}").app
    cmd = typer.main.get_group(app).commands[name]
    ctx = click.Context(cmd, info_name=f"git lease {name}")
    params = [p for p in cmd.params if not getattr(p, "hidden", False)]
    args = [p for p in params if isinstance(p, click.Argument)]
    opts = [p for p in params if isinstance(p, click.Option)]
    synopsis = " ".join(
        [f"\\fBgit lease {esc(name)}\\fR", "[\\fIoptions\\fR]"]
        + [f"\\fI{esc(a.human_readable_name)}\\fR" for a in args]
    )
    out = [f".SS {esc(name)}", synopsis, ".PP"]
    out += _paras(_help_text(cmd) or summary)
    for a in args:
        if getattr(a, "help", None):
            out += [".TP", f"\\fI{esc(a.human_readable_name)}\\fR", *para(a.help or "")]
    for o in opts:
        record = o.get_help_record(ctx)
        if record is None:
            continue
        flags, help_ = record
        out += [".TP", f"\\fB{esc(flags)}\\fR"]
        out += para(" ".join(help_.split())) or [""]
    return out


def config_rows() -> list[tuple[str, ...]]:
    """The configuration table (git config, env, flag, default): gitlease.cli.clidoc.CONFIG."""
    from gitlease.cli.clidoc import CONFIG

    return [tuple(row) for row in CONFIG]


def render() -> str:
    from gitlease import __version__
    from gitlease.cli import COMMANDS, EXIT_CODES

    out = [
        "'\\\" t",
        '.\\" Generated by python -m gitlease.cli.manpage from the code: do not edit by hand.',
        f'.TH GIT\\-LEASE 1 "" "gitlease {esc(__version__)}" "Git Manual"',
        ".SH NAME",
        "git\\-lease \\- scoped, expiring, renewable leases on repository paths, stored as refs on a git remote",
        ".SH SYNOPSIS",
        "\\fBgit lease\\fR \\fIcommand\\fR [\\fIoptions\\fR]",
        ".br",
        "\\fBgit lease\\fR \\fIcommand\\fR \\fB\\-h\\fR",
        ".br",
        "\\fBgit lease \\-\\-version\\fR",
        ".SH DESCRIPTION",
    ]
    for i, text in enumerate(DESCRIPTION):
        if i:
            out.append(".PP")
        out += para(text)
    out += [".PP", "Commands:", ".RS"]
    for name, (_, summary) in COMMANDS.items():
        out += [".TP", f"\\fB{esc(name)}\\fR", *para(summary)]
    out += [".RE", ".SH COMMANDS"]
    for name, (module, summary) in COMMANDS.items():
        out += command_section(name, module, summary)
    out += [".SH EXIT STATUS", ".TS", "l l.", "code\tmeaning"]
    for code, meaning in re.findall(r"(\d+) ([^,.]+)", EXIT_CODES.split(":", 1)[1]):
        out.append(f"{code}\t{esc(meaning.strip())}")
    out += [".TE"]
    rows = config_rows()
    if rows:
        out += [".SH CONFIGURATION", *para("Lowest to highest: git config, environment, flags.")]
        for key, env, flag, default, *_ in (list(r) + ["", "", "", ""] for r in rows):
            head = ", ".join(f"\\fB{esc(x)}\\fR" for x in (key, env, flag) if x)
            out += [".TP", head, *para(f"Default: {default}.")]
    out += [".SH ENVIRONMENT"]
    for var, text in ENVIRONMENT:
        out += [".TP", f"\\fB{esc(var)}\\fR", *para(text)]
    out += [
        ".SH NOTES",
        *para(
            "git turns git lease --help into man git-lease (this page); git lease -h and "
            "git lease COMMAND -h print the program's own short help."
        ),
        ".SH SEE ALSO",
        "\\fBgit\\-push\\fR(1), \\fBgit\\-update\\-ref\\fR(1), \\fBssh\\-keygen\\fR(1); docs/cli.md, "
        "docs/protocol.md, docs/hosts.md and docs/limits.md in the gitlease sources.",
    ]
    return "\n".join(out) + "\n"


def _commands():
    """(full name, click command, summary) of every command and subcommand, in COMMANDS order."""
    import click
    import typer.main

    from gitlease.cli import COMMANDS

    for name, (module, summary) in COMMANDS.items():
        app = importlib.import_module(f"gitlease.cli.{module}").app
        cmd = typer.main.get_group(app).commands[name]
        if isinstance(cmd, click.Group):
            for sub, c in sorted(cmd.commands.items()):
                yield f"{name} {sub}", c, summary
        else:
            yield name, cmd, summary


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def command_markdown(full: str, c, summary: str) -> list[str]:
    """One command's section of docs/cli.md: what it does, synopsis, options, output, exit codes."""
    import click

    from gitlease.cli.clidoc import DOCS

    doc = DOCS[full]  # KeyError: a command without its entry in clidoc.DOCS (a test says which)
    ctx = click.Context(c, info_name=f"git lease {full}")
    pieces = [
        p.get_usage_pieces(ctx) for p in c.params if not getattr(p, "hidden", False) and isinstance(p, click.Argument)
    ]
    usage = " ".join(["git lease", full, "[options]"] + [x for ps in pieces for x in ps])
    out = [f"## {full}", ""]
    for block in (_help_text(c) or summary).split("\n.PP\n"):  # paragraphs, not roff
        out += [" ".join(block.split()), ""]
    if doc.note:
        out += [doc.note, ""]
    out += ["```", usage, "```", ""]
    rows = [r for r in (o.get_help_record(ctx) for o in c.params if isinstance(o, click.Option)) if r]
    if rows:
        out += ["| option | |", "| --- | --- |"]
        out += [f"| `{f}` | {_md(' '.join(h.split()))} |" for f, h in rows]
        out.append("")
    if doc.lines:
        out += ["Output:", "", "```", *doc.lines, "```", ""]
    exits = "; ".join(f"**{code}** {_md(when)}" for code, when in sorted(doc.exits.items()))
    common = ", ".join(str(code) for code in (1, 2) if code not in doc.exits)
    out += [f"Exit: {exits}" + (f"; {common}: as every command (error, usage)." if common else "."), ""]
    return out


def render_cli_md() -> str:
    """docs/cli.md: every command in one section each, from the same code as the man page."""
    from gitlease.cli.clidoc import CONFIG, EXIT_TABLE

    commands = list(_commands())
    out = [
        "# CLI reference",
        "",
        "Generated by `python -m gitlease.cli.manpage` from the commands' own definitions (synopsis, options) and "
        "`gitlease/cli/clidoc.py` (output, exit codes): do not edit by hand; `tests/test_manpage.py` fails when "
        "it is stale. `git lease -h` and `git lease COMMAND -h` print the same; `git lease --help` opens the man "
        "page.",
        "",
        "Every command takes `--json` and then prints exactly one JSON object on stdout, on success and on "
        'failure: `{"ok": true, "command": ..., "result": {...}}` or `{"ok": false, "command": ..., "error": '
        '{"kind", "message", "exitCode", "details"}}`. Errors are one line on stderr, `git-lease: <message>`, '
        "never a traceback; a usage error prints the usage text too. Scopes are repository-relative path "
        "prefixes (`.` is the whole repository); durations are `300`, `300s`, `5m`, `2h`, `1d`.",
        "",
        "Commands: " + " · ".join(f"[{full}](#{full.replace(' ', '-')})" for full, _, _ in commands),
        "",
        "## Exit codes",
        "",
        "| code | meaning | when |",
        "| --- | --- | --- |",
        *(f"| {code} | {meaning} | {_md(when)} |" for code, meaning, when in EXIT_TABLE),
        "",
    ]
    for full, c, summary in commands:
        out += command_markdown(full, c, summary)
    out += ["## Configuration", "", "Lowest to highest: git config, environment, flags.", ""]
    out += ["| git config | env | flag | default |", "| --- | --- | --- | --- |"]
    out += ["| " + " | ".join(f"`{x}`" if x and i < 3 else _md(x) for i, x in enumerate(row)) + " |" for row in CONFIG]
    out += [
        "",
        "The hooks run `git-lease-hook pre-commit | pre-push REMOTE URL | pre-receive` (standard library only, "
        "for speed); coding agents' hooks run `git-lease-hook pre-edit | post-shell | check-path PATH...` "
        "([agents.md](agents.md), [hooks.md](hooks.md)).",
    ]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gitlease.cli.manpage", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(PAGE), help="where to write (- for stdout)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the generated page")
    args = parser.parse_args(argv)
    text = render()
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    outputs = [(path, text)]
    if path == PAGE:  # every file generated from the command definitions, in one step
        from gitlease.cli import fast

        outputs += [(CLI_DOC, render_cli_md()), (Path(fast.__file__).with_name(fast.FILE), fast.render())]
    if args.check:
        stale = [p for p, t in outputs if (p.read_text(encoding="utf-8") if p.exists() else "") != t]
        for p in stale:
            sys.stderr.write(f"{p} is out of date: run python -m gitlease.cli.manpage\n")
        return 1 if stale else 0
    for p, t in outputs:
        os.makedirs(p.parent, exist_ok=True)
        p.write_text(t, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
