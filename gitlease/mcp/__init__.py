"""``git lease mcp``: gitlease over the Model Context Protocol, for any MCP client (docs/agents.md).

``session`` holds what a session does; ``server`` serves it over stdio (JSON-RPC on the standard library, no
MCP SDK: ``initialize`` is answered before the session opens), imported only by that command.
"""
