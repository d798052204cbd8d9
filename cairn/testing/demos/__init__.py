"""cairn's demo workflows: `invoice` (the seed article's flow), `agent` and `agent_async`
(an agent loop in one step), `chat` (one streamed answer), `graph_agent` (a LangGraph
support agent; needs the `langgraph` extra) and `oa_agent` (an OpenAI Agents SDK support
agent; needs the `openai-agents` extra).

They are no part of cairn's run path: a worker, a server or an enqueuer registers them
only when its CAIRN_WORKFLOWS names their module, as `cairn demo`, `cairn chaos` and the
tests do. So a user's own workflow may take any of these names.
"""

from __future__ import annotations

import importlib

# Each demo workflow's name and the module that registers it.
WORKFLOWS = {
    "invoice": "cairn.testing.demos.invoice",
    "agent": "cairn.testing.demos.agent",
    "agent_async": "cairn.testing.demos.agent",
    "chat": "cairn.testing.demos.chat",
    "graph_agent": "cairn.testing.demos.graph_agent",
    "oa_agent": "cairn.testing.demos.oa_agent",
}
MODULES = tuple(dict.fromkeys(WORKFLOWS.values()))
# The demos that need an optional extra: the package they import, and the extra.
EXTRAS = {"graph_agent": ("langgraph", "langgraph"), "oa_agent": ("agents", "openai-agents")}


def missing_extra(workflow: str) -> str | None:
    """Why the demo workflow cannot be loaded here (its extra is not installed), in one
    line; None when it can (or it is no demo that needs one)."""
    if workflow not in EXTRAS:
        return None
    package, extra = EXTRAS[workflow]
    try:
        importlib.import_module(package)
    except ImportError:
        # The extra, not the import name: "agents" would not say which package to get.
        return f"the demo {workflow!r} needs {extra}: pip install 'cairn[{extra}]'"
    return None
