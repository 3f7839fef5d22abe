"""Bridges from agent frameworks to the Atomix runtime, one module per framework.

Each module imports its framework only where it must, so importing this package never
requires an optional dependency. `openai`: run a chat completion's tool calls through the
runtime, one transaction per turn, per task or as the caller opens it (it needs no openai
package: plain dicts of the same shape work). `langgraph`: a transactional drop-in
replacement for LangGraph's ToolNode. `mcp` (a package): an MCP server that fronts another
one and settles its tool calls transactionally (the `atomix mcp-proxy` command).
"""
