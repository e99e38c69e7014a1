"""The MCP server: ``gitlease.mcp.session.Session`` as tools and a resource, over stdio (newline-delimited
JSON-RPC 2.0, the Model Context Protocol's stdio transport). Imported only by ``git lease mcp``.

Written on the standard library, not on an SDK: a client (Claude Code ``-p``, an orchestrator) asks for the
tools right after ``initialize``, and importing the MCP SDK (pydantic and friends) took 1.5 to 3.5 s here, so
the first request went out without gitlease's tools. ``initialize`` is answered before anything else is
imported; the session (the lease service) opens on the first call that needs it.

Tools: lease_status, lease_can_start, lease_plan, lease_acquire, lease_extend, lease_check_paths,
lease_progress, lease_push, lease_release; resource ``gitlease://leases``. Arguments are checked against each
tool's schema first: an unknown argument, a wrong type or a number out of range is a tool error naming it.
A tool error carries what the CLI would say and do: ``structuredContent.error`` holds ``kind``, ``exitCode``
(the CLI's exit code for it), ``message`` and, for a busy scope, ``holders``. The server never stops on one.
"""

import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from gitlease import __version__

RESOURCE = "gitlease://leases"
PROTOCOLS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
MAX_TTL = 366 * 86400  # what a lease record may carry (core/record.py)

INSTRUCTIONS = """gitlease leases paths of this git repository to one agent at a time, so that agents working in
parallel never edit the same files. Before editing, read the resource gitlease://leases (what this worktree
holds) or call lease_check_paths with the files you mean to change. Acquire what you need with lease_acquire
(a refusal names the holder: pick other work, or wait); when you find you need one more file, lease_extend your
lease with it instead of editing outside it. Report progress with lease_progress; publish with lease_push
(nothing lands if the lease was lost); give the lease back with lease_release when done. Leases this session
acquires are renewed while it lives and released when it ends."""

PATHS = {
    "type": "array",
    "items": {"type": "string"},
    "minItems": 1,
    "description": "Repository-relative path prefixes (files or folders; '.' is the whole repository).",
}
LEASE = {"type": "string", "description": "A lease id (lease_...)."}


def _schema(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "lease_status": (
        "Every lease on the lease store: id, paths, owner (task, agent), state, seconds left, and whether this "
        "worktree holds it or this session renews it.",
        _schema({}),
    ),
    "lease_can_start": (
        "Whether these paths are free now (read-only). free=false lists the blocking leases and who holds them.",
        _schema({"paths": PATHS}, ("paths",)),
    ),
    "lease_plan": (
        "Which tasks can start now (no overlap with active leases or each other, never ahead of an earlier "
        "overlapping task) and what blocks each of the others.",
        _schema(
            {
                "tasks": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": 'Tasks in queue order: {"id": "t1", "scope": ["src/a"]} or {"id": "t2", "paths": '
                    '["src/a/x.py"]} (a scope is suggested from paths).',
                }
            },
            ("tasks",),
        ),
    ),
    "lease_acquire": (
        "Lease paths for this session, all or nothing. Refused, naming the holder, when another lease overlaps. "
        "The session renews the lease until it ends, then releases it.",
        _schema(
            {
                "paths": PATHS,
                "task": {"type": ["string", "null"], "description": "Task id recorded in the lease."},
                "ttl": {
                    "type": ["integer", "null"],
                    "minimum": 5,
                    "maximum": MAX_TTL,
                    "description": "Time to live in seconds (default: lease.ttl).",
                },
                "worktree": {
                    "type": "boolean",
                    "description": "Also attach a clean git worktree bound to the lease; work there.",
                },
            },
            ("paths",),
        ),
    ),
    "lease_extend": (
        "Add paths to a lease you hold, in one atomic push: all or nothing; refused, naming the holder, when a new "
        "path overlaps another lease.",
        _schema({"lease": LEASE, "paths": PATHS}, ("lease", "paths")),
    ),
    "lease_check_paths": (
        "Per path: yours (a current lease of this worktree covers it), free, or held (by whom, for how long); and "
        "whether this worktree may write it now.",
        _schema({"paths": PATHS}, ("paths",)),
    ),
    "lease_progress": (
        "Record a progress note in this session's leases (sent with the next renewal).",
        _schema({"note": {"type": "string", "description": 'A short note, e.g. "tests 40/120".'}}, ("note",)),
    ),
    "lease_push": (
        "Push the branch and renew the lease in one atomic push to the lease store: if the lease was lost, nothing "
        "lands.",
        _schema(
            {
                "branch": {"type": "string", "description": "The branch to push, or SRC:DST (never '+')."},
                "lease": {"type": ["string", "null"], "description": "The lease (default: the only one held)."},
            },
            ("branch",),
        ),
    ),
    "lease_release": (
        "Give a lease back (others can take its paths at once).",
        _schema({"lease": LEASE}, ("lease",)),
    ),
}


