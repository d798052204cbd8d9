"""cairn's demo workflows: `invoice` (the seed article's flow), `agent` and `agent_async`
(an agent loop in one step), `chat` (one streamed answer) and `graph_agent` (a LangGraph
support agent; needs the `langgraph` extra).

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
}
MODULES = tuple(dict.fromkeys(WORKFLOWS.values()))
# The demos that need an optional extra: the package they import, and the extra.
EXTRAS = {"graph_agent": ("langgraph", "langgraph")}


def missing_extra(workflow: str) -> str | None:
    """Why the demo workflow cannot be loaded here (its extra is not installed), in one
    line; None when it can (or it is no demo that needs one)."""
    if workflow not in EXTRAS:
        return None
    package, extra = EXTRAS[workflow]
    try:
        importlib.import_module(package)
    except ImportError:
        return f"the demo {workflow!r} needs {package}: pip install 'cairn[{extra}]'"
    return None
