"""Agents: tasks and their steps, the scripted agent, the llm-like policies, the agent loops
and the LLM agent with its completion cache.

See docs/design.md for how the wings stack."""
