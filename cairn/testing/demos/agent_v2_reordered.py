"""Version 2 of the demo `agent` workflow with its added `stamp` call made first, before
the calls version 1 recorded: `cairn deploy check` flags the runs inside `work`, and a
rolling deploy of it stops each such run as `incompatible`, naming both calls."""

from __future__ import annotations

from cairn.testing.demos.agent_parts import register

flow = register(reordered=True)
