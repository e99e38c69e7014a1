"""``git lease trust add | remove | list``: who may sign leases (gitlease/ops/trust.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from gitlease.cli.common import command, service
from gitlease.cli.options import JsonOpt, RemoteOpt, make_app

app = make_app()
trust_app = make_app(help="Who may sign leases: one file per signer on the default branch.")
app.add_typer(
    trust_app,
    name="trust",
    help="Who may sign leases: add, remove or list signers (.gitlease/signers/NAME.pub on the default branch).",
)

NameArg = Annotated[
    str | None,
    typer.Argument(
        help="The signer: a host (or an agent) name; its file is .gitlease/signers/NAME.pub.", show_default=False
    ),
]
PushOpt = Annotated[
    bool,
    typer.Option(
        "--push/--no-push",
        help="Commit and push the change to the store's default branch, retrying when another host's change "
        "landed first (--no-push: write the file in the work tree, to commit through review).",
    ),
]


def _lines(got, verb: str) -> list[str]:
    where = f"{got.where} ({got.path}"
    if got.commit and got.action != "unchanged":
        where += f", commit {got.commit[:12]}, {got.attempts} push{'es' if got.attempts != 1 else ''}"
    said = {"added": "added to", "updated": "updated on", "removed": "removed from", "written": "written to"}
    lines = [f"signer {got.name}: {said.get(got.action, 'unchanged on')} {where})"]
    if got.action == "unchanged" and verb == "add":
        lines[0] += ": already trusted"
    lines += [f"next: {s}" for s in got.next_steps]
    return lines


@trust_app.command("add")
@command("trust add")
def add(
    name: NameArg = None,
    agents: Annotated[
        str | None,
        typer.Option(
            help="The agent ids the key signs for: worker-1..5, a,b,c or a pattern 'worker-*' (default: lease.agent)."
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            help="The key: a public or private key file, or 'ssh-ed25519 AAAA...' (default: lease.signingKey)."
        ),
    ] = None,
    admin: Annotated[
        bool, typer.Option("--admin", help="Also trust the key as gitlease-admin (force-release, early reclaims).")
    ] = False,
    push: PushOpt = True,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Trust a key for some agent ids: its line in .gitlease/signers/NAME.pub (NAME: this host's name by
    default), committed on top of the lease store's default branch and pushed; another host's change landing
    first is read and the commit made again (nothing to merge: one file per signer)."""
    from gitlease.core import errors
    from gitlease.ops import trust as ops
    from gitlease.ops.init import expand_agents

    svc = service(remote)
    svc.require_store()
    settings = svc.settings
    value = key or settings.signing_key
    if not value:
        raise errors.UsageError("no key: pass --key (a public key file) or set lease.signingKey (git lease init)")
    principals = expand_agents(agents) if agents is not None else [settings.agent]
    public = ops.key_of(value)
    line = ops.signer_line(principals, public, admin=admin)
    got = ops.add(svc.repo, settings, name or ops.host_name(), line, push=push)
    lines = _lines(got, "add")
    from gitlease.identity.sshsig import fingerprint_of

    lines.append(f"trusts: {','.join(principals)} with key {fingerprint_of(public)}" + (" (admin)" if admin else ""))
    return got.to_json(), lines


@trust_app.command("remove")
@command("trust remove")
def remove(
    name: Annotated[str, typer.Argument(help="The signer whose file goes (git lease trust list names them).")],
    push: PushOpt = True,
    remote: RemoteOpt = None,
    as_json: JsonOpt = False,
):
    """Revoke a signer: its file goes from the store's default branch (pushed with retries). The leases its
    keys signed stop verifying: their scopes stay blocked until a gitlease-admin key clears them."""
    from gitlease.ops import trust as ops

    svc = service(remote)
    svc.require_store()
    got = ops.remove(svc.repo, svc.settings, name, push=push)
    lines = _lines(got, "remove")
    lines.append(
        "its live leases are INVALID from now on (scope blocked): an admin clears each with "
        "git lease release --force LEASE (git lease status lists them)"
    )
    return got.to_json(), lines


@trust_app.command("list")
@command("trust list")
def list_(remote: RemoteOpt = None, as_json: JsonOpt = False):
    """Every trusted key as readers see it (the store's default branch): file, agent ids, fingerprint."""
    from gitlease.ops.trust import entries

    svc = service(remote)
    svc.require_store()
    trust = svc.trust()
    found = entries(trust)
    lines = [trust.describe()] + [e.line() for e in found]
    return {"trust": trust.describe(), "signed": trust.signed, "signers": [e.to_json() for e in found]}, lines
