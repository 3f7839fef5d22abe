"""`atomix mcp-proxy`: an MCP server (stdio) that fronts another MCP server and settles its
tool calls in Atomix transactions.

The proxy starts the upstream server as a subprocess, lists its tools and offers them to the
client unchanged (names, descriptions, input schemas), plus `atomix_status` and, with
`boundary: explicit`, `atomix_commit` and `atomix_abort`. A policy file gives each upstream
tool its effect class and scopes; every call then goes through one `Runtime`:

- read-only: forwarded now;
- reversible: forwarded now; at abort its compensating upstream tool runs;
- bufferable: staged; forwarded at commit, dropped at abort;
- irreversible: held at the gate (the client gets a "queued" result with the effect's key);
  forwarded at commit, exactly once, and never if the transaction aborts.

Limitation: a read in the same transaction does not see that transaction's queued or staged
writes (the upstream server has not received them yet).

Modules: `policy` (the policy file, loaded and validated), `tools` (the upstream tools as
runtime tools, with their compensations), `report` (what the proxy says about settlement),
`proxy` (the server: sessions, commit/abort, time-out, signals, recovery). The user's guide
is docs/mcp-proxy.md.
"""

from __future__ import annotations

from .policy import (
    EFFECTS,
    CompensationPolicy,
    DefaultPolicy,
    PolicyError,
    ProxyPolicy,
    ToolPolicy,
    load_policy,
)
from .proxy import ProxyStartError, TransactionalProxy, run_proxy, serve
from .report import SettledEffect, SettleReport
from .tools import CONTROL_TOOLS, ProxiedTool, UpstreamToolError, build_tools

__all__ = [
    "CONTROL_TOOLS",
    "EFFECTS",
    "CompensationPolicy",
    "DefaultPolicy",
    "PolicyError",
    "ProxiedTool",
    "ProxyPolicy",
    "ProxyStartError",
    "SettleReport",
    "SettledEffect",
    "ToolPolicy",
    "TransactionalProxy",
    "UpstreamToolError",
    "build_tools",
    "load_policy",
    "run_proxy",
    "serve",
]
