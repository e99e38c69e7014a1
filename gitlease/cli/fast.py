"""The fast path: the core commands (acquire, renew, progress, release, status, show, can-start) on a well-formed
command line, parsed here with the standard library instead of typer and click, whose import and command
building are most of a `git lease` call's start-up (docs/performance.md, part 5).

The commands are defined once, for typer (``gitlease/cli/core.py``). What this parser knows of them, each
option's flags, kind and parameter, is generated from the click commands typer builds out of those definitions
into ``gitlease/cli/fastspec.py``, a committed table::

    python -m gitlease.cli.fast            # regenerate gitlease/cli/fastspec.py after changing a core command
    python -m gitlease.cli.fast --check    # exit 1 if it is out of date (tests/test_fast.py runs this)

It only ever accepts what click would parse the same way (``tests/test_fast.py`` checks a corpus of command
lines against click's own parse). Anything else (``-h``, an unknown or repeated option, a missing value or
argument, ``--no-...``, a value that looks like an option, an option of a kind it does not parse) returns None
and the command goes to typer, which prints the help or the usage error.
"""

from __future__ import annotations

import sys

# The modules whose commands the fast path runs: typer-free (see gitlease/cli/core.py).
FAST_MODULES = ("core",)
FILE = "fastspec.py"


def specs() -> dict[str, dict]:
    from gitlease.cli.fastspec import SPECS

    return SPECS


def parse(command: str, args: list[str]) -> dict[str, object] | None:
    """The keyword arguments of ``command``'s function for ``args``, or None: let typer handle it."""
    spec = specs().get(command)
    if spec is None:
        return None
    options: dict[str, tuple[str, str]] = spec["options"]
    arguments: tuple[tuple[str, bool], ...] = spec["arguments"]
    out: dict[str, object] = {}
    positional: list[str] = []
    given: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positional.extend(args[i:])
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        flag, eq, inline = arg.partition("=") if arg.startswith("--") else (arg[:2], "", arg[2:])
        if not arg.startswith("--") and inline:  # -svalue
            eq = "="
        known = options.get(flag)
        if known is None or known[1] not in ("str", "int", "flag", "multi"):
            return None  # -h, --help, an unknown option, --no-x, a kind parsed by click only: typer decides
        name, kind = known
        if kind == "flag":
            if eq or name in given:
                return None
            out[name] = True
        else:
            if eq:
                value = inline
            else:
                if i >= len(args):
                    return None
                value = args[i]
                i += 1
            if value.startswith("-") or (kind != "multi" and name in given):
                return None  # click would take "-x" as the value; let it, and say so its own way
            if kind == "multi":
                out.setdefault(name, [])
                out[name].append(value)  # type: ignore[attr-defined]
            elif kind == "int":
                try:
                    out[name] = int(value, 10)
                except ValueError:
                    return None
            else:
                out[name] = value
        given.add(name)
    need = sum(1 for _, required in arguments if required)
    if not need <= len(positional) <= len(arguments) or not set(spec["required"]) <= given:
        return None
    out.update(zip((name for name, _ in arguments), positional))
    return out


def function(command: str):
    """The function the fast path calls for ``command`` (its module is imported, typer is not)."""
    import importlib

    spec = specs()[command]
    return getattr(importlib.import_module(f"gitlease.cli.{spec['module']}"), spec["function"])


# ------------------------------------------------------------------------------- generating the table


def _kind(param) -> str:
    import click

    if param.is_flag:
        return "flag" if not param.default and not param.secondary_opts else "click"
    if param.multiple:
        return "multi" if param.nargs == 1 and isinstance(param.type, click.types.StringParamType) else "click"
    if param.nargs != 1:
        return "click"
    if isinstance(param.type, click.types.IntParamType) and not isinstance(param.type, click.types.IntRange):
        return "int"
    if isinstance(param.type, click.types.StringParamType):
        return "str"
    return "click"  # a choice, a float, a path...: click parses it (the fast path declines such a line)


def build() -> dict[str, dict]:
    """The table, from the click commands typer builds out of the fast modules' definitions."""
    import importlib

    import click
    import typer.main

    from gitlease.cli import COMMANDS

    out: dict[str, dict] = {}
    for name, (module_name, _summary) in COMMANDS.items():
        if module_name not in FAST_MODULES:
            continue
        module = importlib.import_module(f"gitlease.cli.{module_name}")
        cmd = typer.main.get_group(module.app).commands[name]
        fn = module.COMMANDS[name]
        options: dict[str, tuple[str, str]] = {}
        arguments: list[tuple[str, bool]] = []
        required: list[str] = []
        for p in cmd.params:
            if isinstance(p, click.Argument):
                arguments.append((p.name, bool(p.required)))
                if p.nargs != 1:
                    raise SystemExit(f"{name}: argument {p.name} takes {p.nargs} values: the fast path cannot")
                continue
            kind = _kind(p)
            for flag in p.opts:
                options[flag] = (p.name, kind)
            for flag in p.secondary_opts:
                options[flag] = (p.name, "click")
            if p.required:
                required.append(p.name)
        out[name] = {
            "module": module_name,
            "function": fn.__name__,
            "options": options,
            "arguments": tuple(arguments),
            "required": tuple(sorted(required)),
        }
    return out


def render() -> str:
    import pprint

    table = pprint.pformat(build(), width=110, sort_dicts=True)
    return (
        '"""The fast path\'s table of the core commands\' options: GENERATED by `python -m gitlease.cli.fast` from\n'
        "the typer definitions in gitlease/cli/core.py. Do not edit; regenerate (tests/test_fast.py fails when it is\n"
        'out of date). Kinds: str, int, flag, multi (repeatable); "click": parsed by click only."""\n\n'
        f"SPECS: dict[str, dict] = {table}\n"
    )


def main(argv: list[str] | None = None) -> int:
    import os

    args = sys.argv[1:] if argv is None else argv
    path = os.path.join(os.path.dirname(__file__), FILE)
    text = render()
    with open(path, encoding="utf-8") as fh:
        current = fh.read()
    if "--check" in args:
        if current != text:
            sys.stderr.write(f"{path} is out of date: run python -m gitlease.cli.fast\n")
            return 1
        return 0
    if current != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["FAST_MODULES", "parse", "function", "build", "render", "specs"]
