"""``git lease ...``: a dispatcher that loads only the command module it needs.

Start-up time is part of the interface (every hook and heartbeat pays it), so this module is stdlib-only: it
reads the command name, imports the one module that defines it (``gitlease.cli.<module>``, a small typer app),
and lets typer parse the rest. ``git lease -h`` is answered from the table below without importing typer.

To add a command: define it in a module's ``app`` (see ``common.make_app`` and ``common.command``) and add a
row to ``COMMANDS``. The core commands also run without typer (``gitlease.cli.fast``): after changing one of
them, regenerate the fast path's table with ``python -m gitlease.cli.fast`` (a test says when it is stale).
"""

from __future__ import annotations

import os
import sys

# command -> (module under gitlease.cli, one-line summary). Aliases are rows of their own.
COMMANDS: dict[str, tuple[str, str]] = {
    "acquire": ("core", "Lease path prefixes; exit 3 naming the holder when another lease overlaps."),
    "renew": ("core", "Extend a lease this worktree holds; exit 6 means stop: the lease was lost."),
    "progress": ("core", "Report progress (inside run: with the next renewal); exit 6 means stop: the lease was lost."),
    "release": ("core", "Give a lease back."),
    "extend": ("agents", "Add paths to a held lease in one atomic push; exit 3 naming the holder on overlap."),
    "narrow": ("agents", "Give paths of a held lease back in one atomic push."),
    "status": ("core", "Every lease on the store: id, scope, owner, time left."),
    "show": ("core", "One lease in full: record, history, signatures."),
    "can-start": ("core", "Read-only: exit 0 if a scope is free now, 3 if not."),
    "init": ("init", "Set up this repository: config, signing key, commit signing, trust, hooks, CI (idempotent)."),
    "doctor": ("doctor", "Probe the lease remote with throw-away refs and check this set-up; exit 1 if unsafe."),
    "budget": ("doctor", "Pushes per minute a fleet makes against the host's limit; the largest fleet that fits."),
    "completion": ("completion", "Print a bash, zsh or fish completion script (generated from these commands)."),
    "agent": ("agent", "The per-host renewal agent: one push renews every local holder's leases."),
    "sweep-stale": ("sweep", "Reclaim stale leases (expired, heartbeats missed, holder gone, stalled), audited."),
    "sweep": ("sweep", "Alias of sweep-stale."),
    "log": ("sweep", "The audit log (reclaims, forced releases) with lease history."),
    "ci": ("sweep", "ci install github|gitlab: CI jobs: the scheduled sweep; --job verify: the pull-request check."),
    "install-hooks": ("hooks", "Install the pre-commit and pre-push hooks that refuse edits outside held leases."),
    "uninstall-hooks": ("hooks", "Remove gitlease's hooks; put back the hooks they replaced."),
    "agent-hooks": (
        "agents",
        "agent-hooks install|uninstall claude|codex|gemini: refuse an agent's edit outside the leases.",
    ),
    "mcp": ("agents", "Serve the Model Context Protocol over stdio: lease tools for any MCP client."),
    "verify": ("hooks", "CI check: a change's paths lie inside its lease and outside others'; exit 4 if not."),
    "server-hook": ("hooks", "Run as a server-side pre-receive hook on a self-hosted remote."),
    "worktree": ("worktree", "Worktrees bound to leases: add, list, prune, remove."),
    "keygen": ("keys", "Make an Ed25519 signing key for an agent; print its allowed_signers line."),
    "trust": ("trust", "trust add|remove|list: who may sign leases, one file per signer, pushed with retries."),
    "run": ("run", "Run a command under a lease; stop its process group if the lease is lost (exit 6)."),
    "push": ("run", "Push a branch and renew the lease in one atomic push: nothing lands if it was lost."),
    "plan": ("plan", "Which queued tasks can start now, what blocks the others; --acquire N takes leases."),
    "work": ("work", "Run a queue of tasks to landed commits: claim, worktree, heartbeats, verify, land, release."),
}

EXIT_CODES = (
    "Exit codes: 0 ok, 1 error, 2 usage, 3 held by another, 4 scope violation, "
    "5 invalid record or signature, or an untrusted writer, 6 lease lost, 130 interrupted."
)


def _help() -> str:
    width = max(len(name) for name in COMMANDS)
    rows = "\n".join(f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items())
    return (
        "usage: git lease <command> [options]   (git lease <command> -h for a command's options)\n\n"
        "Scoped, expiring, renewable leases on repository paths, stored as refs on a git remote.\n\n"
        f"commands:\n{rows}\n\n{EXIT_CODES}\n"
    )


