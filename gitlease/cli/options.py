"""The typer side of the command modules: the app factory and the shared options. Imported by every command
module except ``core``, whose app is built from it only when needed (help, usage errors, the man page)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def make_app(help: str = "") -> typer.Typer:
    """The typer app of one command module (the dispatcher in ``gitlease.cli`` loads only the one it needs)."""
    return typer.Typer(
        name="git-lease",
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
        help=help,
    )


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON envelope (also on failure).")]
RemoteOpt = Annotated[
    str | None,
    typer.Option(
        "--remote",
        help="Lease store: a git remote name or URL (default: lease.remote; none: this repository's own refs).",
    ),
]
ScopeOpt = Annotated[
    list[str],
    typer.Option("--scope", "-s", help="A path prefix to lease; repeat for more. '.' is the whole repository."),
]
LeaseArg = Annotated[str, typer.Argument(help="The lease id (lease_...).")]


def bind(namespace: dict, commands: dict) -> typer.Typer:
    """The typer app of a module written without importing typer (``core``): its annotations are strings
    (``from __future__ import annotations``) naming ``typer``, ``JsonOpt``..., which typer resolves in the
    functions' globals, so those names are put there first; then each function is registered under its name."""
    namespace.update(
        typer=typer,
        Annotated=Annotated,
        List=list,
        Optional=Optional,
        JsonOpt=JsonOpt,
        RemoteOpt=RemoteOpt,
        ScopeOpt=ScopeOpt,
        LeaseArg=LeaseArg,
    )
    app = make_app()
    for name, fn in commands.items():
        app.command(name)(fn)
    return app