# ------------------------------------------------------------------------------ arguments


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    return False


def check_arguments(tool: str, args: Any) -> dict[str, Any]:
    """The arguments, checked against the tool's schema; a UsageError (exit 2) naming what is wrong."""
    from gitlease.core.errors import UsageError

    schema = TOOLS[tool][1]
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise UsageError(f"{tool}: arguments must be an object")
    props = schema["properties"]
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise UsageError(f"{tool}: unknown argument {', '.join(unknown)} (it takes: {', '.join(props) or 'none'})")
    missing = [k for k in schema["required"] if k not in args]
    if missing:
        raise UsageError(f"{tool}: missing argument {', '.join(missing)}")
    for key, value in args.items():
        spec = props[key]
        kinds = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
        if not any(_type_ok(value, k) for k in kinds):
            raise UsageError(f"{tool}: {key} must be {' or '.join(kinds)}, not {type(value).__name__}")
        if isinstance(value, list) and spec.get("items", {}).get("type") == "string":
            if not all(isinstance(v, str) for v in value):
                raise UsageError(f"{tool}: {key} must be a list of strings")
        if isinstance(value, list) and len(value) < spec.get("minItems", 0):
            raise UsageError(f"{tool}: {key} must not be empty")
        if isinstance(value, int) and not isinstance(value, bool):
            low, high = spec.get("minimum"), spec.get("maximum")
            if (low is not None and value < low) or (high is not None and value > high):
                raise UsageError(f"{tool}: {key} must be at least {low} and at most {high}, not {value}")
    return args


# ------------------------------------------------------------------------------- results


