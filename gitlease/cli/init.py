"""``git lease init``: the guided, idempotent set-up (gitlease/ops/init.py)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gitlease.cli.common import command
from gitlease.cli.options import JsonOpt, make_app

app = make_app()


@app.command()
@command("init")
def init(
    remote: Annotated[str | None, typer.Option(help="Share leases through this remote (name or URL).")] = None,
    lease_repo: Annotated[
        str | None,
        typer.Option(
            "--lease-repo", help="Share leases through a dedicated lease repository (a URL), not the code's remote."
        ),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="This agent's id (lease.agent; the trust-file principal).")] = None,
    agents: Annotated[
        str | None,
        typer.Option(
            help="Set up a fleet on this host instead: worker-1..5, a,b,c or a pattern 'worker-*'. One key for the "
            "host, one trust-file line for all of them (one commit); each agent runs with --agent NAME."
        ),
    ] = None,
    key: Annotated[str | None, typer.Option(help="Use this signing key (lease.signingKey).")] = None,
    signer: Annotated[
        str | None,
        typer.Option(
            help="This host's signer name: its key is trusted in .gitlease/signers/NAME.pub (default: the host name)."
        ),
    ] = None,
    sign: Annotated[
        bool | None, typer.Option("--sign/--no-sign", help="Sign leases (default: when a remote is configured).")
    ] = None,
    hooks: Annotated[bool, typer.Option("--hooks/--no-hooks", help="Install the pre-commit/pre-push hooks.")] = True,
    ci: Annotated[
        str | None,
        typer.Option(help="Also install the CI jobs (pull-request check, scheduled sweep): github or gitlab."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Answer yes to every question (for scripts).")] = False,
    as_json: JsonOpt = False,
):
    """Set up this repository for leases: config, signing key, commit signing, this host's key trusted on the
    store, hooks, CI jobs. Idempotent."""
    from gitlease.core import errors
    from gitlease.ops.init import init as do_init

    if ci is not None and ci not in ("github", "gitlab"):
        raise errors.UsageError(f"--ci must be github or gitlab, not {ci!r}")

    answered: list[str] = []  # questions --yes answered, said in the output (no terminal needed)

    def decide(question: str) -> bool:
        if yes:
            answered.append(question)
            return True
        if as_json or not sys.stdin.isatty():
            return False
        return typer.confirm(question, default=True, err=True)

    steps = do_init(
        ".",
        remote=remote,
        lease_repo=lease_repo,
        agent=agent,
        agents=agents,
        key=key,
        signer=signer,
        sign=sign,
        hooks=hooks,
        ci=ci,
        decide=decide,
    )
    lines = [s.line() for s in steps] + [f"--yes answered yes: {q}" for q in answered]
    if not any(s.status == "set" for s in steps):
        lines.append("nothing to change")
    if agents is not None:
        lines.append("next: each agent: git lease acquire --agent NAME --scope PATH (or GITLEASE_AGENT=NAME)")
    else:
        lines.append("next: git lease doctor (does the remote behave?), then git lease acquire --scope PATH")
    return {
        "steps": [s.to_json() for s in steps],
        "changed": any(s.status == "set" for s in steps),
        "answeredYes": answered,
    }, lines
