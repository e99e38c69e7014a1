"""The fast path: the core commands (acquire, renew, progress, release, status, show, can-start) on a well-formed
command line, parsed here with the standard library instead of typer and click, whose import and command
building are most of a `git lease` call's start-up (docs/performance.md, part 3).

It only ever accepts what click would parse the same way: each option as declared in ``gitlease.cli.core``
(``tests/test_fast.py`` checks every spec against the click command typer builds, and a corpus of command
lines against click's own parse). Anything else (``-h``, an unknown or repeated option, a missing value or
argument, ``--no-...``, a value that looks like an option) returns None and the command goes to typer, which
prints the help or the usage error exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Spec:
    """One command's parameters: option flag -> (parameter, kind), kind one of "str" | "int" | "flag" |
    "multi" (repeatable, a list); positional parameter names in order; parameters that must be given."""

    options: dict[str, tuple[str, str]]
    arguments: tuple[str, ...] = ()
    required: frozenset[str] = field(default_factory=frozenset)


_COMMON = {"--remote": ("remote", "str"), "--json": ("as_json", "flag")}

SPECS: dict[str, Spec] = {
    "acquire": Spec(
        {
            "--scope": ("scope", "multi"),
            "-s": ("scope", "multi"),
            "--task": ("task", "str"),
            "--agent": ("agent", "str"),
            "--ttl": ("ttl", "str"),
            "--workspace": ("workspace", "str"),
            "--holder-pid": ("holder_pid", "int"),
            "--wait": ("wait", "str"),
            "--replace": ("replace", "str"),
            "--worktree": ("worktree", "flag"),
            "--base": ("base", "str"),
            "--branch": ("branch", "str"),
            **_COMMON,
        },
        required=frozenset({"scope"}),
    ),
    "renew": Spec({"--ttl": ("ttl", "str"), "--progress": ("progress", "str"), **_COMMON}, ("lease_id",)),
    "progress": Spec({"--lease": ("lease", "str"), **_COMMON}, ("note",)),
    "release": Spec({"--force": ("force", "flag"), **_COMMON}, ("lease_id",)),
    "status": Spec(dict(_COMMON)),
    "show": Spec(dict(_COMMON), ("lease_id",)),
    "can-start": Spec(
        {"--scope": ("scope", "multi"), "-s": ("scope", "multi"), **_COMMON}, required=frozenset({"scope"})
    ),
}


def parse(command: str, args: list[str]) -> dict[str, object] | None:
    """The keyword arguments of ``command``'s function for ``args``, or None: let typer handle it."""
    spec = SPECS.get(command)
    if spec is None:
        return None
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
        known = spec.options.get(flag)
        if known is None:
            return None  # -h, --help, an unknown option, --no-x: typer decides
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
                out[name].append(value)  # type: ignore[union-attr]
            elif kind == "int":
                try:
                    out[name] = int(value, 10)
                except ValueError:
                    return None
            else:
                out[name] = value
        given.add(name)
    if len(positional) != len(spec.arguments) or not spec.required <= given:
        return None
    out.update(zip(spec.arguments, positional))
    return out


__all__ = ["SPECS", "Spec", "parse"]
