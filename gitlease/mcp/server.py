"""The MCP server: ``gitlease.mcp.session.Session`` as tools and a resource, over stdio, with the official MCP
Python SDK (``mcp``, 2.x: ``MCPServer``). Imported only by ``git lease mcp``.

Tools (each with a JSON schema from its signature): lease_status, lease_can_start, lease_plan, lease_acquire,
lease_extend, lease_check_paths, lease_progress, lease_push, lease_release. Resource ``gitlease://leases``: the
leases this worktree holds, their scope and time left. An error is a tool error whose text is the CLI's
one-line message; the server itself never stops on one.
"""

# no ``from __future__ import annotations``: the SDK reads the tools' annotations, some of them local to build()
import json
import signal
from collections.abc import Callable
from typing import Annotated, Any

from gitlease import __version__
from gitlease.core.errors import GitLeaseError
from gitlease.mcp.session import Session

RESOURCE = "gitlease://leases"

INSTRUCTIONS = """gitlease leases paths of this git repository to one agent at a time, so that agents working in
parallel never edit the same files. Before editing, read the resource gitlease://leases (what this worktree
holds) or call lease_check_paths with the files you mean to change. Acquire what you need with lease_acquire
(exit-3-style refusals name the holder: pick other work, or wait); when you find you need one more file,
lease_extend your lease with it instead of editing outside it. Report progress with lease_progress; publish with
lease_push (nothing lands if the lease was lost); give the lease back with lease_release when done. Leases this
session acquires are renewed while it lives and released when it ends."""


def build(session: Session):
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, TextContent
    from pydantic import Field

    server = MCPServer("gitlease", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def call(fn: Callable[[], dict[str, Any]]) -> CallToolResult:
        """The result as JSON (text and structured content), or a tool error whose text is the CLI's one-line
        message (built here: the SDK would prefix a raised error with its own words)."""
        try:
            result = fn()
        except GitLeaseError as exc:
            return CallToolResult(content=[TextContent(type="text", text=exc.message)], is_error=True)
        except Exception as exc:  # a bug: the CLI's one line, and the session goes on
            text = f"internal error: {type(exc).__name__}: {exc}"
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        text = json.dumps(result, sort_keys=True)
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=result)

    Paths = Annotated[
        list[str],
        Field(description="Repository-relative path prefixes (files or folders; '.' is the whole repository)."),
    ]
    LeaseId = Annotated[str, Field(description="A lease id (lease_...).")]

    @server.tool()
    def lease_status() -> CallToolResult:
        """Every lease on the lease store: id, paths, owner (task, agent), state, seconds left, and whether this
        worktree holds it or this session renews it."""
        return call(session.status)

    @server.tool()
    def lease_can_start(paths: Paths) -> CallToolResult:
        """Whether these paths are free now (read-only). free=false lists the blocking leases and who holds
        them."""
        return call(lambda: session.can_start(paths))

    @server.tool()
    def lease_plan(
        tasks: Annotated[
            list[dict[str, Any]],
            Field(
                description='Tasks in queue order: {"id": "t1", "scope": ["src/a"]} or {"id": "t2", "paths": '
                '["src/a/x.py"]} (a scope is suggested from paths).'
            ),
        ],
    ) -> CallToolResult:
        """Which tasks can start now (no overlap with active leases or each other, never ahead of an earlier
        overlapping task) and what blocks each of the others."""
        return call(lambda: session.plan(tasks))

    @server.tool()
    def lease_acquire(
        paths: Paths,
        task: Annotated[str | None, Field(description="Task id recorded in the lease.")] = None,
        ttl: Annotated[int | None, Field(description="Time to live in seconds (default: lease.ttl).", ge=5)] = None,
        worktree: Annotated[
            bool, Field(description="Also attach a clean git worktree bound to the lease; work there.")
        ] = False,
    ) -> CallToolResult:
        """Lease paths for this session, all or nothing. Refused, naming the holder, when another lease overlaps.
        The session renews the lease until it ends, then releases it."""
        return call(lambda: session.acquire(paths, task=task, ttl=ttl, worktree=worktree))

    @server.tool()
    def lease_extend(lease: LeaseId, paths: Paths) -> CallToolResult:
        """Add paths to a lease you hold, in one atomic push: all or nothing; refused, naming the holder, when a
        new path overlaps another lease."""
        return call(lambda: session.extend(lease, paths))

    @server.tool()
    def lease_check_paths(paths: Paths) -> CallToolResult:
        """Per path: yours (a current lease of this worktree covers it), free, or held (by whom, for how long);
        and whether this worktree may write it now."""
        return call(lambda: session.check_paths(paths))

    @server.tool()
    def lease_progress(note: Annotated[str, Field(description='A short note, e.g. "tests 40/120".')]) -> CallToolResult:
        """Record a progress note in this session's leases (sent with the next renewal)."""
        return call(lambda: session.progress(note))

    @server.tool()
    def lease_push(
        branch: Annotated[str, Field(description="The branch to push, or SRC:DST (never '+').")],
        lease: Annotated[str | None, Field(description="The lease (default: the only one held).")] = None,
    ) -> CallToolResult:
        """Push the branch and renew the lease in one atomic push to the lease store: if the lease was lost,
        nothing lands."""
        return call(lambda: session.push(branch, lease))

    @server.tool()
    def lease_release(lease: LeaseId) -> CallToolResult:
        """Give a lease back (others can take its paths at once)."""
        return call(lambda: session.release(lease))

    @server.resource(
        RESOURCE,
        name="leases",
        description="The leases this worktree holds: scope, time left, and whether this session renews them.",
        mime_type="application/json",
    )
    def leases() -> str:
        try:
            return json.dumps(session.held_here(), sort_keys=True)
        except GitLeaseError as exc:
            return json.dumps({"error": exc.message})

    return server


def serve(repo: str = ".", *, remote: str | None = None, on_exit: str = "release") -> list[str]:
    """Serve one session over stdio until the client closes it (or SIGTERM). Returns the problems met while
    ending it (releases that failed), for the CLI to print."""
    session = Session(repo, remote=remote, on_exit=on_exit)
    server = build(session)

    def stop(signum, frame):  # SIGTERM from the client: end like a closed stdin (leases released)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        problems = session.close()
    return problems


__all__ = ["build", "serve", "RESOURCE"]