def error_result(exc: BaseException) -> dict[str, Any]:
    """A tool error a model can act on: the CLI's one line, and its kind, exit code and holders."""
    from gitlease.core.errors import GitLeaseError

    if isinstance(exc, GitLeaseError):
        err: dict[str, Any] = {"kind": exc.kind, "exitCode": exc.exit_code, "message": exc.message}
        details = dict(exc.details)
        if "blockers" in details:
            err["holders"] = details.pop("blockers")
        err.update({k: v for k, v in details.items() if _jsonable(v)})
    else:  # a bug: the CLI's one line, and the session goes on
        err = {"kind": "internal", "exitCode": 1, "message": f"internal error: {type(exc).__name__}: {exc}"}
    return {"content": [{"type": "text", "text": err["message"]}], "structuredContent": {"error": err}, "isError": True}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def ok_result(result: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": json.dumps(result, sort_keys=True)}], "structuredContent": result}


# -------------------------------------------------------------------------------- server


class Server:
    """One MCP session over a pair of binary streams. ``make_session``: opens the Session on first use."""

    def __init__(self, make_session: Callable[[], Any], reader, writer) -> None:
        self.make_session = make_session
        self.session: Any = None
        self.reader, self.writer = reader, writer
        self.write_lock = threading.Lock()

    def get_session(self):
        if self.session is None:
            self.session = self.make_session()
        return self.session

    def send(self, doc: dict[str, Any]) -> None:
        data = (json.dumps(doc, separators=(",", ":")) + "\n").encode("utf-8")
        with self.write_lock:
            self.writer.write(data)
            self.writer.flush()

    def run(self) -> None:
        for line in self.reader:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                self.send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
                continue
            for one in msg if isinstance(msg, list) else [msg]:
                self.handle(one)

    def handle(self, msg: Any) -> None:
        if not isinstance(msg, dict) or "method" not in msg:
            return  # a response to nothing we asked, or garbage
        method, rid = msg["method"], msg.get("id")
        try:
            result = self.dispatch(method, msg.get("params") or {})
        except LookupError as exc:
            if rid is not None:
                self.send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": str(exc)}})
            return
        if rid is not None and result is not None:
            self.send({"jsonrpc": "2.0", "id": rid, "result": result})

    def dispatch(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {
                "protocolVersion": asked if asked in PROTOCOLS else PROTOCOLS[0],
                "capabilities": {"tools": {"listChanged": False}, "resources": {"listChanged": False}},
                "serverInfo": {"name": "gitlease", "version": __version__},
                "instructions": INSTRUCTIONS,
            }
        if method.startswith("notifications/"):
            return None
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [{"name": n, "description": d, "inputSchema": s} for n, (d, s) in TOOLS.items()]}
        if method == "tools/call":
            return self.call_tool(params.get("name"), params.get("arguments"))
        if method == "resources/list":
            return {"resources": [RESOURCE_INFO]}
        if method == "resources/templates/list":
            return {"resourceTemplates": []}
        if method == "prompts/list":
            return {"prompts": []}
        if method == "resources/read":
            return self.read_resource(params.get("uri"))
        raise LookupError(f"method not found: {method}")

    def call_tool(self, name: Any, args: Any) -> dict[str, Any]:
        if name not in TOOLS:
            from gitlease.core.errors import UsageError

            return error_result(UsageError(f"unknown tool {name!r} (tools: {', '.join(TOOLS)})"))
        try:
            checked = check_arguments(name, args)
            return ok_result(call(self.get_session(), name, checked))
        except Exception as exc:  # GitLeaseError and bugs alike: a tool error, the session goes on
            return error_result(exc)

    def read_resource(self, uri: Any) -> dict[str, Any]:
        if uri != RESOURCE:
            raise LookupError(f"unknown resource {uri!r}")
        try:
            text = json.dumps(self.get_session().held_here(), sort_keys=True)
        except Exception as exc:
            text = json.dumps({"error": error_result(exc)["structuredContent"]["error"]})
        return {"contents": [{"uri": RESOURCE, "mimeType": "application/json", "text": text}]}


RESOURCE_INFO = {
    "uri": RESOURCE,
    "name": "leases",
    "description": "The leases this worktree holds: scope, time left, and whether this session renews them.",
    "mimeType": "application/json",
}


def call(session: Any, name: str, a: dict[str, Any]) -> dict[str, Any]:
    """One tool on the session, with checked arguments."""
    if name == "lease_status":
        return session.status()
    if name == "lease_can_start":
        return session.can_start(a["paths"])
    if name == "lease_plan":
        return session.plan(a["tasks"])
    if name == "lease_acquire":
        return session.acquire(a["paths"], task=a.get("task"), ttl=a.get("ttl"), worktree=a.get("worktree", False))
    if name == "lease_extend":
        return session.extend(a["lease"], a["paths"])
    if name == "lease_check_paths":
        return session.check_paths(a["paths"])
    if name == "lease_progress":
        return session.progress(a["note"])
    if name == "lease_push":
        return session.push(a["branch"], a.get("lease"))
    return session.release(a["lease"])


def serve(repo: str = ".", *, remote: str | None = None, on_exit: str = "release") -> list[str]:
    """Serve one session over stdio until the client closes it (or SIGTERM). Returns the problems met while
    ending it (releases that failed), for the CLI to print."""
    import signal

    from gitlease.core.errors import UsageError

    if on_exit not in ("release", "keep"):  # mcp.session.ON_EXIT, without importing the session yet
        raise UsageError(f"on exit: one of release, keep, not {on_exit!r}")

    def make():
        from gitlease.mcp.session import Session

        return Session(repo, remote=remote, on_exit=on_exit)

    server = Server(make, sys.stdin.buffer, sys.stdout.buffer)

    def stop(signum, frame):  # SIGTERM from the client: end like a closed stdin (leases released)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    return server.session.close() if server.session is not None else []


__all__ = ["serve", "Server", "TOOLS", "RESOURCE", "check_arguments", "error_result"]
