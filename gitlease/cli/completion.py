"""``git lease completion bash|zsh``: print the completion script (gitlease/cli/shellcomp.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from gitlease.cli.options import make_app
from gitlease.core import errors

app = make_app()


@app.command()
def completion(shell: Annotated[str, typer.Argument(metavar="bash|zsh", help="Which shell.")]) -> None:
    """Print a completion script: `eval "$(git lease completion bash)"` in ~/.bashrc (after git's completion),
    or save `git lease completion zsh` as _git-lease on $fpath."""
    from gitlease.cli import shellcomp as comp

    if shell not in ("bash", "zsh"):
        typer.echo(f"git-lease: completion for bash or zsh, not {shell!r}", err=True)
        raise typer.Exit(errors.USAGE)
    typer.echo(comp.bash() if shell == "bash" else comp.zsh(), nl=False)
