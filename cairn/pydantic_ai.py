"""pydantic-ai agents as cairn runs: CairnDurability, agent workflows, streamed tokens (cairn.contrib.pydantic_ai; needs the `pydantic-ai` extra)."""

from cairn.contrib.pydantic_ai import *
from cairn.contrib.pydantic_ai import __all__  # noqa: F401  (the names `*` gives)