def dispatch(argv: list[str]) -> int:
    """Run one command line; return its exit code (typer/click exit through SystemExit, caught here)."""
    if not argv or argv[0] in ("-h", "--help", "help") and len(argv) < 2:
        sys.stdout.write(_help())
        return 0 if argv else 2
    if argv[0] == "--version":
        from gitlease import __version__

        sys.stdout.write(f"git-lease {__version__}\n")
        return 0
    if argv[0] == "help":
        argv = [argv[1], "-h"]
    name = argv[0]
    if name not in COMMANDS:
        return _unknown(name, "--json" in argv)
    from gitlease.cli import fast

    kwargs = fast.parse(name, argv[1:])
    try:
        if kwargs is None:
            return _run_typer(name, argv)
        fast.function(name)(**kwargs)
        return 0
    except SystemExit as exc:  # how every command ends (cli/common.run), and typer/click's own exits
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BrokenPipeError:  # the reader went away (`git lease status | head`): as click's standalone mode does
        return 1
    except KeyboardInterrupt:
        from gitlease.core.errors import INTERRUPTED

        return INTERRUPTED


def _run_typer(name: str, argv: list[str]) -> int:
    """The command through its typer app: help, usage errors (with the envelope under --json), every
    non-core command."""
    import importlib

    import click
    import typer.main

    module = importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")
    group = typer.main.get_group(_only(module.app, name))
    try:
        code = group.main(args=argv, prog_name="git lease", standalone_mode=False)
    except click.exceptions.UsageError as exc:  # bad option or argument: click's usage text, and the envelope
        exc.show()
        if "--json" in argv:
            _envelope(_command_name(group, argv), exc.format_message(), 2)
        return 2
    except click.exceptions.ClickException as exc:
        exc.show()
        if "--json" in argv:
            _envelope(_command_name(group, argv), exc.format_message(), exc.exit_code, kind="error")
        return exc.exit_code
    except click.exceptions.Abort:
        from gitlease.core.errors import INTERRUPTED

        return INTERRUPTED
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def _only(app, name: str):
    """A copy of the module's typer app holding only the command (or group) ``name``: typer builds a click
    command from every registered function's signature, and building the unused ones is most of the
    dispatch cost left after the imports. The full app when nothing matches (click then reports it)."""
    import copy

    from typer.main import get_command_name

    def named(info) -> str:
        return info.name or get_command_name(info.callback.__name__)

    def group_named(info) -> str | None:
        return info.name or (info.typer_instance.info.name if info.typer_instance else None)

    sub = copy.copy(app)
    sub.registered_commands = [c for c in app.registered_commands if c.callback and named(c) == name]
    sub.registered_groups = [g for g in app.registered_groups if group_named(g) == name]
    return sub if sub.registered_commands or sub.registered_groups else app


def _command_name(group, argv: list[str]) -> str:
    """ "ci install" for ``ci install --json``: the (sub)command words of argv, as far as the app knows them."""
    words, node = [], group
    for arg in argv:
        cmds = getattr(node, "commands", None)
        if not cmds or arg not in cmds:
            break
        words.append(arg)
        node = cmds[arg]
    return " ".join(words) or argv[0]


def _envelope(command: str, message: str, code: int, *, kind: str = "usage") -> None:
    import json

    sys.stdout.write(
        json.dumps(
            {
                "ok": False,
                "command": command,
                "error": {"kind": kind, "message": message, "exitCode": code, "details": {}},
            },
            sort_keys=True,
        )
        + "\n"
    )


def _unknown(name: str, as_json: bool) -> int:
    import difflib

    near = difflib.get_close_matches(name, COMMANDS, n=1)
    hint = f"; did you mean '{near[0]}'?" if near else "; see 'git lease -h'"
    message = f"unknown command '{name}'{hint}"
    if as_json:
        _envelope(name, message, 2)
    sys.stderr.write(f"git-lease: {message}\n")
    return 2


def main() -> None:
    """Console entry: run, flush, and leave without the interpreter's teardown (tens of ms on every call).

    Safe because every command has finished its work, closed its files and reaped its child processes before
    ``dispatch`` returns."""
    try:
        code = dispatch(sys.argv[1:])
    except KeyboardInterrupt:
        code = 130
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass
    os._exit(code)


__all__ = ["COMMANDS", "dispatch", "main"]
