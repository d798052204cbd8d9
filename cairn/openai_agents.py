"""OpenAI Agents SDK agents as cairn runs: agent_workflow, CairnModelProvider, tool approval as a wait (cairn.contrib.openai_agents; needs the `openai-agents` extra)."""

from cairn.contrib.openai_agents import *
from cairn.contrib.openai_agents import __all__  # noqa: F401  (the names `*` gives)
