"""Clients for the tool services. Every failure comes back as a `ToolResult`, never an exception."""
