"""What every command module shares: the typer options, the service factory, and the one place where results
and errors become output and exit codes.

Every command takes ``--json`` and then prints one envelope on stdout, on success and on failure:
``{"ok": true, "command": "acquire", "result": {...}}`` or
``{"ok": false, "command": "acquire", "error": {"kind", "message", "exitCode", "details"}}``.
"""
from __future__ import annotations

import json
import os
from typing import Annotated, Any, Callable, List, Optional

import typer

from .. import errors


def make_app(help: str = "") -> typer.Typer:
    """The typer app of one command module (the dispatcher in ``gitlease.cli`` loads only the one it needs)."""
    return typer.Typer(name="git-lease", add_completion=False, pretty_exceptions_enable=False,
                       context_settings={"help_option_names": ["-h", "--help"]}, help=help)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON envelope (also on failure).")]
RemoteOpt = Annotated[Optional[str], typer.Option("--remote", help="Lease store: a git remote name or URL "
                                                  "(default: lease.remote; none: this repository's own refs).")]
ScopeOpt = Annotated[List[str], typer.Option("--scope", "-s", help="A path prefix to lease; repeat for more. "
                                             "'.' is the whole repository.")]
LeaseArg = Annotated[str, typer.Argument(help="The lease id (lease_...).")]


def service(remote: str | None, *, at: str = ".", **flags: Any):
    """The service for the repository (worktree) at ``at``, settings resolved from its config, env and flags."""
    from ..config import resolve
    from ..repo import Repo
    from ..service import LeaseService

    repo = Repo.discover(at)
    settings = resolve(repo.config, remote=remote, **flags)
    return LeaseService(repo, settings, signer=signer_for(settings))


def signer_for(settings):
    """UNSIGNED, or the SSHSIG signer of ``lease.signingKey`` (imports cryptography only then)."""
    if settings.signing_key:
        from ..signer import load_signer

        return load_signer(settings.signing_key)
    from ..signer import UNSIGNED

    return UNSIGNED


def run(command: str, as_json: bool, body: Callable[[], tuple[dict[str, Any], list[str]]]) -> None:
    """Run ``body`` (returns the JSON result and the human lines), render it, exit with the right code."""
    try:
        result, lines = body()
    except errors.GitLeaseError as exc:
        _fail(command, as_json, exc.exit_code, exc.kind, exc.message, exc.details)
    except KeyboardInterrupt:
        _fail(command, as_json, errors.INTERRUPTED, "interrupted", "interrupted", {})
    except Exception as exc:  # a bug: one line, never a traceback (it may hold secrets)
        if os.environ.get("GITLEASE_DEBUG"):
            raise
        _fail(command, as_json, errors.ERROR, "internal", f"internal error: {type(exc).__name__}: {exc}", {})
    if as_json:
        _emit({"ok": True, "command": command, "result": result})
    else:
        for line in lines:
            typer.echo(line)
    raise typer.Exit(0)


def _fail(command: str, as_json: bool, code: int, kind: str, message: str, details: dict[str, Any]) -> None:
    if as_json:
        _emit({"ok": False, "command": command,
               "error": {"kind": kind, "message": message, "exitCode": code, "details": _jsonable(details)}})
    typer.echo(f"git-lease: {message}", err=True)
    raise typer.Exit(code)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _emit(doc: dict[str, Any]) -> None:
    typer.echo(json.dumps(doc, sort_keys=True))


def ttl_seconds(value: str | None) -> int | None:
    from ..config import parse_duration

    return None if value is None else parse_duration("--ttl", value, 5)
