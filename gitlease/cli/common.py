"""What every command module shares: the service factory, and the one place where results and errors become
output and exit codes. Standard library only: the fast path (``gitlease.cli.fast``) runs the core commands
without typer; the typer options live in ``gitlease.cli.options``.

Every command takes ``--json`` and then prints one envelope on stdout, on success and on failure:
``{"ok": true, "command": "acquire", "result": {...}}`` or
``{"ok": false, "command": "acquire", "error": {"kind", "message", "exitCode", "details"}}``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from gitlease.core import errors, jsontext


def service(remote: str | None, *, at: str = ".", **flags: Any):
    """The service for the repository (worktree) at ``at``, settings resolved from its config, env and flags."""
    from gitlease.service.factory import open_service

    return open_service(at, remote=remote, **flags)


def run(command: str, as_json: bool, body: Callable[[], tuple[dict[str, Any], list[str]]]) -> None:
    """Run ``body`` (returns the JSON result and the human lines), render it, exit with the right code
    (SystemExit: click lets it through, and the dispatcher turns it into the process's exit code)."""
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
            echo(line)
    raise SystemExit(0)


def command(name: str) -> Callable[[Callable[..., tuple[dict[str, Any], list[str]]]], Callable[..., None]]:
    """A command's function returns ``(result, lines)``: the JSON result and the human lines. ``@command(NAME)``
    makes it a command that renders them (or the error it raises) and exits, through ``run``; typer still sees
    the function's own signature (``functools.wraps``), so the function is the command's one definition::

        @app.command()
        @command("extend")
        def extend(lease_id: LeaseArg, as_json: JsonOpt = False):
            got = service(None).extend(lease_id)
            return got.to_json(), [f"lease extended: {got.lease_id}"]
    """

    def wrap(fn: Callable[..., tuple[dict[str, Any], list[str]]]) -> Callable[..., None]:
        @functools.wraps(fn)
        def runner(*args: Any, **kwargs: Any) -> None:
            run(name, bool(kwargs.get("as_json")), lambda: fn(*args, **kwargs))

        return runner

    return wrap


def _fail(command: str, as_json: bool, code: int, kind: str, message: str, details: dict[str, Any]) -> None:
    if as_json:
        _emit(
            {
                "ok": False,
                "command": command,
                "error": {"kind": kind, "message": message, "exitCode": code, "details": _jsonable(details)},
            }
        )
    echo(f"git-lease: {message}", err=True)
    raise SystemExit(code)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=_plain))


def _plain(obj: Any) -> Any:
    """What an error's details hold that json cannot write: JSON text written already (jsontext.Raw) as the
    value it is, anything else as its str."""
    return json.loads(obj.text) if isinstance(obj, jsontext.Raw) else str(obj)


def _emit(doc: dict[str, Any]) -> None:
    echo(jsontext.dumps(doc))


def echo(line: str, *, err: bool = False) -> None:
    """One line to stdout (or stderr), flushed: output stays in order with what child processes print."""
    stream = sys.stderr if err else sys.stdout
    stream.write(line + "\n")
    stream.flush()


def seconds(flag: str, value: str, lo: int = 0) -> int:
    """A duration given on the command line (300, 300s, 5m, 2h, 1d) in seconds; a bad one is a usage error."""
    from gitlease.core.config import parse_duration

    try:
        return parse_duration(flag, value, lo)
    except errors.ConfigError as exc:
        raise errors.UsageError(exc.message) from None


def ttl_seconds(value: str | None) -> int | None:
    return None if value is None else seconds("--ttl", value, 5)
