"""``git lease mcp``: gitlease over the Model Context Protocol, for any MCP client (docs/agents.md).

``session`` holds what a session does (no MCP SDK needed); ``server`` serves it over stdio with the official
Python SDK (``pip install 'gitlease[mcp]'``), imported only by that command.
"""
