"""cairn's integrations with other projects, each an optional extra on their public APIs:
LangGraph (cairn.langgraph), pydantic-ai (cairn.pydantic_ai)."""
