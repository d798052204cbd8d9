"""LangGraph graphs on cairn: CairnSaver, graph workflows, node scopes and keys (cairn.contrib.langgraph; needs the `langgraph` extra)."""

from cairn.contrib.langgraph import *
from cairn.contrib.langgraph import __all__  # noqa: F401  (the names `*` gives)
