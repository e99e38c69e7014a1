"""Generate the man page ``docs/man/git-lease.1`` from the code, so it cannot drift from the commands.

    python -m gitlease.cli.manpage            # rewrite docs/man/git-lease.1, docs/reference.md, cli/fastspec.py
    python -m gitlease.cli.manpage --check    # exit 1 if the committed page is out of date (a test runs this)
    python -m gitlease.cli.manpage -o -       # print it

Commands, their summaries and order come from ``gitlease.cli.COMMANDS``; each command's synopsis, description,
arguments and options from its typer app (the same objects ``git lease COMMAND -h`` prints); exit codes from
``gitlease.cli.EXIT_CODES``; the configuration table from docs/cli.md. The output is deterministic (no date,
sorted nothing that the table does not order), so regenerating after adding a command is one command.

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
REFERENCE = ROOT / "docs" / "reference.md"

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


def config_rows(path: Path = CLI_DOC) -> list[tuple[str, ...]]:
    """The rows of the configuration table in docs/cli.md (``| git config | env | flag | default |``)."""
    rows, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Configuration"
            continue
        if inside and line.startswith("|"):
            cells = tuple(c.strip().strip("`").replace("`", "") for c in line.strip().strip("|").split("|"))
            if cells and not set(cells[0]) <= set("- ") and cells[0] != "git config":
                rows.append(cells)
    return rows


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


def render_markdown() -> str:
    """docs/reference.md: every command's usage and options, from the same code as the man page."""
    import click
    import typer.main

    from gitlease.cli import COMMANDS, EXIT_CODES

    out = [
        "# CLI reference",
        "",
        "Generated by `python -m gitlease.cli.manpage` from the commands themselves (do not edit by hand; "
        "tests/test_manpage.py fails when it is stale). The overview with output lines and configuration is "
        "[cli.md](cli.md).",
        "",
        EXIT_CODES,
        "",
    ]
    for name, (module, summary) in COMMANDS.items():
        app = importlib.import_module(f"gitlease.cli.{module}").app
        cmd = typer.main.get_group(app).commands[name]
        cmds = [(name, cmd)]
        if isinstance(cmd, click.Group):
            cmds = [(f"{name} {sub}", c) for sub, c in sorted(cmd.commands.items())]
        for full, c in cmds:
            ctx = click.Context(c, info_name=f"git lease {full}")
            pieces = [
                p.get_usage_pieces(ctx)
                for p in c.params
                if not getattr(p, "hidden", False) and isinstance(p, click.Argument)
            ]
            usage = " ".join(["git lease", full, "[options]"] + [x for ps in pieces for x in ps])
            out += [f"## `{full}`", ""]
            for block in (_help_text(c) or summary).split("\n.PP\n"):  # paragraphs, not roff
                out += [" ".join(block.split()), ""]
            out += ["```", usage, "```", ""]
            records = [o.get_help_record(ctx) for o in c.params if isinstance(o, click.Option)]
            rows = [r for r in records if r]
            if rows:
                out += ["| option | |", "| --- | --- |"]
                out += [f"| `{f}` | {' '.join(h.split()).replace('|', chr(92) + '|')} |" for f, h in rows]
                out.append("")
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

        outputs += [(REFERENCE, render_markdown()), (Path(fast.__file__).with_name(fast.FILE), fast.render())]
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
