"""``git lease completion bash|zsh|fish``: print the completion script (gitlease/cli/shellcomp.py); and
``git lease completion --lease-ids held|known``, which the scripts call to complete lease ids (local state only:
no network on a TAB)."""

from __future__ import annotations

from typing import Annotated

import typer

from gitlease.cli.options import make_app
from gitlease.core import errors

app = make_app()

SHELLS = ("bash", "zsh", "fish")


@app.command()
def completion(
    shell: Annotated[
        str | None, typer.Argument(metavar="bash|zsh|fish", help="Which shell.", show_default=False)
    ] = None,
    lease_ids: Annotated[
        str | None,
        typer.Option(
            "--lease-ids",
            metavar="held|known",
            help="Print lease ids for completion, one a line, from local state only: the leases this worktree "
            "holds (held), or those and every lease of the last listing of the store (known).",
        ),
    ] = None,
) -> None:
    """Print a completion script: `eval "$(git lease completion bash)"` in ~/.bashrc (after git's completion),
    save `git lease completion zsh` as _git-lease on $fpath, or `git lease completion fish` as
    ~/.config/fish/conf.d/git-lease.fish. Release, renew and show complete lease ids."""
    from gitlease.cli import shellcomp as comp

    if lease_ids is not None:
        if shell is not None or lease_ids not in ("held", "known"):
            typer.echo("git-lease: completion --lease-ids held|known (and no shell)", err=True)
            raise typer.Exit(errors.USAGE)
        for lid in comp.lease_ids(lease_ids == "known"):
            typer.echo(lid)
        return
    if shell not in SHELLS:
        typer.echo(f"git-lease: completion for bash, zsh or fish, not {shell!r}", err=True)
        raise typer.Exit(errors.USAGE)
    typer.echo({"bash": comp.bash, "zsh": comp.zsh, "fish": comp.fish}[shell](), nl=False)
